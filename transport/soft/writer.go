package soft

import (
	"net"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// maxBatch is the most frames the writer gathers into one vectored write.
const maxBatch = 64

// frameWriter is the writer goroutine's reusable state: headers and the
// I/O vector, so a batch costs no allocation.
type frameWriter struct {
	hdrs []byte
	iov  [][]byte
	bufs net.Buffers
}

func (w *frameWriter) init() {
	w.hdrs = make([]byte, maxBatch*frameHeaderSize)
	w.iov = make([][]byte, 0, maxBatch*4)
}

// writeLoop transmits queued work requests and acknowledgements. Each
// batch is one writev of headers and payload slices taken straight from
// the registered regions.
func (c *conn) writeLoop() {
	defer c.exit()
	for {
		select {
		case <-c.kick:
		case <-c.closing:
		}
		for {
			work, reset, open := c.gather()
			if !open {
				c.sendNak()
				return
			}
			if len(c.wr.iov) > 0 {
				c.wr.bufs = net.Buffers(c.wr.iov)
				_, err := c.wr.bufs.WriteTo(c.nc)
				clear(c.wr.iov) // drop references to application memory
				if err != nil {
					c.fail(failure{why: "send failed", err: err})
					return
				}
			}
			if reset {
				c.tripReset()
				return
			}
			if !work {
				break
			}
		}
	}
}

// gather builds the next batch in c.wr.iov; work reports whether it found
// anything to do. reset reports that Faults.ResetAfterOps tripped after
// the batch; open is false once the connection has left stateOpen.
func (c *conn) gather() (work, reset, open bool) {
	w := &c.wr
	w.iov = w.iov[:0]
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st != stateOpen {
		return false, false, false
	}
	ack := c.placed.Load()
	n := 0
	if c.timer != nil && c.sqHead == c.sqTx && c.sqTx != c.sqTail {
		c.progressAt = time.Now()
	}
	for c.sqTx != c.sqTail && n < maxBatch {
		r, drop := c.countOp()
		if r {
			reset = true
			break
		}
		work = true
		if drop {
			c.tripDrop()
		}
		e := &c.sq[c.sqTx%uint64(len(c.sq))]
		c.sqTx++
		if c.dropped.Load() {
			continue // lost on the wire
		}
		h := frameHeader{Type: frameSend, Ack: ack, Length: uint32(e.length), Imm: e.imm}
		if e.op == transport.OpWrite {
			h.Type, h.RKey, h.Addr = frameWrite, e.rkey, e.raddr
		}
		if e.hasImm {
			h.Flags = flagImm
		}
		hb := w.hdrs[n*frameHeaderSize : (n+1)*frameHeaderSize]
		h.encode(hb)
		w.iov = append(w.iov, hb)
		for _, s := range e.segs {
			if s.Length > 0 {
				w.iov = append(w.iov, s.Bytes())
			}
		}
		n++
	}
	if n == 0 && ack != c.ackSent.Load() && !reset && !c.dropped.Load() {
		hb := w.hdrs[:frameHeaderSize]
		(&frameHeader{Type: frameAck, Ack: ack}).encode(hb)
		w.iov = append(w.iov, hb)
		n = 1
		work = true
	}
	if n > 0 {
		c.ackSent.Store(ack)
	}
	return work, reset, true
}

// sendNak tells the peer which of its requests failed, then half-closes;
// the reader is draining until the peer closes in turn.
func (c *conn) sendNak() {
	c.mu.Lock()
	f, pending := c.fail1, c.nakPending
	c.nakPending = false
	c.mu.Unlock()
	if !pending || c.dropped.Load() {
		return
	}
	var hb [frameHeaderSize]byte
	(&frameHeader{Type: frameNak, Status: uint8(f.nakSt), Ack: f.nakSeq}).encode(hb[:])
	_ = c.nc.SetWriteDeadline(time.Now().Add(drainTimeout))
	if _, err := c.nc.Write(hb[:]); err == nil {
		_ = c.nc.CloseWrite()
	}
}
