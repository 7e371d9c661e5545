package client

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// Split reads (issue 16; SMB multichannel and NFS nconnect stripe the same
// way). A lone large read is one request on one connection, served by one
// server goroutine: the server's pread and its RDMA WRITE of the bytes run
// on one CPU while the others idle. When the read is at least
// Config.SplitRead bytes and at least two connections have nothing in
// flight, ReadBuf cuts it into page-aligned pieces, one per idle
// connection (each at least SplitRead/2 bytes), posts them all, then
// waits for each: the server reads the pieces on several CPUs at once.
// Each piece lands in a pooled registered buffer of its own connection
// (registered memory is per connection: each has its own protection
// domain), and the caller replies from the pieces as they are (SplitBuf's
// Slices: one writev for the FUSE reply, no copy). Connections with
// requests in flight are not used, so a queue deep enough to keep them all
// busy reads exactly as without splitting.
//
// The pieces answer as one request would: the read ends at the first
// piece that comes back short (end of file), and fails with the first
// error of a piece before that; bytes of later pieces are dropped, and so
// is the error of a later piece that could not be posted (a read no piece
// ended fails with it). A first piece that cannot be posted leaves the
// read unsplit: it goes as one READ. A cancelled context abandons every
// piece still out, as it abandons one request; LWIO CANCEL is per Fid on
// the server, so it reaches the pieces queued on every connection.

// maxPieces caps the pieces of one split read; splitAlign is what their
// sizes are a multiple of (pages of the server's pread).
const (
	maxPieces  = 8
	splitAlign = 4096
)

// DefaultSplitRead is Config.SplitRead's default: a 1 MiB read (the
// largest the kernel sends) goes as two 512 KiB pieces on two idle
// connections. Measured on 2 CPUs with the export on tmpfs (docs/bench.md,
// "Split reads"): 1 MiB O_DIRECT reads at queue depth 1 gained, 512 KiB
// reads split in two 256 KiB pieces lost, so they are not split.
//
// Not where the server reads in place: once every connection shares its
// memory with a server on this host ("+shm" carriers, softrdma), the
// server preads the file straight into the read's buffer (one copy), and
// the second request, server wake-up and client reaper wake-up a split
// costs outweigh the halved pread: 1 MiB O_DIRECT reads at queue depth 1
// were slower split than whole in every round measured (docs/bench.md,
// "Split reads on the shared-memory path"). An explicit SplitRead still
// splits there. A sealed session's connections keep their carrier's name
// but read nothing in place (the server reads into its buffer and
// encrypts, the client decrypts): they split by default, as before.
const DefaultSplitRead = 1 << 20

// splitDefault is the split size of a client whose Config.SplitRead is
// at, over conns: at itself when set, else DefaultSplitRead, or never
// (0) when every connection shares the client's memory with the server
// and the session is not sealed.
func splitDefault(at int, sealed bool, conns []*conn) int {
	if at != 0 {
		return at
	}
	if sealed {
		return DefaultSplitRead
	}
	for _, c := range conns {
		if !transport.SharedMemory(c.tc) {
			return DefaultSplitRead
		}
	}
	return 0
}

// piece is one READ of a split read.
type piece struct {
	c     *conn
	sl    *slot
	dst   transport.Segment
	off   int64
	got   int
	err   error
	start time.Time
}

// splitPieces returns how many pieces a read of n bytes goes in now: the
// idle live connections, starting at the caller's CPU's, in cs; 0 when
// the read is not split.
func (cl *Client) splitPieces(n int, cs *[maxPieces]*conn) int {
	at := cl.splitAt
	if at <= 0 || n < at || len(cl.conns) < 2 {
		return 0
	}
	most := min(n/max(at/2, splitAlign), maxPieces)
	if most < 2 {
		return 0
	}
	home := currentCPU() % len(cl.conns)
	k := 0
	for i := 0; i < len(cl.conns) && k < most; i++ {
		c := cl.conns[(home+i)%len(cl.conns)]
		if c.alive() && c.credits.Pending() == 0 {
			cs[k] = c
			k++
		}
	}
	if k < 2 {
		return 0
	}
	return k
}

// splitRead is ReadBuf's read of dest at off as k pieces on the
// connections cs (splitPieces). When the first piece cannot be posted
// nothing went out and ok is false: the read is not split, and goes as
// one READ (ReadBuf's, which picks a live connection or fails as it
// would have).
func (f *File) splitRead(ctx context.Context, dest []byte, off int64, cs *[maxPieces]*conn, k int) (b Buffer, ok bool, err error) {
	n := len(dest)
	// Each piece a whole number of pages, the last what is left: the k
	// pieces of a size not a multiple of k cover it to its last byte.
	size := ((n+k-1)/k + splitAlign - 1) &^ (splitAlign - 1)
	var ps [maxPieces]piece
	posted := 0
	for i := 0; i < k && i*size < n; i++ {
		p := &ps[i]
		p.c, p.off = cs[i], off+int64(i*size)
		if err = f.postPiece(ctx, p, min(size, n-i*size)); err != nil {
			break
		}
		posted++
	}
	if posted == 0 {
		return nil, false, nil
	}
	for i := 0; i < posted; i++ {
		p := &ps[i]
		p.got, p.err = p.c.readDone(ctx, p.sl, p.dst.Length, p.start)
	}
	if posted > 1 { // lwio stat's "split reads": reads that went as pieces
		f.cl.ctr.splitReads.Add(1)
	}
	// The answer of one request: up to the first piece that ends the
	// read (short, or at end of file: what the pieces after it did, or
	// the error that kept one from being posted, does not count), or the
	// first error before it.
	use, total := 0, 0
	for ; use < posted; use++ {
		p := &ps[use]
		if p.err == io.EOF {
			err = nil
			break
		}
		if p.err != nil {
			err = p.err
			break
		}
		total += p.got
		if p.got < p.dst.Length {
			use++
			err = nil // beyond end of file: whatever the rest did
			break
		}
	}
	if err != nil || total == 0 {
		for i := 0; i < posted; i++ {
			if ps[i].err == nil {
				ps[i].sl.unref()
			}
		}
		if err == nil {
			err = io.EOF
		}
		return nil, true, err
	}
	for i := use; i < posted; i++ {
		if ps[i].err == nil {
			ps[i].sl.unref()
		}
	}
	b, err = f.joinPieces(ps[:use], dest, total)
	return b, true, err
}

// postPiece takes a slot and a pooled buffer of n bytes on p.c and posts
// p's READ.
func (f *File) postPiece(ctx context.Context, p *piece, n int) error {
	if f.closed.Load() {
		return ErrClosed
	}
	sl, err := p.c.beginN(ctx, 1)
	if err != nil {
		return err
	}
	sl.mode = Mode(f.mode.Load())
	if p.dst, err = p.c.readBuffer(sl, n); err != nil {
		return err
	}
	p.sl, p.start = sl, time.Now()
	return p.c.postRead(sl, f.fid, p.off, p.dst)
}

// joinPieces hands over the pieces' buffers as one SplitBuf of total
// bytes. Under the race detector a polling piece (memory the peer wrote,
// see poll_race.go) is copied to dest instead, and so are all.
func (f *File) joinPieces(ps []piece, dest []byte, total int) (Buffer, error) {
	for i := range ps {
		if raceEnabled && ps[i].sl.polling {
			w := 0
			for j := range ps {
				w += copyRemote(dest[w:], ps[j].dst.Bytes()[:ps[j].got])
				ps[j].sl.unref()
			}
			return newBuf(dest[:w], nil, nil), nil
		}
	}
	s := splitBufs.Get().(*SplitBuf)
	s.dest, s.total, s.held = dest, total, true
	for i := range ps {
		p := &ps[i]
		p.sl.buf = nil // the SplitBuf's now
		s.parts[i] = newBuf(p.dst.Region.Bytes()[:p.got], p.dst.Region, p.c.pool)
		s.slices[i] = s.parts[i].Bytes()
		p.sl.unref()
	}
	s.n = len(ps)
	return s, nil
}

// SplitBuf is the result of a split read: the pieces, each in its own
// connection's registered buffer. Reply from Slices (a gather write), or
// from Bytes, which copies the pieces into the read's destination once.
type SplitBuf struct {
	parts  [maxPieces]*Buf
	slices [maxPieces][]byte
	n      int
	dest   []byte
	total  int
	joined bool
	held   bool
}

var _ Buffer = (*SplitBuf)(nil)

// Slices are the pieces, in file order.
func (s *SplitBuf) Slices() [][]byte { return s.slices[:s.n] }

// Bytes copies the pieces into the read's destination (the first call)
// and returns it.
func (s *SplitBuf) Bytes() []byte {
	if !s.joined {
		w := 0
		for _, b := range s.slices[:s.n] {
			w += copy(s.dest[w:], b)
		}
		s.joined = true
	}
	return s.dest[:s.total]
}

// Len is the bytes read.
func (s *SplitBuf) Len() int { return s.total }

// Release gives the pieces back to their pools; a second call does
// nothing (as Buf's).
func (s *SplitBuf) Release() {
	if s == nil || !s.held {
		return
	}
	for _, b := range s.parts[:s.n] {
		b.Release()
	}
	*s = SplitBuf{}
	splitBufs.Put(s)
}

var splitBufs = sync.Pool{New: func() any { return new(SplitBuf) }}
