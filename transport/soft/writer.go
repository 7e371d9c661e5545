package soft

import (
	"net"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// maxBatch is the most frames gathered into one vectored write, and
// maxBatchBytes the most payload (a batch always takes one frame): a batch
// that completes is progress for TransportTimeout, so it must not be huge.
const (
	maxBatch      = 64
	maxBatchBytes = 4 << 20
)

// frameWriter is the socket's write side: reusable headers and I/O vector,
// so a batch costs no allocation. Only the goroutine that owns the write
// side (conn.writing) touches it.
type frameWriter struct {
	hdrs []byte
	iov  [][]byte // the batch, or what is left of it
	bufs net.Buffers
	sys  sysWriter // the non-blocking writev of the inline path
	seal sealBuf   // sealed frames of the batch, once the sends are sealed
	shm  shmBuf    // shared-memory entries and copies of the batch (shmwire.go)
}

func (w *frameWriter) init(tc sock) {
	w.hdrs = make([]byte, maxBatch*frameHeaderSize)
	w.iov = make([][]byte, 0, maxBatch*4)
	w.sys.init(tc)
}

// consume drops the first n written bytes from iov.
func (w *frameWriter) consume(n int) {
	i := 0
	for i < len(w.iov) && n >= len(w.iov[i]) {
		n -= len(w.iov[i])
		w.iov[i] = nil
		i++
	}
	if i < len(w.iov) {
		w.iov[i] = w.iov[i][n:]
	}
	m := copy(w.iov, w.iov[i:])
	clear(w.iov[m:])
	w.iov = w.iov[:m]
}

// transmit sends what is queued from the calling goroutine (Post, the
// reader's acknowledgements), without blocking: if the socket will not
// take everything at once the rest is handed to the writer goroutine. If
// another goroutine owns the write side it will carry the new work.
//
// Sending from the caller saves the hand-off to the writer goroutine on
// every request, which dominates a small round trip.
func (c *conn) transmit() {
	c.mu.Lock()
	if c.writing {
		c.mu.Unlock()
		return
	}
	c.writing = true
	for {
		work, reset, open := c.gather()
		if !open || (!work && !reset) {
			c.writing = false
			c.mu.Unlock()
			if !open {
				c.wakeWriter() // it sends the NAK, if any, and exits
			}
			return
		}
		c.mu.Unlock()
		c.shmRun()
		c.wr.seal.run()
		wrote := len(c.wr.iov) > 0
		if wrote {
			n, err := c.wr.sys.writev(c.wr.iov)
			c.wr.consume(n)
			if err != nil && !errWouldBlock(err) {
				c.releaseWrite()
				c.fail(failure{why: "send failed", err: err})
				return
			}
			if len(c.wr.iov) > 0 {
				c.mu.Lock()
				c.handoff = true // the write side now belongs to the writer
				c.mu.Unlock()
				c.wakeWriter()
				return
			}
		}
		if reset {
			c.releaseWrite()
			c.tripReset()
			return
		}
		c.mu.Lock()
		if wrote {
			c.wrote()
		}
	}
}

// wrote notes that a batch left for the peer: the peer's reader is
// consuming, which is progress for TransportTimeout. c.mu is held.
func (c *conn) wrote() {
	if c.timer != nil {
		c.progressAt = time.Now()
	}
}

func (c *conn) releaseWrite() {
	c.mu.Lock()
	c.writing = false
	c.mu.Unlock()
	c.wakeWriter()
}

// writeLoop is the writer goroutine: it takes the write side over when an
// inline transmit could not finish, or when kicked while nobody owns it,
// and uses blocking writes. When the connection fails it sends the NAK,
// if one is due, after finishing any partly written frame.
func (c *conn) writeLoop() {
	defer c.exit()
	for range c.kick {
		c.mu.Lock()
		if c.writing && !c.handoff {
			// Someone writes inline; it kicks us when it lets go.
			c.mu.Unlock()
			continue
		}
		c.writing, c.handoff = true, false
		for {
			if len(c.wr.iov) > 0 {
				c.mu.Unlock()
				c.shmRun()
				c.wr.seal.run()
				c.wr.bufs = net.Buffers(c.wr.iov)
				raceRelease()
				_, err := c.wr.bufs.WriteTo(c.nc)
				clear(c.wr.iov)
				c.wr.iov = c.wr.iov[:0]
				if err != nil {
					c.fail(failure{why: "send failed", err: err})
					c.sendNak()
					return
				}
				c.mu.Lock()
				c.wrote()
			}
			work, reset, open := c.gather()
			if !open {
				c.mu.Unlock()
				c.sendNak()
				return
			}
			if reset {
				c.mu.Unlock()
				c.flushBatch()
				c.tripReset()
				return
			}
			if !work {
				break
			}
		}
		c.writing = false
		c.mu.Unlock()
	}
}

// flushBatch writes the gathered batch (blocking).
func (c *conn) flushBatch() {
	c.shmRun()
	if len(c.wr.iov) == 0 {
		return
	}
	c.wr.seal.run()
	c.wr.bufs = net.Buffers(c.wr.iov)
	raceRelease()
	_, _ = c.wr.bufs.WriteTo(c.nc)
	clear(c.wr.iov)
	c.wr.iov = c.wr.iov[:0]
}

// gather builds the next batch in c.wr.iov; c.mu is held. work reports
// whether it found anything to do; reset that Faults.ResetAfterOps tripped
// after the batch; open is false once the connection has left stateOpen.
func (c *conn) gather() (work, reset, open bool) {
	w := &c.wr
	if c.st != stateOpen {
		return false, false, false
	}
	ack := c.placed.Load()
	n := 0
	if c.timer != nil && c.sqHead == c.sqTx && c.sqTx != c.sqTail {
		c.progressAt = time.Now()
	}
	bytes := 0
	var keys *sealKeys
	if c.sealOut.Load() {
		keys = c.sealk.Load()
		w.seal.reset()
	}
	w.shm.desc = w.shm.desc[:0]
	for c.sqTx != c.sqTail && n < maxBatch && (n == 0 || bytes+c.sq[c.sqTx%uint64(len(c.sq))].length <= maxBatchBytes) {
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
		bytes += e.length
		n++
		if e.isPlaced() {
			c.placedFrame(keys != nil, &h, w.hdrs[(n-1)*frameHeaderSize:n*frameHeaderSize])
			continue
		}
		if keys != nil {
			w.iov = append(w.iov, w.seal.reserve(keys.send, &h, e.segs, e.length))
			continue
		}
		hb := w.hdrs[(n-1)*frameHeaderSize : n*frameHeaderSize]
		if c.shmOut && e.op == transport.OpSend && e.length >= c.p.shmMinCopy && w.appendRefs(e, &h, hb, c.p.shmMinRef) {
			continue
		}
		h.encode(hb)
		w.iov = append(w.iov, hb)
		iov0 := len(w.iov)
		for _, s := range e.segs {
			if s.Length > 0 {
				w.iov = append(w.iov, s.Bytes())
			}
		}
		if c.shmWrite(e) {
			w.shm.jobs = append(w.shm.jobs, shmJob{hdr: hb, h: h, iov0: iov0, iov1: len(w.iov)})
		}
	}
	if n == 0 && ack != c.ackSent.Load() && !reset && !c.dropped.Load() {
		h := frameHeader{Type: frameAck, Ack: ack}
		if keys != nil {
			w.iov = append(w.iov, w.seal.reserve(keys.send, &h, nil, 0))
		} else {
			hb := w.hdrs[:frameHeaderSize]
			h.encode(hb)
			w.iov = append(w.iov, hb)
		}
		n = 1
		work = true
	}
	if n > 0 {
		c.ackSent.Store(ack)
	}
	return work, reset, true
}

// sendNak finishes a partly written batch and tells the peer which of its
// requests failed, then half-closes; the reader is draining until the peer
// closes in turn. Called by the writer goroutine as it exits.
func (c *conn) sendNak() {
	c.mu.Lock()
	f, pending := c.fail1, c.nakPending
	c.nakPending = false
	c.writing = true // for good
	c.mu.Unlock()
	if !pending || c.dropped.Load() {
		return
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(drainTimeout))
	c.flushBatch()
	var hb [sealedHdrSize]byte
	h := frameHeader{Type: frameNak, Status: uint8(f.nakSt), Ack: f.nakSeq}
	out := hb[:frameHeaderSize]
	if c.sealOut.Load() {
		s := &c.wr.seal
		s.seq++
		sealHeader(c.sealk.Load().send, &s.nonce, s.seq, &h, hb[:])
		out = hb[:]
	} else {
		h.encode(out)
	}
	if _, err := c.nc.Write(out); err == nil {
		_ = c.nc.CloseWrite()
	}
}
