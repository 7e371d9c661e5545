package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

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
		at := off + int64(total)
		if off < 0 {
			at = -1 // uint64: WriteToEndOfFile
		}
		got, sent, err := f.writeChunk(ctx, p[total:total+min(len(p)-total, f.cl.MaxWrite())], at)
		total += got
		if err != nil {
			return total, err
		}
		if got < sent {
			return total, io.ErrShortWrite
		}
		if len(p) == 0 {
			break
		}
	}
	return total, nil
}

// writeChunk is one WRITE (FIG. 15A–D) of p or, when the connection's
// credits do not cover p's messages, of as much of p as they do. It
// returns the bytes the server wrote and the bytes sent.
func (f *File) writeChunk(ctx context.Context, p []byte, off int64) (got, sent int, err error) {
	c, sl, n, err := f.beginWrite(ctx, len(p))
	if err != nil {
		return 0, 0, err
	}
	dst, seg, err := c.writeArea(sl, n)
	if err != nil {
		return 0, 0, err
	}
	copy(dst, p)
	req := protocol.NewWriteRequest(f.fid, uint64(off), dst, c.hint(), c.prepare(sl, kindIO, n))
	got, err = c.sendWrite(ctx, sl, &req, seg)
	return got, n, err
}

// beginWrite picks a connection for a write of up to n data bytes and
// takes its slot and credits: one per message, for a write longer than a
// receive buffer of the server's goes fragmented (docs/wire.md,
// "Fragmented writes"). When the connection holds fewer credits than n
// needs, the write is cut to what they cover; it returns the bytes the
// request carries.
func (f *File) beginWrite(ctx context.Context, n int) (*conn, *slot, int, error) {
	if f.closed.Load() {
		return nil, nil, 0, ErrClosed
	}
	c, err := f.cl.pick()
	if err != nil {
		return nil, nil, 0, err
	}
	for {
		k := protocol.Fragments(n, c.fragData+protocol.HeaderSize)
		sl, err := c.beginN(ctx, k)
		if errors.Is(err, protocol.ErrTooFewCredits) {
			// A smaller grant than this write's messages: send what
			// the grant covers (at least one buffer's worth).
			n = min(n, max(c.credits.Limit(), 1)*c.fragData)
			continue
		}
		if err != nil {
			return nil, nil, 0, err
		}
		sl.mode = Mode(f.mode.Load())
		return c, sl, n, nil
	}
}

// writeArea returns where n bytes of write data go (FIG. 15A: the data
// follows the header in the SEND): behind the header in the slot's send
// area when they fit, else a pooled registered buffer sent as the SEND's
// second segment, seg. On error the slot and credit are given back.
func (c *conn) writeArea(sl *slot, n int) (dst []byte, seg *transport.Segment, err error) {
	if n <= inlineWrite && sl.ncred <= 1 {
		return sl.send.Bytes()[protocol.HeaderSize : protocol.HeaderSize+n], nil, nil
	}
	buf, err := c.slotBuffer(sl, n)
	if err != nil {
		return nil, nil, err
	}
	sl.data = transport.Segment{Region: buf, Length: n}
	return buf.Bytes()[:n], &sl.data, nil
}

// sendWrite posts a WRITE or VEC_WRITE whose data writeArea placed and
// returns the bytes the server wrote.
func (c *conn) sendWrite(ctx context.Context, sl *slot, req *protocol.WriteRequest, seg *transport.Segment) (int, error) {
	start, polling := time.Now(), sl.polling
	if err := c.postWrite(sl, req, seg); err != nil {
		return 0, err
	}
	r, err := c.wait(ctx, sl)
	c.count(req.Header.Opcode, polling, writePayload(req, seg), r, err, start)
	if err != nil {
		return 0, err
	}
	sl.unref()
	return writeCount(r, req)
}

// writePayload is the write data a request sends (a collapsed VEC_WRITE,
// one page): what the counters call RDMA bytes.
func writePayload(req *protocol.WriteRequest, seg *transport.Segment) int {
	if seg != nil {
		return seg.Length
	}
	return len(req.Data)
}

// postWrite posts a WRITE or VEC_WRITE: one SEND (header, then the data
// behind it or as a second segment), or, when sl took a credit per
// message, the fragmented write's messages in one chain.
//
// lendWrite: a SEND whose data is in the slot's pooled buffer is lent
// (transport.SendWR.Lend): the server may read the data from it after the
// SEND completes. That holds because the buffer goes back to the pool
// only when the slot is free, and the slot holds a reference for the
// request's completion, which is the server's answer, sent after its
// write returned (protocol/server/lent.go unpins first): a requester that
// leaves (context, cancel) leaves the slot Abandoned until the answer; a
// WriteAsync's poster lets go at once but the answer's reference stays;
// a connection that dies completes nothing more, so its slots and their
// buffers are never freed and never reused (a failed post of one SEND
// lent nothing; of a chain, the connection dies). Small data behind the
// header in the send area is never a reference and is not lent.
func (c *conn) postWrite(sl *slot, req *protocol.WriteRequest, seg *transport.Segment) error {
	if sl.ncred > 1 {
		return c.postFragmented(sl, req, *seg)
	}
	hdrLen := protocol.HeaderSize
	if seg == nil {
		hdrLen += len(req.Data)
	}
	return c.post(sl, &req.Header, hdrLen, seg)
}

// postFragmented posts req, whose data is data, as a fragmented write
// (docs/wire.md, "Fragmented writes"): its header with FRAGMENTED and a
// receive buffer's worth of data, then a FRAGMENT per buffer, their
// headers side by side in the slot's send area, every message a header
// segment and a piece of data, all in one chain. The slot took a credit
// per message.
func (c *conn) postFragmented(sl *slot, req *protocol.WriteRequest, data transport.Segment) error {
	k := sl.ncred
	if cap(sl.fwrs) < k {
		sl.fwrs = make([]transport.SendWR, maxFragments)
		sl.fsegs = make([]transport.Segment, 2*maxFragments)
	}
	first := req.Fragment(c.fragData)
	send := sl.send.Bytes()
	first.Header.Put(send)
	wrs := sl.fwrs[:k]
	for i, done := 0, 0; i < k; i++ {
		n := min(c.fragData, len(req.Data)-done)
		if i > 0 {
			h := protocol.NewFragmentHeader(&first.Header, req.Header.Offset+uint64(done), uint32(n), req.Header.Credits)
			h.Put(send[i*protocol.HeaderSize:])
		}
		sgl := sl.fsegs[2*i : 2*i+2 : 2*i+2]
		sgl[0] = transport.Segment{Region: sl.send, Offset: i * protocol.HeaderSize, Length: protocol.HeaderSize}
		sgl[1] = transport.Segment{Region: data.Region, Offset: data.Offset + done, Length: n}
		wrs[i] = transport.SendWR{ID: fragID | uint64(sl.idx), Op: transport.OpSend, SGL: sgl, Lend: true}
		done += n
	}
	wrs[k-1].ID = uint64(sl.idx)
	return c.postChain(sl, wrs)
}

// writeCount checks a WRITE or VEC_WRITE completion: its status, and no
// more bytes written than sent.
func writeCount(r result, req *protocol.WriteRequest) (int, error) {
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
	if len(pages) > 1 && len(pages) <= 0xFFFF && min(ps, total) <= min(f.cl.MaxWrite(), f.cl.conns[0].fragData) && f.canCollapse(ps) && samePages(pages) {
		return f.collapsed(ctx, pages[0], total, off)
	}
	if ps > f.cl.MaxWrite() || ps > f.cl.conns[0].fragData {
		// A page does not fit one request, or one message of a
		// fragmented one: plain writes, split to fit.
		return eachPage(ctx, pages, off, f.WriteAt)
	}
	per := f.cl.MaxWrite() / ps
	done := 0
	for i := 0; i < len(pages); {
		group := pages[i:min(i+per, len(pages))]
		got, sent, err := f.gatherWrite(ctx, group, ps, off+int64(done))
		done += got
		if err != nil {
			return done, err
		}
		if got < sent {
			return done, io.ErrShortWrite
		}
		i += (sent + ps - 1) / ps
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
	req := protocol.NewCollapsedVecWriteRequest(f.fid, uint64(off), uint32(total), page, c.hint(), c.prepare(sl, kindIO, total))
	req.Data = dst[:copy(dst, req.Data)]
	f.cl.ctr.collapsed.Add(1)
	return c.sendWrite(ctx, sl, &req, seg)
}

// gatherWrite is one VEC_WRITE of the pages (all but the last ps bytes),
// or of the whole pages at their front the connection's credits cover. It
// returns the bytes written and sent.
func (f *File) gatherWrite(ctx context.Context, pages [][]byte, ps int, off int64) (got, sent int, err error) {
	c, sl, n, err := f.beginWrite(ctx, pagesLen(pages))
	if err != nil {
		return 0, 0, err
	}
	if n < pagesLen(pages) {
		pages = pages[:max(n/ps, 1)]
		n = pagesLen(pages)
	}
	dst, seg, err := c.writeArea(sl, n)
	if err != nil {
		return 0, 0, err
	}
	w := dst
	for _, pg := range pages {
		w = w[copy(w, pg):]
	}
	req := protocol.NewVecWriteRequest(f.fid, uint64(off), dst, uint16(ps), c.hint(), c.prepare(sl, kindIO, n))
	got, err = c.sendWrite(ctx, sl, &req, seg)
	return got, n, err
}

// PendingWrite is a WRITE posted by WriteAsync whose answer has not been
// waited for. Wait exactly once.
type PendingWrite struct {
	c  *conn
	sl *slot // nil: done already (n bytes)
	// req.Data is in sl's memory, which is sl's again once answered:
	// only a Wait that finds the connection lost, and the answer not
	// come, reads it (into data).
	req  protocol.WriteRequest
	data []byte // a copy of the bytes, kept when the connection died
	n    int
	// The server's answer, in res once answered is closed (complete):
	// the slot is free again by then.
	res      result
	answered chan struct{}
	// For the counters (stats.go): when it was posted, with how many
	// bytes (always in interrupt mode: WriteAsync).
	start   time.Time
	payload int
}

// WriteAsync copies p into registered memory, posts it as one WRITE at off
// and returns without waiting for the server: p may be reused at once.
// Wait gives the outcome. A writer keeps several WRITEs in flight this way
// (buffered sequential writes), each holding its credits and a slot until
// its answer comes, not until its Wait: writers with writes in flight on
// many files cannot take every slot with writes already answered. A write
// that one request cannot carry (longer than MaxWrite, or than the
// connection's credits cover) is written at once (WriteAt): its
// PendingWrite is done already, or its error is WriteAsync's. It completes
// in interrupt mode whatever the file's: its credits come back with the
// server's answer, not with Wait.
func (f *File) WriteAsync(ctx context.Context, p []byte, off int64) (*PendingWrite, error) {
	if len(p) == 0 || len(p) > f.cl.MaxWrite() {
		return f.writeNow(ctx, p, off)
	}
	c, sl, n, err := f.beginWrite(ctx, len(p))
	if err != nil {
		return nil, err
	}
	if n < len(p) {
		c.abort(sl)
		return f.writeNow(ctx, p, off)
	}
	// Completed by the server's answer whatever the file's mode: a
	// polling-mode write would keep its credits until its Wait polled
	// the status block, and a writer posting more than the credits cover
	// before it waits (fs's write-behind: 8 writes of 8 credits) would
	// wait for good for credits only its own later Waits free.
	sl.mode = Interrupt
	dst, seg, err := c.writeArea(sl, len(p))
	if err != nil {
		return nil, err
	}
	copy(dst, p)
	w := &PendingWrite{c: c, sl: sl, start: time.Now(), payload: len(p), answered: make(chan struct{})}
	w.req = protocol.NewWriteRequest(f.fid, uint64(off), dst, c.hint(), c.prepare(sl, kindIO, len(p)))
	sl.pw = w
	if err := c.postWrite(sl, &w.req, seg); err != nil {
		return nil, err
	}
	sl.unref() // the poster's: Wait takes the answer from w, not the slot
	return w, nil
}

// writeNow is WriteAsync's write of p that is not posted but written at
// once: done already, or its error — returned by WriteAsync itself, as a
// posted write's failure to post is, so that a caller replaying writes on
// a lost connection (fs's Reconnector) sees it; Wait could not give the
// bytes back (Data) to write again.
func (f *File) writeNow(ctx context.Context, p []byte, off int64) (*PendingWrite, error) {
	n, err := f.WriteAt(ctx, p, off)
	if err != nil {
		return nil, err
	}
	return &PendingWrite{n: n}, nil
}

// Wait waits for the WRITE's answer and returns the bytes the server
// wrote. When the connection was lost first (protocol.IsConnectionLost),
// Data has the bytes, to write again elsewhere.
func (w *PendingWrite) Wait(ctx context.Context) (int, error) {
	c := w.c
	if w.sl == nil {
		return w.n, nil
	}
	r, err := c.waitPosted(ctx, w)
	c.count(w.req.Header.Opcode, false, w.payload, r, err, w.start)
	if err != nil {
		return 0, err
	}
	return writeCount(r, &w.req)
}

func (w *PendingWrite) isAnswered() bool { return closed(w.answered) }

// waitPosted waits for a posted write's answer, reaping if nobody is. A
// context that ends first leaves the slot to the answer, which frees it.
func (c *conn) waitPosted(ctx context.Context, w *PendingWrite) (result, error) {
	if c.reaping.CompareAndSwap(false, true) && c.reapUntil(ctx, w.isAnswered) {
		return w.res, nil
	}
	select {
	case <-w.answered:
		return w.res, nil
	case <-ctx.Done():
		return result{}, ctx.Err()
	case <-c.dead:
	}
	// Lost, unless the answer came all the same. Taking the slot from
	// Waiting keeps a late answer from freeing it (complete ends the dead
	// connection again, and stops there) while its bytes are copied for
	// the caller to send again; the slot is not used again.
	if !w.isAnswered() && w.sl.state.CompareAndSwap(slotWaiting, slotDone) {
		w.data = append([]byte(nil), w.req.Data...)
		return result{}, c.connErr()
	}
	<-w.answered
	return w.res, nil
}

// Data is a copy of the bytes of a write whose Wait found the connection
// lost, else nil.
func (w *PendingWrite) Data() []byte { return w.data }
