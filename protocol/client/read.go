package client

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/transport"
)

// ReadAt reads len(p) bytes at off, in requests of at most MaxRead bytes.
// A short read at end of file returns the bytes read and io.EOF.
func (f *File) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return readPieces(len(p), func(done int) (int, int, error) {
		n := min(len(p)-done, f.cl.MaxRead())
		got, err := f.readChunk(ctx, p[done:done+n], off+int64(done))
		return n, got, err
	})
}

// readPieces runs a read as a sequence of requests: next issues the one
// starting done bytes in and says how many bytes it asked for and got. It
// stops at an error, at a short request (end of file: io.EOF) or when size
// bytes are in.
func readPieces(size int, next func(done int) (want, got int, err error)) (int, error) {
	total := 0
	for total < size {
		want, got, err := next(total)
		total += got
		if err != nil {
			return total, err
		}
		if got < want {
			return total, io.EOF
		}
	}
	return total, nil
}

// readChunk is one READ (FIG. 14A–D). Small reads land in the slot's
// pre-registered bounce buffer, larger ones in a pooled registered buffer;
// both are then copied to p.
func (f *File) readChunk(ctx context.Context, p []byte, off int64) (int, error) {
	c, sl, err := f.begin(ctx)
	if err != nil {
		return 0, err
	}
	n := len(p)
	dst := transport.Segment{Region: sl.remote, Offset: bounceOff, Length: n}
	if n > c.cl.cfg.BounceThreshold {
		if dst, err = c.readBuffer(sl, n); err != nil {
			return 0, err
		}
	}
	got, err := c.read(ctx, sl, f.fid, off, dst)
	if err != nil {
		return 0, err
	}
	defer sl.unref()
	c.copyIn(sl, p[:got], dst.Bytes()[:got])
	return got, nil
}

// readBuffer takes a pooled registered buffer of n bytes for sl's data (it
// goes back to the pool with the slot). On error the slot and credit are
// given back.
func (c *conn) readBuffer(sl *slot, n int) (transport.Segment, error) {
	buf, err := c.slotBuffer(sl, n)
	if err != nil {
		return transport.Segment{}, err
	}
	return transport.Segment{Region: buf, Length: n}, nil
}

// slotBuffer takes a pooled registered buffer of n bytes as sl's buffer
// (it goes back to the pool with the slot). On error the slot and credit
// are given back; a connection that died meanwhile (the reaper dropped
// its pool) fails as a lost connection, which the caller's reconnect
// replays, not as the pool's transport.ErrClosed (EIO at the mount).
func (c *conn) slotBuffer(sl *slot, n int) (transport.Region, error) {
	buf, err := c.pool.Get(n)
	if err != nil {
		c.abort(sl)
		if !c.alive() {
			return nil, c.connErr()
		}
		return nil, err
	}
	sl.buf = buf
	return buf, nil
}

// read posts a READ of len(dst) bytes at off into dst and waits for it. On
// a nil error the caller holds sl (and so dst's memory) until sl.unref.
func (c *conn) read(ctx context.Context, sl *slot, fid uint16, off int64, dst transport.Segment) (int, error) {
	start := time.Now()
	if err := c.postRead(sl, fid, off, dst); err != nil {
		return 0, err
	}
	return c.readDone(ctx, sl, dst.Length, start)
}

// postRead posts a READ of len(dst) bytes at off into dst (read's first
// half; a split read posts its pieces so before it waits for any).
func (c *conn) postRead(sl *slot, fid uint16, off int64, dst transport.Segment) error {
	n := dst.Length
	h := protocol.NewReadRequest(fid, uint64(off), uint32(n), dst.Region.Addr()+uint64(dst.Offset), dst.Region.Handle(), c.hint(), c.prepare(sl, kindIO, n))
	sl.reqLen = uint32(n)
	return c.post(sl, &h, protocol.HeaderSize, nil)
}

// readDone waits for the READ of n bytes postRead posted at start and
// counts it (roundTrip's second half). On a nil error the caller holds sl
// until sl.unref.
func (c *conn) readDone(ctx context.Context, sl *slot, n int, start time.Time) (int, error) {
	polling := sl.polling
	r, err := c.wait(ctx, sl)
	c.count(protocol.OpRead, polling, 0, r, err, start)
	if err != nil {
		return 0, err
	}
	got, err := readCount(r, n)
	if err != nil {
		sl.unref()
	}
	return got, err
}

// readCount checks a READ or VEC_READ completion of n bytes: END_OF_FILE is
// io.EOF, another failure its Status, and more bytes than asked for is an
// invalid response.
func readCount(r result, n int) (int, error) {
	switch r.st {
	case protocol.StatusSuccess:
	case protocol.StatusEndOfFile:
		return 0, io.EOF
	default:
		return 0, r.st
	}
	if int(r.info) > n {
		return 0, fmt.Errorf("lwio read: server reports %d bytes for a %d-byte read: %w", r.info, n, protocol.StatusInvalidNetworkResp)
	}
	return int(r.info), nil
}

// copyIn copies read data out of registered memory; a polling request's
// memory was written by the peer with no completion event between.
func (c *conn) copyIn(sl *slot, dst, src []byte) {
	if sl.polling {
		copyRemote(dst, src)
	} else {
		copy(dst, src)
	}
}

// abort gives back a slot and credits taken for a request never posted.
func (c *conn) abort(sl *slot) {
	c.credits.ReleaseN(sl.ncred)
	c.freeSlot(sl)
}

// ReadBuf reads len(dest) bytes at off and returns them without a copy
// where it can: a read of at most MaxRead bytes lands in a pooled
// registered buffer, handed over as it is (the FUSE reply is written from
// it); a longer one is split into READs landing in dest, and one of at
// most BounceThreshold bytes lands in the slot's bounce buffer and is
// copied to dest (cheaper than a pooled buffer for so few bytes); one of
// at least Config.SplitRead bytes, while other connections idle, goes as
// pieces on them at once and comes back as a *SplitBuf (split.go). Reply
// from Bytes, then Release. Bytes is shorter than dest at end of file; at
// or past end of file ReadBuf returns nil and io.EOF.
func (f *File) ReadBuf(ctx context.Context, dest []byte, off int64) (Buffer, error) {
	n := len(dest)
	if n == 0 || n > f.cl.MaxRead() || n <= f.cl.cfg.BounceThreshold {
		got, err := f.ReadAt(ctx, dest, off)
		if got == 0 && (err == nil || err == io.EOF) {
			return nil, io.EOF
		}
		if err == io.EOF {
			err = nil
		}
		return newBuf(dest[:got], nil, nil), err
	}
	var cs [maxPieces]*conn
	// Not a read ending past the largest offset: a piece there would go
	// out at a wrapped offset, and answer otherwise than one READ.
	if k := f.cl.splitPieces(n, &cs); k > 0 && off <= math.MaxInt64-int64(n) {
		if b, ok, err := f.splitRead(ctx, dest, off, &cs, k); ok {
			return b, err
		}
	}
	c, sl, err := f.begin(ctx)
	if err != nil {
		return nil, err
	}
	dst, err := c.readBuffer(sl, n)
	if err != nil {
		return nil, err
	}
	got, err := c.read(ctx, sl, f.fid, off, dst)
	if err != nil {
		return nil, err
	}
	defer sl.unref()
	if sl.polling && raceEnabled {
		// See poll_race.go: hand out a copy, not the peer-written buffer.
		nb, err := c.pool.Get(n)
		if err != nil {
			return nil, err
		}
		copyRemote(nb.Bytes()[:got], dst.Bytes()[:got])
		return newBuf(nb.Bytes()[:got], nb, c.pool), nil
	}
	sl.buf = nil // the caller's now
	return newBuf(dst.Region.Bytes()[:got], dst.Region, c.pool), nil
}

// ReadV reads into pages, which are consecutive PageSize pieces of the
// file at off (every one but the last len(pages[0]) bytes long), with
// VEC_READ (FIG. 16A–D): one RDMA WRITE per page. It returns the bytes
// read; a short read at end of file returns io.EOF.
func (f *File) ReadV(ctx context.Context, pages [][]byte, off int64) (int, error) {
	ps, size, err := checkPages("readv", pages)
	if err != nil || size == 0 {
		return 0, err
	}
	if ps > f.cl.MaxRead() {
		// A page exceeds the read window: plain reads, split to fit.
		return eachPage(ctx, pages, off, f.ReadAt)
	}
	per := min(f.cl.conns[0].maxRegions, f.cl.MaxRead()/ps)
	return readPieces(size, func(done int) (int, int, error) {
		i := done / ps // every page before the last is whole
		group := pages[i:min(i+per, len(pages))]
		got, err := f.vecRead(ctx, group, ps, off+int64(done))
		return pagesLen(group), got, err
	})
}

// checkPages checks the pages of a ReadV or WriteV: a page size of 1 to
// 65535 bytes (PageSize is a u16), every page that long but the last, which
// may be shorter. It returns the page size and the bytes in all pages (0
// for no pages).
func checkPages(op string, pages [][]byte) (ps, total int, err error) {
	if len(pages) == 0 {
		return 0, 0, nil
	}
	ps = len(pages[0])
	if ps == 0 || ps > 0xFFFF {
		return 0, 0, fmt.Errorf("lwio %s: page size %d", op, ps)
	}
	for i, pg := range pages {
		if len(pg) != ps && (i != len(pages)-1 || len(pg) > ps) {
			return 0, 0, fmt.Errorf("lwio %s: page %d is %d bytes, want %d", op, i, len(pg), ps)
		}
		total += len(pg)
	}
	return ps, total, nil
}

func pagesLen(pages [][]byte) int {
	n := 0
	for _, pg := range pages {
		n += len(pg)
	}
	return n
}

// vecRead is one VEC_READ of pages (FIG. 16A–D) into one pooled buffer,
// a region per page, then copied out page by page.
func (f *File) vecRead(ctx context.Context, pages [][]byte, ps int, off int64) (int, error) {
	c, sl, err := f.begin(ctx)
	if err != nil {
		return 0, err
	}
	n := pagesLen(pages)
	if n > c.maxRead {
		c.abort(sl)
		return 0, fmt.Errorf("lwio readv: %d bytes exceed the read window %d", n, c.maxRead)
	}
	dst, err := c.readBuffer(sl, len(pages)*ps)
	if err != nil {
		return 0, err
	}
	buf := dst.Region
	regions := sl.regions[:0]
	for i, pg := range pages {
		l := ps
		if i == len(pages)-1 {
			// The final region: a multiple of the sector size (FIG. 16A).
			l = min(ps, (len(pg)+protocol.SectorSize-1)/protocol.SectorSize*protocol.SectorSize)
		}
		regions = append(regions, protocol.RDMARegion{DataVa: buf.Addr() + uint64(i*ps), DataMh: buf.Handle(), Length: uint32(l)})
	}
	sl.regions = regions
	req := protocol.NewVecReadRequest(f.fid, uint64(off), uint32(n), uint16(ps), regions, c.hint(), c.prepare(sl, kindIO, n))
	req.Put(sl.send.Bytes())
	sl.reqLen = uint32(n)
	r, err := c.roundTrip(ctx, sl, &req.Header, req.Size(), nil)
	if err != nil {
		return 0, err
	}
	defer sl.unref()
	got, err := readCount(r, n)
	if err != nil {
		return 0, err
	}
	src := buf.Bytes()
	for i, left := 0, got; left > 0; i++ {
		l := min(len(pages[i]), left)
		c.copyIn(sl, pages[i][:l], src[i*ps:i*ps+l])
		left -= l
	}
	return got, nil
}

// eachPage moves pages one after another at consecutive offsets from off
// with io (ReadAt or WriteAt), stopping at the first error.
func eachPage(ctx context.Context, pages [][]byte, off int64, io func(context.Context, []byte, int64) (int, error)) (int, error) {
	total := 0
	for _, pg := range pages {
		n, err := io(ctx, pg, off+int64(total))
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
