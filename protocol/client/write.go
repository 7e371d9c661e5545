package client

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/transport"
)

// WriteAt writes p at off, in requests of at most MaxWrite bytes. A
// negative off appends: each request carries the offset
// protocol.WriteToEndOfFile and the server places it at the end of the
// file as it is then.
func (f *File) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	total := 0
	for total < len(p) || len(p) == 0 {
		n := min(len(p)-total, f.cl.MaxWrite())
		at := off + int64(total)
		if off < 0 {
			at = -1 // uint64: WriteToEndOfFile
		}
		got, err := f.writeChunk(ctx, p[total:total+n], at)
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

// WriteV writes pages, consecutive PageSize pieces of the file at off
// (every one but the last len(pages[0]) bytes long), with VEC_WRITE (FIG.
// 17A). When every page holds the same bytes, the file was registered with
// FILE_NO_INTERMEDIATE_BUFFERING and the page sizes of the two ends are
// multiples of each other, only one page is sent (COLLAPSE, FIG. 17B/C).
func (f *File) WriteV(ctx context.Context, pages [][]byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("lwio writev at %d: only WriteAt appends: %w", off, protocol.StatusInvalidParameter)
	}
	ps, total, err := checkPages("writev", pages)
	if err != nil || total == 0 {
		return 0, err
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
	f.cl.ctr.collapsed.Add(1)
	return c.sendWrite(ctx, sl, &req, seg)
}

func (f *File) gatherWrite(ctx context.Context, pages [][]byte, ps int, off int64) (int, error) {
	n := pagesLen(pages)
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
