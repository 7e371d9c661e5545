package client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/transport"
)

// File is a file registered with the server (FIG. 7A/B). Its Fid belongs
// to the session, so every connection of the client can use it. Methods are
// safe for concurrent use.
type File struct {
	cl     *Client
	fid    uint16
	flags  uint32
	mode   atomic.Uint32 // Mode
	closed atomic.Bool
}

// Fid is the server's file id.
func (f *File) Fid() uint16 { return f.fid }

// Register registers the file a resume key names (the key from the session
// channel's resume-key request) and returns it. flagsAndAttributes are the
// Win32 create flags the file was opened with; FILE_NO_INTERMEDIATE_BUFFERING
// (protocol.FileNoIntermediateBuffering) allows collapsed vectored writes.
func (cl *Client) Register(ctx context.Context, key protocol.ResumeKey, flagsAndAttributes uint32) (*File, error) {
	c, sl, err := cl.begin(ctx)
	if err != nil {
		return nil, err
	}
	req := protocol.NewRegisterRequest(protocol.FidParams{
		ResumeKey: key, SessionID: cl.cfg.SessionID, FlagsAndAttributes: flagsAndAttributes,
	}, c.hint(), c.prepare(sl, kindControl).Cookie)
	req.Params.Put(sl.send.Bytes()[protocol.HeaderSize:])
	r, err := c.roundTrip(ctx, sl, &req.Header, protocol.RegisterRequestSize, nil)
	if err != nil {
		return nil, err
	}
	sl.unref()
	if r.st != protocol.StatusSuccess {
		return nil, fmt.Errorf("lwio register: %w", r.st)
	}
	if r.info == 0 || r.info > 0xFFFF {
		return nil, fmt.Errorf("lwio register: server returned Fid %d", r.info)
	}
	f := &File{cl: cl, fid: uint16(r.info), flags: flagsAndAttributes}
	f.mode.Store(uint32(cl.cfg.Completion))
	return f, nil
}

// begin picks a connection, charges a credit and takes a slot.
func (cl *Client) begin(ctx context.Context) (*conn, *slot, error) {
	c, err := cl.pick()
	if err != nil {
		return nil, nil, err
	}
	if err := c.credits.Charge(ctx); err != nil {
		if c.alive() {
			return nil, nil, err
		}
		return nil, nil, c.connErr()
	}
	sl, err := c.getSlot(ctx)
	if err != nil {
		c.credits.Release()
		return nil, nil, err
	}
	return c, sl, nil
}

func (f *File) begin(ctx context.Context) (*conn, *slot, error) {
	if f.closed.Load() {
		return nil, nil, ErrClosed
	}
	c, sl, err := f.cl.begin(ctx)
	if err == nil {
		sl.mode = Mode(f.mode.Load())
	}
	return c, sl, err
}

// SetCompletion sets the completion mode of this file's I/O requests
// (FIG. 8: the mode is chosen per request); a file starts with the client's
// Config.Completion.
func (f *File) SetCompletion(m Mode) { f.mode.Store(uint32(m)) }

// ReadAt reads len(p) bytes at off, in requests of at most MaxRead bytes.
// A short read at end of file returns the bytes read and io.EOF.
func (f *File) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	total := 0
	for total < len(p) {
		n := min(len(p)-total, f.cl.MaxRead())
		got, err := f.readChunk(ctx, p[total:total+n], off+int64(total))
		total += got
		if err != nil {
			return total, err
		}
		if got < n {
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
	var dst transport.Segment
	if n <= c.cl.cfg.BounceThreshold {
		dst = transport.Segment{Region: sl.remote, Offset: bounceOff, Length: n}
	} else {
		buf, err := c.pool.Get(n)
		if err != nil {
			c.abort(sl)
			return 0, err
		}
		sl.buf = buf
		dst = transport.Segment{Region: buf, Length: n}
	}
	h := protocol.NewReadRequest(f.fid, uint64(off), uint32(n), dst.Region.Addr()+uint64(dst.Offset), dst.Region.Handle(), c.hint(), c.prepare(sl, kindIO))
	sl.reqLen = uint32(n)
	r, err := c.roundTrip(ctx, sl, &h, protocol.HeaderSize, nil)
	if err != nil {
		return 0, err
	}
	defer sl.unref()
	return c.readResult(sl, r, p, dst.Bytes())
}

func (c *conn) readResult(sl *slot, r result, p, src []byte) (int, error) {
	switch r.st {
	case protocol.StatusSuccess:
	case protocol.StatusEndOfFile:
		return 0, io.EOF
	default:
		return 0, r.st
	}
	got := int(r.info)
	if got > len(p) {
		return 0, fmt.Errorf("lwio read: server reports %d bytes for a %d-byte read: %w", got, len(p), protocol.StatusInvalidNetworkResp)
	}
	if sl.polling {
		copyRemote(p[:got], src[:got])
	} else {
		copy(p[:got], src[:got])
	}
	return got, nil
}

// abort gives back a slot and credit taken for a request never posted.
func (c *conn) abort(sl *slot) {
	c.credits.Release()
	c.freeSlot(sl)
}

// ReadBuf reads up to n bytes at off (n ≤ MaxRead) straight into a pooled
// registered buffer and returns it without a copy: reply from Bytes, then
// Release it. Bytes is shorter than n at end of file; at or past end of
// file ReadBuf returns nil and io.EOF.
func (f *File) ReadBuf(ctx context.Context, off int64, n int) (*Buf, error) {
	if n <= 0 || n > f.cl.MaxRead() {
		return nil, fmt.Errorf("lwio read: ReadBuf of %d bytes (max %d)", n, f.cl.MaxRead())
	}
	c, sl, err := f.begin(ctx)
	if err != nil {
		return nil, err
	}
	buf, err := c.pool.Get(n)
	if err != nil {
		c.abort(sl)
		return nil, err
	}
	sl.buf = buf
	h := protocol.NewReadRequest(f.fid, uint64(off), uint32(n), buf.Addr(), buf.Handle(), c.hint(), c.prepare(sl, kindIO))
	sl.reqLen = uint32(n)
	r, err := c.roundTrip(ctx, sl, &h, protocol.HeaderSize, nil)
	if err != nil {
		return nil, err
	}
	defer sl.unref()
	switch r.st {
	case protocol.StatusSuccess:
	case protocol.StatusEndOfFile:
		return nil, io.EOF
	default:
		return nil, r.st
	}
	got := int(r.info)
	if got > n {
		return nil, fmt.Errorf("lwio read: server reports %d bytes for a %d-byte read: %w", got, n, protocol.StatusInvalidNetworkResp)
	}
	if sl.polling && raceEnabled {
		// See poll_race.go: hand out a copy, not the peer-written buffer.
		nb, err := c.pool.Get(n)
		if err != nil {
			return nil, err
		}
		copyRemote(nb.Bytes()[:got], buf.Bytes()[:got])
		return &Buf{r: nb, n: got, pool: c.pool}, nil
	}
	sl.buf = nil // the caller's now
	return &Buf{r: buf, n: got, pool: c.pool}, nil
}

// WriteAt writes p at off, in requests of at most MaxWrite bytes.
func (f *File) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	total := 0
	for total < len(p) || len(p) == 0 {
		n := min(len(p)-total, f.cl.MaxWrite())
		got, err := f.writeChunk(ctx, p[total:total+n], off+int64(total))
		total += got
		if err != nil {
			return total, err
		}
		if got < n {
			return total, io.ErrShortWrite
		}
		if len(p) == 0 {
			break
		}
	}
	return total, nil
}

// writeChunk is one WRITE (FIG. 15A–D).
func (f *File) writeChunk(ctx context.Context, p []byte, off int64) (int, error) {
	c, sl, err := f.begin(ctx)
	if err != nil {
		return 0, err
	}
	dst, seg, err := c.writeArea(sl, len(p))
	if err != nil {
		return 0, err
	}
	copy(dst, p)
	req := protocol.NewWriteRequest(f.fid, uint64(off), dst, c.hint(), c.prepare(sl, kindIO))
	return c.sendWrite(ctx, sl, &req, seg)
}

// writeArea returns where n bytes of write data go (FIG. 15A: the data
// follows the header in the SEND): behind the header in the slot's send
// area when they fit, else a pooled registered buffer sent as the SEND's
// second segment, seg. On error the slot and credit are given back.
func (c *conn) writeArea(sl *slot, n int) (dst []byte, seg *transport.Segment, err error) {
	if n <= inlineWrite {
		return sl.send.Bytes()[protocol.HeaderSize : protocol.HeaderSize+n], nil, nil
	}
	buf, err := c.pool.Get(n)
	if err != nil {
		c.abort(sl)
		return nil, nil, err
	}
	sl.buf = buf
	return buf.Bytes()[:n], &transport.Segment{Region: buf, Length: n}, nil
}

// sendWrite posts a WRITE or VEC_WRITE whose data writeArea placed and
// returns the bytes the server wrote.
func (c *conn) sendWrite(ctx context.Context, sl *slot, req *protocol.WriteRequest, seg *transport.Segment) (int, error) {
	hdrLen := protocol.HeaderSize
	if seg == nil {
		hdrLen += len(req.Data)
	}
	r, err := c.roundTrip(ctx, sl, &req.Header, hdrLen, seg)
	if err != nil {
		return 0, err
	}
	sl.unref()
	if r.st != protocol.StatusSuccess {
		return 0, r.st
	}
	if int(r.info) > int(req.Header.Length) {
		return 0, fmt.Errorf("lwio write: server reports %d bytes for a %d-byte write: %w", r.info, req.Header.Length, protocol.StatusInvalidNetworkResp)
	}
	return int(r.info), nil
}

// ReadV reads into pages, which are consecutive PageSize pieces of the
// file at off (every one but the last len(pages[0]) bytes long), with
// VEC_READ (FIG. 16A–D): one RDMA WRITE per page. It returns the bytes
// read; a short read at end of file returns io.EOF.
func (f *File) ReadV(ctx context.Context, pages [][]byte, off int64) (int, error) {
	if len(pages) == 0 {
		return 0, nil
	}
	ps := len(pages[0])
	if ps == 0 || ps > 0xFFFF {
		return 0, fmt.Errorf("lwio readv: page size %d", ps)
	}
	if ps > f.cl.MaxRead() {
		// A page exceeds the read window: plain reads, split to fit.
		return eachPage(ctx, pages, off, f.ReadAt)
	}
	per := min(f.cl.conns[0].maxRegions, f.cl.MaxRead()/ps)
	total := 0
	for i := 0; i < len(pages); i += per {
		group := pages[i:min(i+per, len(pages))]
		want := 0
		for j, pg := range group {
			if len(pg) != ps && (i+j != len(pages)-1 || len(pg) > ps) {
				return total, fmt.Errorf("lwio readv: page %d is %d bytes, want %d", i+j, len(pg), ps)
			}
			want += len(pg)
		}
		got, err := f.vecRead(ctx, group, ps, off+int64(total))
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

func (f *File) vecRead(ctx context.Context, pages [][]byte, ps int, off int64) (int, error) {
	c, sl, err := f.begin(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, pg := range pages {
		n += len(pg)
	}
	if n > c.maxRead {
		c.abort(sl)
		return 0, fmt.Errorf("lwio readv: %d bytes exceed the read window %d", n, c.maxRead)
	}
	buf, err := c.pool.Get(len(pages) * ps)
	if err != nil {
		c.abort(sl)
		return 0, err
	}
	sl.buf = buf
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
	req := protocol.NewVecReadRequest(f.fid, uint64(off), uint32(n), uint16(ps), regions, c.hint(), c.prepare(sl, kindIO))
	req.Put(sl.send.Bytes())
	sl.reqLen = uint32(n)
	r, err := c.roundTrip(ctx, sl, &req.Header, req.Size(), nil)
	if err != nil {
		return 0, err
	}
	defer sl.unref()
	switch r.st {
	case protocol.StatusSuccess:
	case protocol.StatusEndOfFile:
		return 0, io.EOF
	default:
		return 0, r.st
	}
	got := int(r.info)
	if got > n {
		return 0, fmt.Errorf("lwio readv: server reports %d bytes for %d: %w", got, n, protocol.StatusInvalidNetworkResp)
	}
	src := buf.Bytes()
	left := got
	for i, pg := range pages {
		if left <= 0 {
			break
		}
		l := min(len(pg), left)
		if sl.polling {
			copyRemote(pg[:l], src[i*ps:i*ps+l])
		} else {
			copy(pg[:l], src[i*ps:i*ps+l])
		}
		left -= l
	}
	return got, nil
}

// WriteV writes pages, consecutive PageSize pieces of the file at off
// (every one but the last len(pages[0]) bytes long), with VEC_WRITE (FIG.
// 17A). When every page holds the same bytes, the file was registered with
// FILE_NO_INTERMEDIATE_BUFFERING and the page sizes of the two ends are
// multiples of each other, only one page is sent (COLLAPSE, FIG. 17B/C).
func (f *File) WriteV(ctx context.Context, pages [][]byte, off int64) (int, error) {
	if len(pages) == 0 {
		return 0, nil
	}
	ps := len(pages[0])
	if ps == 0 || ps > 0xFFFF {
		return 0, fmt.Errorf("lwio writev: page size %d", ps)
	}
	total := 0
	for i, pg := range pages {
		if len(pg) != ps && (i != len(pages)-1 || len(pg) > ps) {
			return 0, fmt.Errorf("lwio writev: page %d is %d bytes, want %d", i, len(pg), ps)
		}
		total += len(pg)
	}
	if len(pages) > 1 && len(pages) <= 0xFFFF && min(ps, total) <= f.cl.MaxWrite() && f.canCollapse(ps) && samePages(pages) {
		return f.collapsed(ctx, pages[0], total, off)
	}
	if ps > f.cl.MaxWrite() {
		// A page does not fit one SEND: plain writes, split to fit.
		return eachPage(ctx, pages, off, f.WriteAt)
	}
	per := f.cl.MaxWrite() / ps
	done := 0
	for i := 0; i < len(pages); i += per {
		group := pages[i:min(i+per, len(pages))]
		got, err := f.gatherWrite(ctx, group, ps, off+int64(done))
		done += got
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func (f *File) canCollapse(ps int) bool {
	if f.flags&protocol.FileNoIntermediateBuffering == 0 {
		return false
	}
	sp := f.cl.conns[0].serverPage
	if sp <= 0 {
		return false
	}
	a, b := max(ps, sp), min(ps, sp)
	return a%b == 0
}

// samePages reports whether every page equals the first (the last may be a
// prefix).
func samePages(pages [][]byte) bool {
	first := pages[0]
	for _, pg := range pages[1:] {
		if !bytes.Equal(pg, first[:len(pg)]) {
			return false
		}
	}
	return true
}

func (f *File) collapsed(ctx context.Context, page []byte, total int, off int64) (int, error) {
	c, sl, err := f.begin(ctx)
	if err != nil {
		return 0, err
	}
	dst, seg, err := c.writeArea(sl, min(total, len(page)))
	if err != nil {
		return 0, err
	}
	req := protocol.NewCollapsedVecWriteRequest(f.fid, uint64(off), uint32(total), page, c.hint(), c.prepare(sl, kindIO))
	req.Data = dst[:copy(dst, req.Data)]
	f.cl.collapsed.Add(1)
	return c.sendWrite(ctx, sl, &req, seg)
}

func (f *File) gatherWrite(ctx context.Context, pages [][]byte, ps int, off int64) (int, error) {
	n := 0
	for _, pg := range pages {
		n += len(pg)
	}
	c, sl, err := f.begin(ctx)
	if err != nil {
		return 0, err
	}
	dst, seg, err := c.writeArea(sl, n)
	if err != nil {
		return 0, err
	}
	w := dst
	for _, pg := range pages {
		w = w[copy(w, pg):]
	}
	req := protocol.NewVecWriteRequest(f.fid, uint64(off), dst, uint16(ps), c.hint(), c.prepare(sl, kindIO))
	return c.sendWrite(ctx, sl, &req, seg)
}

// Close closes the Fid on the server (FIG. 12A/B): later requests on it
// fail. It does not close the file on the session channel.
func (f *File) Close(ctx context.Context) error {
	if f.closed.Swap(true) {
		return ErrClosed
	}
	return f.control(ctx, protocol.NewCloseRequest)
}

// Cancel cancels the requests queued on the server for this file (FIG.
// 13A/B); they complete with STATUS_CANCELLED, those already executing
// finish.
func (f *File) Cancel(ctx context.Context) error {
	if f.closed.Load() {
		return ErrClosed
	}
	return f.control(ctx, protocol.NewCancelRequest)
}

// control sends the header-only request build makes (CLOSE, CANCEL) for
// the file and returns its status.
func (f *File) control(ctx context.Context, build func(fid uint16, credits uint8, cookie uint64) protocol.Header) error {
	c, sl, err := f.cl.begin(ctx)
	if err != nil {
		return err
	}
	h := build(f.fid, c.hint(), c.prepare(sl, kindControl).Cookie)
	r, err := c.roundTrip(ctx, sl, &h, protocol.HeaderSize, nil)
	if err != nil {
		return err
	}
	sl.unref()
	return r.st.Err()
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
