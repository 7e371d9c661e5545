package soft

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/lwiofs/lwiofs/internal/readturn"
	"github.com/lwiofs/lwiofs/transport"
)

// readBufSize is the reader's buffer for headers and small payloads.
// Payload bytes that arrived in the same read as their header are copied
// from it once; the rest of a payload is read from the socket straight
// into its destination (the target region or the posted receive buffer).
const readBufSize = 32 << 10

type frameReader struct {
	nc   net.Conn
	buf  []byte
	r, w int
	// exact: the last payload was large, so the next frame probably is
	// too: read only its header, then its payload straight into place,
	// rather than a buffer-full of it into the buffer.
	exact bool
	// idle is called when the socket has nothing more to read, before
	// the reader blocks: the moment to acknowledge.
	idle func()
	sys  sysReader
	intr *readturn.Intr // set while an application goroutine waits for a header
	// inSeq counts the sealed frames read (their nonces); nonce is room
	// for one, so opening a frame allocates nothing.
	inSeq uint64
	nonce [sealNonceSize]byte
}

// largePayload is the payload size from which the reader expects more of
// the same (see frameReader.exact).
const largePayload = 16 << 10

func (rd *frameReader) init(nc sock, idle func()) {
	rd.nc = nc
	rd.buf = make([]byte, readBufSize)
	rd.idle = idle
	rd.sys.init(nc)
}

func (rd *frameReader) buffered() int { return rd.w - rd.r }

// fill makes sure n bytes are buffered.
func (rd *frameReader) fill(n int) error {
	if rd.w-rd.r >= n {
		return nil
	}
	if rd.r > 0 {
		rd.w = copy(rd.buf, rd.buf[rd.r:rd.w])
		rd.r = 0
	}
	end := len(rd.buf)
	if rd.exact {
		end = n
	}
	for rd.w < n {
		// Try without blocking first: if the socket is empty, this is
		// the time to acknowledge what was placed, then block.
		m, err := rd.sys.tryRead(rd.buf[rd.w:end])
		if errWouldBlock(err) {
			if rd.idle != nil {
				rd.idle()
			}
			if rd.intr != nil && !rd.intr.Enter() {
				return errInterrupted
			}
			m, err = rd.sys.read(rd.buf[rd.w:end])
			if rd.intr != nil && rd.intr.Leave() {
				rd.w += m
				if rd.w >= n {
					return nil
				}
				return errInterrupted
			}
		}
		rd.w += m
		if err != nil && rd.w < n {
			if errors.Is(err, io.EOF) && rd.w > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// readInto places len(dst) payload bytes.
func (rd *frameReader) readInto(dst []byte) error {
	rd.exact = len(dst) >= largePayload
	n := copy(dst, rd.buf[rd.r:rd.w])
	rd.r += n
	if n == len(dst) {
		return nil
	}
	var err error
	for rest := dst[n:]; len(rest) > 0 && err == nil; {
		var m int
		m, err = rd.sys.read(rest)
		rest = rest[m:]
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

func (rd *frameReader) discard(n int) error {
	for n > 0 {
		if rd.r == rd.w {
			if err := rd.fill(1); err != nil {
				return err
			}
		}
		m := min(n, rd.w-rd.r)
		rd.r += m
		n -= m
	}
	return nil
}

// stepResult is what one step of the receive engine came to.
type stepResult uint8

const (
	stepOK          stepResult = iota // a frame was carried out
	stepDone                          // the connection is in error
	stepHandoff                       // app: a request needs the reader goroutine (c.pend)
	stepInterrupted                   // app: the wait for a header was interrupted
)

// step carries out one frame from the socket, or the request left in
// c.pend; the caller holds c.rdMu. app says the caller is an application
// goroutine in CQ.Wait: its wait for a header can be interrupted, and it
// never waits for a receive (receiver-not-ready) but leaves that request
// to the reader goroutine.
func (c *conn) step(app bool) stepResult {
	var h frameHeader
	if c.pendValid {
		h, c.pendValid = c.pend, false
	} else {
		if app {
			c.rd.intr = c.intr
		}
		err := c.rd.fill(frameHeaderSize)
		if err == nil && frameType(c.rd.buf[c.rd.r]) == frameSealed {
			err = c.rd.fill(sealedHdrSize)
		}
		c.rd.intr = nil
		if err != nil {
			if errors.Is(err, errInterrupted) {
				return stepInterrupted
			}
			c.readFailed(err)
			return stepDone
		}
		if f, ok := c.readHeader(&h); !ok {
			c.fail(f)
			return stepDone
		}
		if !c.dropped.Load() {
			if !c.onAck(h.Ack) {
				return stepDone
			}
			switch h.Type {
			case frameAck:
				return stepOK
			case frameNak:
				c.onNak(&h)
				return stepDone
			}
			if reset, drop := c.countOp(); reset {
				c.tripReset()
				return stepDone
			} else if drop {
				c.tripDrop()
			}
		}
	}
	if app && c.rd.buffered() < h.wireLen() {
		// A payload still on its way: its read could not be interrupted
		// if the peer stalled, so it is the reader goroutine's.
		c.pend, c.pendValid = h, true
		return stepHandoff
	}
	if c.dropped.Load() { // Faults.DropAfterOps: lost on the wire
		if err := c.rd.discard(h.wireLen()); err != nil {
			c.readFailed(err)
			return stepDone
		}
		return stepOK
	}
	ok, completed, handoff := c.onRequest(&h, app)
	if handoff {
		c.pend, c.pendValid = h, true
		return stepHandoff
	}
	if !ok {
		return stepDone
	}
	c.noteRequest(completed, int(h.Length))
	return stepOK
}

// payloadFailed fails the connection over a payload that could not be
// read or did not authenticate.
func (c *conn) payloadFailed(err error) {
	var bad errSealedPayload
	if errors.As(err, &bad) {
		c.fail(failure{why: whySealRefused, err: err})
		return
	}
	c.readFailed(err)
}

func (c *conn) readFailed(err error) {
	why := "peer disconnected"
	if !errors.Is(err, io.EOF) {
		why = "receive failed"
	}
	c.fail(failure{why: why, err: err})
}

// onAck completes the send work requests the peer has acknowledged.
func (c *conn) onAck(ack uint32) bool {
	c.mu.Lock()
	n := uint64(ack - uint32(c.sqHead))
	if n == 0 {
		c.mu.Unlock()
		return true
	}
	if n > c.sqTx-c.sqHead {
		c.mu.Unlock()
		c.fail(failure{why: "protocol violation", err: fmt.Errorf("peer acknowledges %d requests, %d are in flight", n, c.sqTx-c.sqHead)})
		return false
	}
	out := c.scratch[:0]
	for ; n > 0; n-- {
		e := &c.sq[c.sqHead%uint64(len(c.sq))]
		out = append(out, transport.Completion{ID: e.id, Op: e.op, Conn: c})
		clear(e.segs)
		c.sqHead++
	}
	if c.timer != nil {
		c.progressAt = time.Now()
	}
	c.mu.Unlock()
	c.sendCQ.push(c.delay, out...)
	c.scratch = out[:0]
	return true
}

// onNak fails the request the peer refused and, with it, the connection.
func (c *conn) onNak(h *frameHeader) {
	st := transport.Status(h.Status)
	switch st {
	case transport.StatusRemoteAccess, transport.StatusRemoteInvalidRequest, transport.StatusRNRRetryExceeded:
	default:
		c.fail(failure{why: "protocol violation", err: fmt.Errorf("NAK with status %v", st)})
		return
	}
	c.mu.Lock()
	seq, inFlight := c.sqHead, c.sqHead != c.sqTx
	c.mu.Unlock()
	if !inFlight {
		c.fail(failure{why: "protocol violation", err: errors.New("NAK with no request in flight")})
		return
	}
	c.fail(failure{why: "peer refused a request", err: &transport.CompletionError{Op: transport.OpSend, Status: st},
		seq: seq, status: st, hasSeq: true})
}

// refuse fails the connection because the peer's request number placed
// cannot be carried out, and tells the peer with a NAK.
// The reader goroutine then drains the socket (drainAfterNak).
func (c *conn) refuse(st transport.Status, err error) {
	c.fail(failure{why: "refused a peer request", err: err, nak: true, nakSeq: c.placed.Load(), nakSt: st})
}

// Acknowledgement policy. ACKs are cumulative and ride on any frame going
// the other way; a separate ACK is sent:
//   - for plain RDMA WRITEs (nobody at this end hears of them) and large
//     requests, when the socket has nothing more to read (onIdle), so a
//     burst gets one ACK;
//   - for a SEND or WRITE WITH IMMEDIATE, which produce a completion the
//     application usually answers, only if no answer carries it first: when
//     the application finds its CQ empty (flushAck) or after ackFallback;
//   - at once, idle or not, when ackAtOnceCount requests or ackAtOnceBytes
//     are owed, so a continuous stream keeps the initiator's queue moving.
const (
	ackAtOnceSize  = 64 << 10
	ackAtOnceCount = 16
	ackAtOnceBytes = 1 << 20
)

// noteRequest applies the acknowledgement policy after a request is placed.
func (c *conn) noteRequest(completed bool, n int) {
	if !completed || n >= ackAtOnceSize {
		c.ackUrgent = true
	}
	c.owedBytes += n
	if c.placed.Load()-c.ackSent.Load() >= ackAtOnceCount || c.owedBytes >= ackAtOnceBytes {
		c.ackUrgent, c.owedBytes = false, 0
		c.transmit()
	}
}

// onIdle runs when the reader finds the socket empty.
func (c *conn) onIdle() {
	if c.placed.Load() == c.ackSent.Load() {
		c.ackUrgent, c.owedBytes = false, 0
		return
	}
	if c.ackUrgent {
		c.ackUrgent, c.owedBytes = false, 0
		c.transmit()
		return
	}
	c.deferAck()
}

// onRequest carries out one SEND or RDMA WRITE from the peer. ok is
// false when the connection is done; completed says a receive completed;
// handoff (app only) that the request needs a receive that is not posted
// yet, and nothing of it was done.
func (c *conn) onRequest(h *frameHeader, app bool) (ok, completed, handoff bool) {
	n := int(h.Length)
	if n > c.limits.MaxMessageSize {
		c.refuse(transport.StatusRemoteInvalidRequest, fmt.Errorf("%d-byte request exceeds MaxMessageSize %d", n, c.limits.MaxMessageSize))
		return false, false, false
	}
	imm, shm := h.Flags&flagImm != 0, h.Flags&flagShm != 0
	if shm && (h.Type == frameWrite && !c.shmOut || h.Type == frameSend && c.peer == nil) {
		c.fail(failure{why: "protocol violation", err: fmt.Errorf("shared-memory %v on a connection that shares none", h.Type)})
		return false, false, false
	}
	var dst []byte
	if h.Type == frameWrite && n > 0 && !shm { // shm: the peer copied it in already
		var ok bool
		if dst, ok = c.p.pd.target(h.RKey, h.Addr, n); !ok {
			c.refuse(transport.StatusRemoteAccess, fmt.Errorf("RDMA WRITE of %d bytes to %#x with handle %#x is outside every region open to remote write", n, h.Addr, h.RKey))
			return false, false, false
		}
	}
	if h.Type == frameWrite && !imm {
		if err := c.readPayload(h, dst); err != nil {
			c.payloadFailed(err)
			return false, false, false
		}
		c.placed.Add(1)
		return true, false, false
	}
	// SEND and WRITE WITH IMMEDIATE consume a receive.
	wr, ok := c.tryTakeRecv()
	if !ok && app {
		return true, false, true // the RNR wait is the reader goroutine's
	}
	if !ok {
		wr, ok = c.takeRecv()
	}
	if !ok {
		select {
		case <-c.closing:
		default:
			c.refuse(transport.StatusRNRRetryExceeded, fmt.Errorf("no receive posted within %v", c.peerRNR))
		}
		return false, false, false
	}
	comp := transport.Completion{ID: wr.ID, Op: transport.OpRecv, Imm: h.Imm, HasImm: imm, Conn: c}
	if h.Type == frameSend {
		buf, err := c.p.pd.local(wr.Buf)
		if err != nil {
			comp.Status = transport.StatusLocalProtection
			c.recvCQ.push(c.delay, comp)
			c.refuse(transport.StatusRemoteInvalidRequest, err)
			return false, false, false
		}
		if n > len(buf) {
			comp.Status = transport.StatusLocalLength
			c.recvCQ.push(c.delay, comp)
			c.refuse(transport.StatusRemoteInvalidRequest, fmt.Errorf("%d-byte SEND into a %d-byte receive", n, len(buf)))
			return false, false, false
		}
		dst, comp.Len = buf[:n], n
	}
	lent, err := c.placeSend(h, dst)
	if err != nil {
		comp.Status = transport.StatusFlushed
		c.recvCQ.push(c.delay, comp)
		var bad shmRefError
		if errors.As(err, &bad) {
			c.refuse(transport.StatusRemoteInvalidRequest, err)
		} else {
			c.payloadFailed(err)
		}
		return false, false, false
	}
	if lent.Length > 0 {
		comp.Len -= lent.Length
		comp.Lent = lent
	}
	c.recvCQ.push(c.delay, comp)
	c.placed.Add(1)
	return true, true, false
}

// placeSend places the payload of a SEND or WRITE WITH IMMEDIATE: from
// the socket, or, for a SEND by reference, from the peer's arena. A WRITE
// WITH IMMEDIATE the peer copied in itself has nothing to place. lent is
// a SEND's tail left in the peer's arena (shmlend.go).
func (c *conn) placeSend(h *frameHeader, dst []byte) (lent transport.Lent, err error) {
	if h.Flags&flagShm == 0 {
		return lent, c.readPayload(h, dst)
	}
	if h.Type == frameSend {
		return c.readRefs(h, dst)
	}
	return lent, nil
}

// rnrPeerCheck is how often a reader waiting for a receive checks that the
// peer is still there.
const rnrPeerCheck = 10 * time.Millisecond

// tryTakeRecv pops the next posted receive, from the connection's own
// queue or its shared one, without waiting.
func (c *conn) tryTakeRecv() (transport.RecvWR, bool) {
	if c.srq != nil {
		return c.srq.tryTake()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rqHead == c.rqTail {
		return transport.RecvWR{}, false
	}
	i := c.rqHead % uint64(len(c.rq))
	wr := c.rq[i]
	c.rq[i] = transport.RecvWR{}
	c.rqHead++
	return wr, true
}

// takeRecv pops the next posted receive, waiting up to the peer's RNR
// timeout for one; false if none came or the connection failed.
func (c *conn) takeRecv() (transport.RecvWR, bool) {
	var timer *time.Timer
	var check *time.Ticker
	for {
		var posted <-chan struct{}
		if c.srq != nil {
			wr, ok, ch := c.srq.take()
			if ok {
				if timer != nil {
					timer.Stop()
				}
				return wr, true
			}
			posted = ch
		} else if wr, ok := c.tryTakeRecv(); ok {
			if timer != nil {
				timer.Stop()
			}
			return wr, true
		} else {
			posted = c.recvKick
		}
		if timer == nil {
			// Receiver not ready: the peer retries for its RNR timeout.
			// Acknowledge what is placed so far while we wait.
			c.flushAck()
			timer = time.NewTimer(c.peerRNR)
			check = time.NewTicker(rnrPeerCheck)
			defer check.Stop()
		}
		ok, gone := c.awaitRecv(posted, timer, check)
		if c.srq != nil {
			c.srq.unwait()
		}
		if gone {
			c.fail(failure{why: "peer disconnected"})
		}
		if !ok {
			timer.Stop()
			return transport.RecvWR{}, false
		}
	}
}

// awaitRecv waits for a receive to be posted (ok), the RNR timer, the
// connection's end, or the peer's disconnect (gone).
func (c *conn) awaitRecv(posted <-chan struct{}, timer *time.Timer, check *time.Ticker) (ok, gone bool) {
	for {
		select {
		case <-posted:
			return true, false
		case <-timer.C:
			return false, false
		case <-check.C:
			// A NIC hears of a disconnect (rdma_cm) even while a
			// SEND waits; this reader is not reading the socket.
			if c.wr.sys.peerClosed() {
				return false, true
			}
		case <-c.closing:
			return false, false
		}
	}
}
