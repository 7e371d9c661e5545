package server

import (
	"errors"
	"io"
	"io/fs"
	"sync"
	"syscall"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/transport"
)

// execIO runs a READ, VEC_READ, WRITE or VEC_WRITE: it validates the
// request, waits for a disk worker (CANCEL fails it while it waits) unless
// it holds one already, does the disk work and completes it.
func (c *conn) execIO(sl *slot, worker bool) {
	defer c.reqs.Done()
	if worker {
		defer func() { <-c.s.workers }()
	}
	h := &sl.hdr
	fe := sl.fid
	if fe == nil {
		c.completeIO(sl, nil, protocol.StatusInvalidHandle, 0, false)
		return
	}
	if !worker {
		select {
		case c.s.workers <- struct{}{}:
		case <-sl.cancel:
			c.completeIO(sl, nil, protocol.StatusCancelled, 0, false)
			return
		case <-c.ctx.Done():
			c.completeIO(sl, nil, protocol.StatusCancelled, 0, false)
			return
		}
		defer func() { <-c.s.workers }()
	}
	select {
	case <-sl.cancel:
		// Cancelled while it waited; a worker came free at the same time.
		c.completeIO(sl, nil, protocol.StatusCancelled, 0, false)
		return
	default:
	}
	fe.mu.Lock()
	closed := fe.closed
	fe.mu.Unlock()
	if closed {
		c.completeIO(sl, nil, protocol.StatusFileClosed, 0, false)
		return
	}
	switch h.Opcode {
	case protocol.OpRead:
		c.read(sl, fe)
	case protocol.OpVecRead:
		c.vecRead(sl, fe)
	case protocol.OpWrite:
		c.write(sl, fe, sl.msg[protocol.HeaderSize:])
	case protocol.OpVecWrite:
		c.vecWrite(sl, fe)
	}
}

// read serves READ (FIG. 14A–D): pread into a registered buffer, one RDMA
// WRITE to DataVa/DataMh, completion by immediate data, STATUS_RESPONSE or
// status block.
func (c *conn) read(sl *slot, fe *fidEntry) {
	h := &sl.hdr
	n := int(h.Length)
	if n > c.s.cfg.MaxRdmaWindowSize || len(sl.msg) != protocol.HeaderSize {
		c.completeIO(sl, nil, protocol.StatusInvalidParameter, 0, false)
		return
	}
	if n == 0 {
		c.completeIO(sl, nil, protocol.StatusSuccess, 0, false)
		return
	}
	c.releaseRecv(sl, false) // everything needed is in sl.hdr
	buf, got, ok := c.readFile(sl, fe, n)
	if !ok {
		return
	}
	imm := got == n && h.Flags&protocol.FlagInterrupt != 0 && !c.s.cfg.NoImmediate
	wr := transport.SendWR{
		Op:         transport.OpWrite,
		SGL:        sl.sgl(0, transport.Segment{Region: buf, Length: got}),
		RemoteAddr: h.DataVa,
		RKey:       h.DataMh,
		Imm:        h.ImmediateCookie(),
		HasImm:     imm,
	}
	sl.wrs = append(sl.wrs[:0], wr)
	c.completeIO(sl, sl.wrs, protocol.StatusSuccess, uint32(got), imm)
}

// readFile reads n bytes at the request's offset into a data buffer (kept
// in sl.data until the request completes) and returns it with the bytes
// read. When nothing can be sent — no buffer, nothing read — it completes
// the request itself (END_OF_FILE at or past the end) and reports !ok.
func (c *conn) readFile(sl *slot, fe *fidEntry, n int) (transport.Region, int, bool) {
	buf, err := c.data.get(n)
	if err != nil {
		c.completeIO(sl, nil, protocol.StatusInsufficientResources, 0, false)
		return nil, 0, false
	}
	sl.data = buf
	got, err := fe.file.ReadAt(buf.Bytes()[:n], int64(sl.hdr.Offset))
	if got == 0 {
		st := protocol.StatusEndOfFile
		if err != nil && !errors.Is(err, io.EOF) {
			st = statusOf(err)
		}
		c.completeIO(sl, nil, st, 0, false)
		return nil, 0, false
	}
	return buf, got, true
}

// vecRead serves VEC_READ (FIG. 16A–D): the contiguous file range is read
// once and scattered with one RDMA WRITE per RDMA_REGION; the immediate
// cookie rides on the last segment.
func (c *conn) vecRead(sl *slot, fe *fidEntry) {
	h := &sl.hdr
	n := int(h.Length)
	np := int(h.NumPages())
	ps := int(h.PageSize())
	body := sl.msg[protocol.HeaderSize:]
	// FIG. 16A: enough regions to cover Length, every one but the last
	// one page long, the last at most a page.
	if n > c.s.cfg.MaxRdmaWindowSize || n == 0 || ps == 0 || np != int(protocol.PagesSpanned(h.Length, h.PageSize())) ||
		len(body) != np*protocol.RDMARegionSize || np+1 > c.sq.size {
		c.completeIO(sl, nil, protocol.StatusInvalidParameter, 0, false)
		return
	}
	sl.regions = protocol.RegionList(body).AppendTo(sl.regions[:0])
	for i, r := range sl.regions {
		if (i < np-1 && int(r.Length) != ps) || (i == np-1 && (r.Length == 0 || int(r.Length) > ps || i*ps+int(r.Length) < n)) {
			c.completeIO(sl, nil, protocol.StatusInvalidParameter, 0, false)
			return
		}
	}
	c.releaseRecv(sl, false)
	buf, got, ok := c.readFile(sl, fe, n)
	if !ok {
		return
	}
	imm := got == n && h.Flags&protocol.FlagInterrupt != 0 && !c.s.cfg.NoImmediate
	sl.ensureSegs(np)
	sl.wrs = sl.wrs[:0]
	for i, r := range sl.regions {
		off := i * ps
		if off >= got {
			break
		}
		l := min(int(r.Length), got-off, ps)
		sl.segs[i] = transport.Segment{Region: buf, Offset: off, Length: l}
		sl.wrs = append(sl.wrs, transport.SendWR{
			Op:         transport.OpWrite,
			SGL:        sl.segs[i : i+1 : i+1],
			RemoteAddr: r.DataVa,
			RKey:       r.DataMh,
		})
	}
	if imm {
		last := &sl.wrs[len(sl.wrs)-1]
		last.Imm, last.HasImm = h.ImmediateCookie(), true
	}
	c.completeIO(sl, sl.wrs, protocol.StatusSuccess, uint32(got), imm)
}

// write serves WRITE (FIG. 15A–D) and non-collapsed VEC_WRITE (FIG. 17A):
// the data is written straight from the receive buffer, which is reposted
// afterwards.
func (c *conn) write(sl *slot, fe *fidEntry, data []byte) {
	h := &sl.hdr
	if len(data) != int(h.Length) {
		c.completeIO(sl, nil, protocol.StatusInvalidParameter, 0, false)
		return
	}
	// A write the share's read-only rule forbids fails in WriteAt.
	got, err := fe.file.WriteAt(data, int64(h.Offset))
	st := protocol.StatusSuccess
	if err != nil {
		st = statusOf(err)
	}
	c.completeIO(sl, nil, st, uint32(got), false)
}

// vecWrite serves VEC_WRITE (FIG. 17A–C). With COLLAPSE one page of data
// follows the header and is replicated over NumPages pages; that is refused
// unless the file was registered with FILE_NO_INTERMEDIATE_BUFFERING and the
// two ends' page sizes are multiples of each other.
func (c *conn) vecWrite(sl *slot, fe *fidEntry) {
	h := &sl.hdr
	data := sl.msg[protocol.HeaderSize:]
	if h.Flags&protocol.FlagCollapse == 0 {
		c.write(sl, fe, data)
		return
	}
	n := int(h.Length)
	np := int(h.NumPages())
	ps := int(h.PageSize())
	if fe.flags&protocol.FileNoIntermediateBuffering == 0 || !pageSizesCompatible(ps, c.s.cfg.PageSize) ||
		np == 0 || ps == 0 || n > np*ps || n <= (np-1)*ps || len(data) != min(ps, n) {
		c.completeIO(sl, nil, protocol.StatusInvalidParameter, 0, false)
		return
	}
	chunk := collapseChunk(n, ps)
	scratch := getScratch(chunk)
	for off := 0; off < chunk; off += ps {
		copy(scratch[off:min(off+ps, chunk)], data)
	}
	c.releaseRecv(sl, false)
	written := 0
	var err error
	for written < n && err == nil {
		l := min(chunk, n-written)
		var got int
		got, err = fe.file.WriteAt(scratch[:l], int64(h.Offset)+int64(written))
		written += got
	}
	putScratch(scratch)
	st := protocol.StatusSuccess
	if err != nil {
		st = statusOf(err)
	}
	c.completeIO(sl, nil, st, uint32(written), false)
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

// statusOf maps a file error to the NTSTATUS a client sees.
func statusOf(err error) protocol.Status {
	var st protocol.Status
	switch {
	case errors.As(err, &st):
		return st
	case errors.Is(err, io.EOF):
		return protocol.StatusEndOfFile
	case errors.Is(err, fs.ErrPermission):
		return protocol.StatusAccessDenied
	case errors.Is(err, fs.ErrClosed):
		return protocol.StatusFileClosed
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return protocol.StatusDiskFull
	case errors.Is(err, syscall.EFBIG):
		return protocol.StatusFileTooLarge
	case errors.Is(err, syscall.EINVAL):
		return protocol.StatusInvalidParameter
	case errors.Is(err, syscall.EROFS):
		return protocol.StatusMediaWriteProtected
	}
	return protocol.StatusIOError
}
