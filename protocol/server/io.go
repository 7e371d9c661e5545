package server

import (
	"errors"
	"io"
	"slices"
	"sync"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
	"github.com/lwiofs/lwiofs/transport"
)

// execIO runs a READ, VEC_READ, WRITE or VEC_WRITE and completes it.
func (c *conn) execIO(sl *slot, worker bool) {
	defer c.reqs.Done()
	wrs, st, info := c.runIO(sl, worker)
	c.complete(sl, wrs, st, info)
}

// runIO waits for a disk worker unless it holds one already (CANCEL, CLOSE
// and teardown fail the request while it waits), then runs the opcode's
// handler. The worker is given back before the completion is posted.
func (c *conn) runIO(sl *slot, worker bool) ([]transport.SendWR, protocol.Status, uint32) {
	if worker {
		defer func() { <-c.s.workers }()
	}
	fe := sl.fid
	if fe == nil {
		return nil, protocol.StatusInvalidHandle, 0
	}
	if !worker {
		select {
		case c.s.workers <- struct{}{}:
		case <-sl.cancel:
			return nil, protocol.StatusCancelled, 0
		case <-c.ctx.Done():
			return nil, protocol.StatusCancelled, 0
		}
		defer func() { <-c.s.workers }()
	}
	select {
	case <-sl.cancel:
		// Cancelled while it waited; a worker came free at the same time.
		return nil, protocol.StatusCancelled, 0
	default:
	}
	fe.mu.Lock()
	closed := fe.closed
	fe.mu.Unlock()
	if closed {
		return nil, protocol.StatusFileClosed, 0
	}
	switch sl.req.Header.Opcode {
	case protocol.OpRead:
		return c.read(sl, fe)
	case protocol.OpVecRead:
		return c.vecRead(sl, fe)
	case protocol.OpWrite:
		return c.write(sl, fe)
	default:
		return c.vecWrite(sl, fe)
	}
}

// read serves READ (FIG. 14A–D): pread into a registered buffer, one RDMA
// WRITE to DataVa/DataMh; complete adds the STATUS_RESPONSE or status
// block, or the write carries the immediate cookie.
func (c *conn) read(sl *slot, fe *fidEntry) ([]transport.SendWR, protocol.Status, uint32) {
	h := &sl.req.Header
	n := int(h.Length)
	if n > c.s.cfg.MaxRdmaWindowSize {
		return nil, protocol.StatusInvalidParameter, 0
	}
	if n == 0 {
		return nil, protocol.StatusSuccess, 0
	}
	c.releaseRecv(sl) // everything needed is in the header
	if wrs, st, info, ok := c.readInPlace(sl, fe, n); ok {
		return wrs, st, info
	}
	buf, got, st := c.readFile(sl, fe, n)
	if got == 0 {
		return nil, st, 0
	}
	wr := transport.SendWR{
		Op:         transport.OpWrite,
		SGL:        sl.sgl(0, transport.Segment{Region: buf, Length: got}),
		RemoteAddr: h.DataVa,
		RKey:       h.DataMh,
	}
	c.withImmediate(sl, &wr, got)
	return append(sl.wrs[:0], wr), protocol.StatusSuccess, uint32(got)
}

// withImmediate puts the immediate cookie on wr, the last data write, when
// it completes the request (FIG. 14A, 16A): interrupt mode, a full read,
// and the server not configured to answer with a STATUS_RESPONSE instead.
func (c *conn) withImmediate(sl *slot, wr *transport.SendWR, got int) {
	h := &sl.req.Header
	if got == int(h.Length) && h.Flags&protocol.FlagInterrupt != 0 && !c.s.cfg.NoImmediate {
		wr.Imm, wr.HasImm = h.ImmediateCookie(), true
	}
}

// readFile reads n bytes at the request's offset into a data buffer (kept
// in sl.data until the request completes) and returns it with the bytes
// read. When nothing was read it returns got 0 and the status to answer:
// END_OF_FILE at or past the end, else the error's.
func (c *conn) readFile(sl *slot, fe *fidEntry, n int) (transport.Region, int, protocol.Status) {
	buf, err := c.data.Get(n)
	if err != nil {
		return nil, 0, protocol.StatusInsufficientResources
	}
	sl.data = buf
	got, err := fe.file.ReadAt(buf.Bytes()[:n], int64(sl.req.Header.Offset))
	if got == 0 {
		return nil, 0, readStatus(err)
	}
	return buf, got, protocol.StatusSuccess
}

// readStatus is the status of a read that read nothing: END_OF_FILE at
// or past the end, else the error's.
func readStatus(err error) protocol.Status {
	if err != nil && !errors.Is(err, io.EOF) {
		return ntstatus.FromError(err)
	}
	return protocol.StatusEndOfFile
}

// readInPlace serves a READ by reading the file straight into the
// client's buffer when the connection can offer it
// (transport.RemoteFiller: softrdma to a mount on this host, whose
// registered memory the server maps): the RDMA WRITE then moves no bytes,
// and the data is copied once, by pread, where readFile and the WRITE copy
// it twice. ok false: the connection cannot, or would not for this target
// (verbs, TCP, sealed, too small, a region the client does not have or
// whose pages are not there), and nothing was read; the caller reads into
// a buffer of its own as before.
//
// The pread runs as the server, as ReadAt always does (it checks no
// permission), so the in-place read is the same for every account.
func (c *conn) readInPlace(sl *slot, fe *fidEntry, n int) ([]transport.SendWR, protocol.Status, uint32, bool) {
	if c.fill == nil {
		return nil, 0, 0, false
	}
	h := &sl.req.Header
	sl.fillFile, sl.fillOff = fe.file, int64(h.Offset)
	placed, ok, err := c.fill.FillRemote(h.DataMh, h.DataVa, n, sl.fillFn)
	sl.fillFile = nil
	if !ok {
		return nil, 0, 0, false
	}
	c.s.ctr.readsInPlace.Add(1)
	if placed.Length == 0 {
		return nil, readStatus(err), 0, true
	}
	wr := transport.SendWR{
		Op:         transport.OpWrite,
		SGL:        sl.sgl(0, placed),
		RemoteAddr: h.DataVa,
		RKey:       h.DataMh,
	}
	c.withImmediate(sl, &wr, placed.Length)
	return append(sl.wrs[:0], wr), protocol.StatusSuccess, uint32(placed.Length), true
}

// fillRead is a slot's fill for readInPlace (bound once, as sl.fillFn,
// so a READ allocates no closure): the file's bytes at sl.fillOff into
// dst, the client's memory.
func (sl *slot) fillRead(dst []byte) (int, error) {
	return sl.fillFile.ReadAt(dst, sl.fillOff)
}

// vecRead serves VEC_READ (FIG. 16A–D): the contiguous file range is read
// once and scattered with one RDMA WRITE per RDMA_REGION; the immediate
// cookie rides on the last segment. DecodeRequest has checked that the
// regions cover Length as FIG. 16A says.
func (c *conn) vecRead(sl *slot, fe *fidEntry) ([]transport.SendWR, protocol.Status, uint32) {
	h := &sl.req.Header
	n := int(h.Length)
	np := int(h.NumPages())
	ps := int(h.PageSize())
	if n > c.s.cfg.MaxRdmaWindowSize || n == 0 || np+1 > c.sq.size {
		return nil, protocol.StatusInvalidParameter, 0
	}
	sl.regions = sl.req.Regions.AppendTo(sl.regions[:0])
	c.releaseRecv(sl)
	buf, got, st := c.readFile(sl, fe, n)
	if got == 0 {
		return nil, st, 0
	}
	sl.ensureSegs(np)
	wrs := sl.wrs[:0]
	for i, r := range sl.regions {
		off := i * ps
		if off >= got {
			break
		}
		l := min(int(r.Length), got-off, ps)
		sl.segs[i] = transport.Segment{Region: buf, Offset: off, Length: l}
		wrs = append(wrs, transport.SendWR{
			Op:         transport.OpWrite,
			SGL:        sl.segs[i : i+1 : i+1],
			RemoteAddr: r.DataVa,
			RKey:       r.DataMh,
		})
	}
	c.withImmediate(sl, &wrs[len(wrs)-1], got)
	return wrs, protocol.StatusSuccess, uint32(got)
}

// write serves WRITE (FIG. 15A–D) and non-collapsed VEC_WRITE (FIG. 17A):
// the data is written straight from the receive buffer, which is reposted
// afterwards.
func (c *conn) write(sl *slot, fe *fidEntry) ([]transport.SendWR, protocol.Status, uint32) {
	if sl.req.Header.Offset == protocol.WriteToEndOfFile {
		// An O_APPEND write: the file places it at its end (DecodeRequest
		// allows the offset on WRITE alone). The completion carries the
		// count only; the client learns the new size by asking.
		// A fragmented append is joined first (a copy: appends are one
		// atomic write, and rare past one receive buffer).
		if sl.hasLent() {
			if err := c.placeLent(sl); err != nil {
				return nil, protocol.StatusInvalidParameter, 0
			}
		}
		data := sl.req.Data
		if len(sl.fragData) > 0 {
			data = slices.Concat(sl.fragData...)
		}
		got, _, err := fe.file.Append(data)
		return nil, ntstatus.FromError(err), uint32(got)
	}
	// A write the share's read-only rule forbids fails in WriteAt.
	off := int64(sl.req.Header.Offset)
	if st, got, done := c.writeFromLent(sl, fe, off); done {
		return nil, st, got
	}
	var got int
	var err error
	if len(sl.fragData) > 0 {
		got, err = writeFragments(fe.file, sl.fragData, off)
	} else {
		got, err = fe.file.WriteAt(sl.req.Data, off)
	}
	return nil, ntstatus.FromError(err), uint32(got)
}

// vecWrite serves VEC_WRITE (FIG. 17A–C). With COLLAPSE one page of data
// follows the header and is replicated over NumPages pages; that is refused
// unless the file was registered with FILE_NO_INTERMEDIATE_BUFFERING and the
// two ends' page sizes are multiples of each other.
func (c *conn) vecWrite(sl *slot, fe *fidEntry) ([]transport.SendWR, protocol.Status, uint32) {
	h := &sl.req.Header
	if h.Flags&protocol.FlagCollapse == 0 {
		return c.write(sl, fe)
	}
	n := int(h.Length)
	ps := int(h.PageSize())
	if fe.flags&protocol.FileNoIntermediateBuffering == 0 || !pageSizesCompatible(ps, c.s.cfg.PageSize) || n == 0 {
		return nil, protocol.StatusInvalidParameter, 0
	}
	chunk := collapseChunk(n, ps)
	scratch := getScratch(chunk)
	for off := 0; off < chunk; off += ps {
		copy(scratch[off:min(off+ps, chunk)], sl.req.Data)
	}
	c.releaseRecv(sl)
	written := 0
	var err error
	for written < n && err == nil {
		l := min(chunk, n-written)
		var got int
		got, err = fe.file.WriteAt(scratch[:l], int64(h.Offset)+int64(written))
		written += got
	}
	putScratch(scratch)
	return nil, ntstatus.FromError(err), uint32(written)
}

func pageSizesCompatible(a, b int) bool {
	if a <= 0 || b <= 0 {
		return false
	}
	if a < b {
		a, b = b, a
	}
	return a%b == 0
}

// collapseChunk is how much replicated data one WriteAt of a collapsed
// write covers: whole pages, at most 1 MiB.
func collapseChunk(n, ps int) int {
	const most = 1 << 20
	if n <= most {
		return n
	}
	return max(most/ps, 1) * ps
}

var scratchPool sync.Pool

func getScratch(n int) []byte {
	if b, ok := scratchPool.Get().(*[]byte); ok && cap(*b) >= n {
		return (*b)[:n]
	}
	return make([]byte, n, max(n, 1<<20))
}

func putScratch(b []byte) { scratchPool.Put(&b) }
