package soft

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/enum"
	"github.com/lwiofs/lwiofs/internal/readturn"
	"github.com/lwiofs/lwiofs/transport"
)

// state is where a connection is in its life. Transitions happen only in
// fail (open → failing) and finish (failing → closed).
type state uint8

const (
	// stateOpen: work is carried.
	stateOpen state = iota
	// stateFailing: the queue pair is in error; the reader and writer are
	// winding down (a NAK may still be sent, the socket drained).
	stateFailing
	// stateClosed: both goroutines are gone, every work request has
	// completed and the completion queue is closed.
	stateClosed
)

var stateNames = [...]string{stateOpen: "open", stateFailing: "failing", stateClosed: "closed"}

func (s state) String() string { return enum.Name(stateNames[:], s, "state") }

// drainTimeout bounds how long a side that sent a NAK keeps reading (and
// discarding) so the NAK is not lost to a TCP reset, and how long its final
// writes may block.
const drainTimeout = 2 * time.Second

// sendEntry is a send work request from Post until its completion.
type sendEntry struct {
	id     uint64
	op     transport.Op
	segs   []transport.Segment // copied from the WR; the slice is reused
	length int
	raddr  uint64
	rkey   uint32
	imm    uint32
	hasImm bool
	lend   bool // SendWR.Lend, on a connection without faults
}

// failure describes why a connection goes to error.
type failure struct {
	why    string
	err    error
	seq    uint64           // with hasSeq: the send WR that gets status
	status transport.Status // instead of StatusFlushed
	hasSeq bool
	nak    bool   // tell the peer its request nakSeq failed with nakSt,
	nakSeq uint32 // then drain the socket
	nakSt  transport.Status
	reset  bool // abort the TCP connection (RST); a unix socket just closes
}

// conn is a softrdma queue pair over one stream socket (TCP, or the
// same-host unix socket its handshake moved it to: local.go) or two pipes
// passed over that socket (local_pipe.go). A reader
// goroutine places incoming data and generates every completion. Post (and
// the reader, for acknowledgements) transmit from the calling goroutine
// with one non-blocking writev; a writer goroutine finishes what the socket
// did not take at once, and sends the NAK when the connection fails.
type conn struct {
	p       *Provider
	nc      sock // *net.TCPConn or, on the same host, *net.UnixConn (local.go)
	carrier string
	log     logrus.FieldLogger
	limits  transport.Limits
	peerRNR time.Duration // how long the peer lets its SENDs wait for our receives
	faults  *Faults       // nil unless this connection is faulted
	delay   time.Duration // Faults.DelayCompletions
	local   string
	remote  string
	// Shared memory (shm.go): shmOut, on a dialer, says the listener
	// mapped its arena (its large SENDs go by reference, the listener's
	// WRITEs arrive as notices); peer, on a listener, is that mapping.
	shmOut bool
	// shmLend: shmOut, and the listener takes lent SENDs (shmlend.go);
	// takeLent: a listener whose user takes them (Config.TakeLent).
	shmLend, takeLent bool
	peer              *peerArena
	// fillTok is the token of this connection's filled WRITEs (shmfill.go).
	fillTok placedRegion

	// Where completions go and receives come from (Config.Queues): own is
	// the connection's own completion queue, nil when both of its queues
	// report to shared ones; srq is nil when it has its own receive queue.
	own, sendCQ, recvCQ *cq
	srq                 *srq
	finished            chan struct{} // closed when every completion is delivered

	kick     chan struct{} // wakes the writer (one slot)
	recvKick chan struct{} // wakes a reader waiting for a receive (one slot)
	closing  chan struct{} // closed when the connection leaves stateOpen

	mu sync.Mutex
	st state
	// The send queue is a ring of SendQueueDepth entries; counters only
	// grow: [sqHead, sqTx) are transmitted and await the peer's
	// acknowledgement, [sqTx, sqTail) await transmission.
	sq                   []sendEntry
	sqHead, sqTx, sqTail uint64
	rq                   []transport.RecvWR
	rqHead, rqTail       uint64
	fail1                failure // the first failure; valid once st != stateOpen
	nakPending           bool
	writing              bool      // a goroutine owns the socket's write side (c.wr)
	handoff              bool      // the owner left a partial batch to the writer goroutine
	progressAt           time.Time // last acknowledgement progress (TransportTimeout)
	timer                *time.Timer

	placed   atomic.Uint32 // peer requests placed here: the Ack we owe
	ackSent  atomic.Uint32 // the last Ack sent (on any frame)
	ops      atomic.Int64  // operations carried, for Faults
	dropped  atomic.Bool   // Faults.DropAfterOps tripped: a black hole
	ackArmed atomic.Bool   // ackTimer is running
	ackMark  atomic.Uint32 // placed when ackTimer was armed: what it must see acknowledged
	ackTimer *time.Timer   // the fallback for a deferred acknowledgement
	running  atomic.Int32  // reader and writer still running

	rdMu        sync.Mutex    // the read side: held by whoever runs the receive engine
	pend        frameHeader   // a request an application goroutine left to the reader goroutine
	pendValid   bool          //
	bgWake      chan struct{} // wakes the reader goroutine stepped aside (one slot)
	lastAppRead atomic.Int64  // unix ns an application goroutine last read
	intr        *readturn.Intr
	hooks       atomic.Pointer[testHooks] // nil except in tests that force an interleaving
	sealk       atomic.Pointer[sealKeys]  // set once by Seal
	sealOut     atomic.Bool               // frames gathered from now on are sealed (Lead: set under c.mu)
	rd          frameReader
	ackUrgent   bool // reader-owned: an ACK is owed that should not wait
	owedBytes   int  // reader-owned: payload placed since the reader last acknowledged
	wr          frameWriter
	scratch     []transport.Completion // reader's batch of send completions
}

var _ transport.Conn = (*conn)(nil)

// newConn starts a connection over nc with the queues chosen for it; it
// fails only when a shared queue was closed meanwhile.
// nc is the socket it runs on, tc the TCP connection it was made on (the
// same socket unless the connection moved to a unix one); tc's addresses
// name the connection.
func newConn(p *Provider, nc sock, tc *net.TCPConn, cfg transport.Config, peer hello, faults *Faults, qs queues, shm shmEnds) (*conn, error) {
	cfg = cfg.WithDefaults()
	maxMsg := cfg.MaxMessageSize
	if int64(peer.MaxMessageSize) < int64(maxMsg) {
		maxMsg = int(peer.MaxMessageSize)
	}
	c := &conn{
		p:       p,
		nc:      nc,
		peerRNR: peer.RNRTimeout,
		faults:  faults,
		carrier: CarrierTCP,
		local:   tc.LocalAddr().String(),
		remote:  tc.RemoteAddr().String(),
		limits: transport.Limits{
			SendQueueDepth: cfg.SendQueueDepth,
			RecvQueueDepth: cfg.RecvQueueDepth,
			MaxSGE:         cfg.MaxSGE,
			MaxMessageSize: maxMsg,
		},
		kick:     make(chan struct{}, 1),
		recvKick: make(chan struct{}, 1),
		closing:  make(chan struct{}),
		bgWake:   make(chan struct{}, 1),
		finished: make(chan struct{}),
		sq:       make([]sendEntry, cfg.SendQueueDepth),
		sendCQ:   qs.send,
		recvCQ:   qs.recv,
		srq:      qs.srq,
	}
	switch nc.(type) {
	case *net.UnixConn:
		c.carrier = CarrierUnix
		c.shmOut, c.shmLend, c.peer = shm.out, shm.lend, shm.peer
		c.takeLent = shm.peer != nil && cfg.TakeLent
		if c.shmOut || c.peer != nil {
			c.carrier = CarrierShm
		}
	case *pipeSock:
		c.carrier = CarrierPipe
		c.shmOut, c.shmLend, c.peer = shm.out, shm.lend, shm.peer
		c.takeLent = shm.peer != nil && cfg.TakeLent
		if c.shmOut || c.peer != nil {
			c.carrier = CarrierPipeShm
		}
	}
	if faults != nil {
		c.delay = faults.DelayCompletions
	}
	if c.srq == nil {
		c.rq = make([]transport.RecvWR, cfg.RecvQueueDepth)
	}
	if c.sendCQ == nil || c.recvCQ == nil {
		c.own = newCQ(p.pd, c)
		if c.delay == 0 {
			c.own.read = c.appRead
		}
		if c.sendCQ == nil {
			c.sendCQ = c.own
		}
		if c.recvCQ == nil {
			c.recvCQ = c.sendCQ
		}
	}
	if err := c.attach(); err != nil {
		return nil, err
	}
	c.log = p.log.WithFields(logrus.Fields{"provider": Name, "conn": c.local + "->" + c.remote, "carrier": c.carrier})
	c.rd.init(nc, c.onIdle)
	c.wr.init(nc)
	if c.shmOut {
		c.wr.shm.desc = make([]byte, 0, maxBatch*cfg.MaxSGE*shmEntrySize)
	}
	c.ackTimer = time.AfterFunc(time.Hour, c.ackTimeout)
	c.ackTimer.Stop()
	c.intr = readturn.New(nc)
	c.running.Store(2)
	if t := p.opts.TransportTimeout; t > 0 {
		c.timer = time.AfterFunc(checkPeriod(t), c.checkProgress)
	}
	go c.readLoop()
	go c.writeLoop()
	c.log.Debug("connected")
	return c, nil
}

// attach makes the connection a user of its shared queues; detach, when
// it has delivered its last completion, lets them close.
func (c *conn) attach() error {
	var done []*cq
	for _, q := range []*cq{c.sendCQ, c.recvCQ} {
		if q == c.own || (len(done) > 0 && done[0] == q) {
			continue
		}
		if err := q.attach(c); err != nil {
			for _, d := range done {
				d.detach(c)
			}
			return err
		}
		done = append(done, q)
	}
	if c.srq != nil {
		if err := c.srq.attach(); err != nil {
			for _, d := range done {
				d.detach(c)
			}
			return err
		}
	}
	return nil
}

func (c *conn) detach() {
	for _, q := range []*cq{c.sendCQ, c.recvCQ} {
		if q != c.own {
			q.detach(c)
		}
	}
	if c.srq != nil {
		c.srq.detach()
	}
}

func (c *conn) CQ() transport.CQ         { return c.sendCQ }
func (c *conn) Domain() transport.Domain { return c.p.pd }
func (c *conn) Limits() transport.Limits { return c.limits }
func (c *conn) LocalAddr() string        { return c.local }
func (c *conn) RemoteAddr() string       { return c.remote }
func (c *conn) Provider() string         { return Name }
func (c *conn) Carrier() string          { return c.carrier }
func (c *conn) String() string           { return Name + " " + c.local + "->" + c.remote }
func (c *conn) wakeWriter()              { signal(c.kick) }
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
func checkPeriod(t time.Duration) time.Duration { return max(t/4, time.Millisecond) }

// Post queues send work requests. Malformed requests (bad op, too many
// segments, too long, memory that is not a live region of this domain)
// fail the whole call before anything is queued.
func (c *conn) Post(wrs ...transport.SendWR) error {
	for i := range wrs {
		if err := c.check(&wrs[i]); err != nil {
			return err
		}
	}
	c.mu.Lock()
	if err := c.roomLocked(c.sqHead, c.sqTail, len(c.sq), len(wrs)); err != nil {
		c.mu.Unlock()
		return err
	}
	for i := range wrs {
		wr := &wrs[i]
		e := &c.sq[c.sqTail%uint64(len(c.sq))]
		e.id, e.op, e.raddr, e.rkey, e.imm, e.hasImm = wr.ID, wr.Op, wr.RemoteAddr, wr.RKey, wr.Imm, wr.HasImm
		e.lend = wr.Lend && wr.Op == transport.OpSend && c.shmLend && c.faults == nil
		e.segs = append(e.segs[:0], wr.SGL...)
		e.length = 0
		for _, s := range wr.SGL {
			e.length += s.Length
		}
		c.sqTail++
	}
	c.mu.Unlock()
	c.transmit()
	return nil
}

// roomLocked says whether n more work requests may be queued on a ring of
// size entries holding those from head up to tail: ErrClosed unless the
// connection is open, else ErrQueueFull if they do not fit. c.mu is held.
func (c *conn) roomLocked(head, tail uint64, size, n int) error {
	if c.st != stateOpen {
		return transport.ErrClosed
	}
	if !fits(head, tail, size, n) {
		return transport.ErrQueueFull
	}
	return nil
}

// fits reports whether a ring of size entries holding those from head up
// to tail has room for n more.
func fits(head, tail uint64, size, n int) bool { return tail-head+uint64(n) <= uint64(size) }

// localRecvs checks that every receive's buffer is memory of a live region
// of this domain, before any is queued.
func (d *domain) localRecvs(wrs []transport.RecvWR) error {
	for i := range wrs {
		if _, err := d.local(wrs[i].Buf); err != nil {
			return err
		}
	}
	return nil
}

func (c *conn) check(wr *transport.SendWR) error {
	if wr.Op != transport.OpSend && wr.Op != transport.OpWrite {
		return fmt.Errorf("softrdma: cannot post %v on the send queue", wr.Op)
	}
	if len(wr.SGL) > c.limits.MaxSGE {
		return fmt.Errorf("softrdma: %d segments, the connection allows %d", len(wr.SGL), c.limits.MaxSGE)
	}
	n := 0
	if placed, err := c.checkPlaced(wr); placed || err != nil {
		return err
	}
	for _, s := range wr.SGL {
		if _, err := c.p.pd.local(s); err != nil {
			return err
		}
		n += s.Length
	}
	if n > c.limits.MaxMessageSize {
		return fmt.Errorf("softrdma: %d-byte message, the connection allows %d", n, c.limits.MaxMessageSize)
	}
	return nil
}

// PostRecv queues receive buffers; they are consumed in order.
func (c *conn) PostRecv(wrs ...transport.RecvWR) error {
	if c.srq != nil {
		return errors.New("softrdma: the connection takes its receives from a shared receive queue")
	}
	if err := c.p.pd.localRecvs(wrs); err != nil {
		return err
	}
	c.mu.Lock()
	if err := c.roomLocked(c.rqHead, c.rqTail, len(c.rq), len(wrs)); err != nil {
		c.mu.Unlock()
		return err
	}
	for _, wr := range wrs {
		c.rq[c.rqTail%uint64(len(c.rq))] = wr
		c.rqTail++
	}
	c.mu.Unlock()
	signal(c.recvKick)
	return nil
}

// Close puts the connection in error and disconnects; every outstanding
// work request completes with StatusFlushed before it returns (at most
// closeWait later, when a NAK was being delivered). It does not wait for
// the peer.
func (c *conn) Close() error {
	c.fail(failure{why: "closed locally"})
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case <-c.finished:
	case <-t.C:
	}
	return nil
}

// closeWait bounds how long Close waits for the connection's goroutines to
// deliver the flushed completions: a NAK's drain takes drainTimeout.
const closeWait = drainTimeout + time.Second

// fail moves the connection to error once; later calls do nothing.
func (c *conn) fail(f failure) {
	c.mu.Lock()
	if c.st != stateOpen {
		c.mu.Unlock()
		return
	}
	c.st = stateFailing
	c.fail1 = f
	c.nakPending = f.nak
	c.mu.Unlock()
	close(c.closing)
	if c.timer != nil {
		c.timer.Stop()
	}
	log := c.log.WithField("why", f.why)
	if f.err != nil {
		log = log.WithError(f.err)
	}
	if f.hasSeq || f.nak || f.reset || f.why == whySealRefused {
		log.Warn("connection in error")
	} else {
		log.Debug("connection in error")
	}
	c.ackTimer.Stop()
	c.wakeWriter() // it exits, sending the NAK if one is due
	if f.nak {
		// Keep reading so our NAK is not destroyed by a reset, but no
		// longer than drainTimeout; the peer closes when it reads it.
		_ = c.nc.SetDeadline(time.Now().Add(drainTimeout))
		return
	}
	if tc, ok := c.nc.(*net.TCPConn); ok && f.reset {
		_ = tc.SetLinger(0)
	}
	_ = c.nc.Close()
}

// exit is called by the reader and the writer as they return; the last
// one completes everything still outstanding.
func (c *conn) exit() {
	if c.running.Add(-1) == 0 {
		c.finish()
	}
}

func (c *conn) finish() {
	_ = c.nc.Close()
	c.mu.Lock()
	f := c.fail1
	out := make([]transport.Completion, 0, (c.sqTail-c.sqHead)+(c.rqTail-c.rqHead))
	for ; c.sqHead != c.sqTail; c.sqHead++ {
		e := &c.sq[c.sqHead%uint64(len(c.sq))]
		st := transport.StatusFlushed
		if f.hasSeq && c.sqHead == f.seq {
			st = f.status
		}
		out = append(out, transport.Completion{ID: e.id, Op: e.op, Status: st, Conn: c})
		clear(e.segs)
	}
	c.sqTx = c.sqHead
	for ; c.rqHead != c.rqTail; c.rqHead++ {
		i := c.rqHead % uint64(len(c.rq))
		out = append(out, transport.Completion{ID: c.rq[i].ID, Op: transport.OpRecv, Status: transport.StatusFlushed, Conn: c})
		c.rq[i] = transport.RecvWR{}
	}
	c.st = stateClosed
	c.mu.Unlock()
	// Sends flush to the send CQ, the connection's own receives to the
	// receive CQ; receives in a shared receive queue stay for the others.
	ns := 0
	for ns < len(out) && out[ns].Op != transport.OpRecv {
		ns++
	}
	c.sendCQ.push(c.delay, out[:ns]...)
	c.recvCQ.push(c.delay, out[ns:]...)
	if c.own != nil {
		c.own.close()
	}
	c.detach()
	c.peer.unmapSoon()
	c.log.WithField("flushed", len(out)).Debug("disconnected")
	close(c.finished)
}

// checkProgress fails the connection when transmitted work has gone
// unacknowledged for TransportTimeout beyond the peer's receiver-not-ready
// wait, as a NIC's transport retry counter does.
func (c *conn) checkProgress() {
	limit := c.p.opts.TransportTimeout + c.p.opts.RNRTimeout
	c.mu.Lock()
	if c.st != stateOpen {
		c.mu.Unlock()
		return
	}
	stalled := c.sqHead != c.sqTx && time.Since(c.progressAt) > limit
	seq := c.sqHead
	c.mu.Unlock()
	if stalled {
		c.fail(failure{why: "transport retry exceeded", err: errors.New("no acknowledgement from the peer"),
			seq: seq, status: transport.StatusTransportError, hasSeq: true})
		return
	}
	c.timer.Reset(checkPeriod(c.p.opts.TransportTimeout))
}

// countOp counts one operation carried and reports whether a fault trips
// instead of carrying it.
func (c *conn) countOp() (reset, drop bool) {
	if c.faults == nil {
		return false, false
	}
	n := c.ops.Add(1)
	if f := c.faults.ResetAfterOps; f > 0 && n > int64(f) {
		return true, false
	}
	if f := c.faults.DropAfterOps; f > 0 && n > int64(f) {
		return false, true
	}
	return false, false
}

// tripDrop turns the connection into a black hole (Faults.DropAfterOps):
// nothing more is sent or placed, the socket stays open.
func (c *conn) tripDrop() {
	if !c.dropped.Swap(true) {
		c.log.WithField("ops", c.ops.Load()-1).Warn("fault injected: dropping all traffic")
	}
}

// ackFallback bounds how long an acknowledgement owed for a SEND or WRITE
// WITH IMMEDIATE waits for traffic to ride on (usually the reply the
// application posts) or for the application to go idle on its CQ: what
// was owed when the timer was armed goes within ackFallback, what was
// placed since within twice that.
const ackFallback = time.Millisecond

// flushAck sends the acknowledgement owed, if any; the CQ calls it when
// the application finds nothing more to reap.
func (c *conn) flushAck() {
	if c.placed.Load() != c.ackSent.Load() {
		c.transmit()
	}
}

func (c *conn) deferAck() {
	if !c.ackArmed.Swap(true) {
		c.ackMark.Store(c.placed.Load())
		c.ackTimer.Reset(ackFallback)
	}
}

// ackTimeout is ackTimer's end. If everything owed when it was armed has
// been acknowledged since (on the answers), what is owed now was placed
// after that, most likely a moment ago and with its answer on the way:
// it gets a fallback of its own rather than an ACK frame now. Sending it
// now would, in a request-response stream (a qd1 read, a second ago one
// in six round trips), wake the peer for a frame the next request
// carries anyway.
func (c *conn) ackTimeout() {
	sent, placed := c.ackSent.Load(), c.placed.Load()
	if placed != sent && int32(c.ackMark.Load()-sent) <= 0 {
		c.ackMark.Store(placed)
		c.ackTimer.Reset(ackFallback)
		return
	}
	c.ackArmed.Store(false)
	c.flushAck()
}

func (c *conn) tripReset() {
	c.fail(failure{why: "fault injected: reset", reset: true})
}

// testHooks let a test force an interleaving of the read side; every one
// may be nil.
type testHooks struct {
	afterStep   func() // an application goroutine's turn, after each step
	beforeTurn  func() // CQ.Wait, before it tries to take the socket
	afterUnlock func() // the reader goroutine, after a step, the socket released
}

// debugState describes the connection's queues and owners for a stalled
// test's report.
func (c *conn) debugState() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("%s: state %v, sq head %d tx %d tail %d, rq head %d tail %d, writing %v handoff %v, placed %d ackSent %d ackArmed %v, iov %d",
		c, c.st, c.sqHead, c.sqTx, c.sqTail, c.rqHead, c.rqTail, c.writing, c.handoff, c.placed.Load(), c.ackSent.Load(), c.ackArmed.Load(), len(c.wr.iov))
}
