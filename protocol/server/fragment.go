package server

import (
	"time"

	"github.com/lwiofs/lwiofs/protocol"
)

// Fragmented writes (docs/wire.md, "Fragmented writes"; seed 004): a
// write longer than a receive buffer comes as its first message and
// FRAGMENTs, in a row on the connection. The reaper collects them in one
// slot, keeping every receive buffer (no copy), and dispatches the write
// once the last is in; it is written from those buffers with one
// vectored write (io.go) and they are posted again when it completes.
// protocol.Assembly holds the sequence rules; a broken one ends the
// connection.

// assemble takes the message req, which arrived in rb and has its credit,
// and returns the slot of the request to dispatch now: a new one for a
// plain request, or a fragmented write's when req was its last FRAGMENT.
// ok is false while a write is incomplete, or when the connection failed.
// Only the reaper calls it.
func (c *conn) assemble(req *protocol.Request, rb *recvBuf) (*slot, bool) {
	switch {
	case c.asm.Open():
		done, err := c.asm.Next(req)
		if err != nil {
			c.fail(err)
			return nil, false
		}
		sl := c.asmSlot
		sl.frags = append(sl.frags, rb)
		sl.fragData = append(sl.fragData, rb.placed(req.Data))
		if !done {
			return nil, false
		}
		c.asmSlot = nil
		sl.msgs = c.asm.Messages()
		return sl, true
	case req.Header.Opcode == protocol.OpFragment:
		c.fail(c.asm.Unexpected())
		return nil, false
	}
	sl, err := c.slots.get()
	if err != nil {
		c.fail(err)
		return nil, false
	}
	sl.req = *req
	sl.req.Data = rb.placed(req.Data) // never the unplaced bytes (lent.go)
	sl.recv = rb
	sl.inline = false
	sl.start = time.Now() // for the latency count (stats.go)
	sl.msgs = 1
	if req.Header.Flags&protocol.FlagFragmented == 0 {
		return sl, true
	}
	if err := c.asm.Start(req, c.s.cfg.MaxRecvBufferSize, c.s.cfg.MaxRdmaWindowSize); err != nil {
		c.fail(err)
		return nil, false
	}
	sl.frags = sl.frags[:0]
	sl.fragData = append(sl.fragData[:0], sl.req.Data)
	c.asmSlot = sl
	return nil, false
}

// releaseFragments posts again the receive buffers of a fragmented
// write's FRAGMENTs (releaseRecv does the first's).
func (c *conn) releaseFragments(sl *slot) {
	for i, rb := range sl.frags {
		sl.frags[i] = nil
		c.giveBack(rb)
	}
	sl.frags = sl.frags[:0]
	for i := range sl.fragData {
		sl.fragData[i] = nil
	}
	sl.fragData = sl.fragData[:0]
}

// vectoredWriter is a file that writes several buffers in one call
// (share.OpenFile, pwritev); a file without it (a test's wrapper) gets
// one WriteAt per piece.
type vectoredWriter interface {
	WriteVAt(bufs [][]byte, off int64) (int, error)
}

// writeFragments writes a fragmented write's data, every piece where it
// landed, at off.
func writeFragments(f interface {
	WriteAt([]byte, int64) (int, error)
}, pieces [][]byte, off int64) (int, error) {
	if vw, ok := f.(vectoredWriter); ok {
		return vw.WriteVAt(pieces, off)
	}
	n := 0
	for _, p := range pieces {
		k, err := f.WriteAt(p, off+int64(n))
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
