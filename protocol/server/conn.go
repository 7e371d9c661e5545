package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/enum"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/transport"
)

var contextBackground = context.Background()

// connState is where a connection is in its life. Transitions happen in
// setState only.
type connState uint8

const (
	stateAuth    connState = iota // accepted; the first message must be AUTH
	stateOpen                     // authenticated; requests are served
	stateClosing                  // Server.Close: in-flight requests finish
	stateClosed                   // torn down; every request has completed or failed
)

var connStateNames = [...]string{"auth", "open", "closing", "closed"}

func (s connState) String() string { return enum.Name(connStateNames[:], s, "connState") }

// conn is one accepted RDMA connection.
type conn struct {
	s    *Server
	tc   transport.Conn
	fill transport.RemoteFiller // tc, when it can fill the client's memory in place
	lend transport.LentReader   // tc, when it reads lent WRITE data (lent.go; else the completion's Conn)
	// inPlace: tc shares the client's memory ("+shm"), so a READ is
	// read in place, a memcpy-speed pread: READs of any size may run
	// inline on the reaper (onRecv). Cleared when the connection seals
	// (startSeal): a sealed connection reads into the server's buffer
	// and encrypts, whatever its carrier's name says.
	inPlace atomic.Bool
	id      uint64
	log     logrus.FieldLogger
	ctx     context.Context // ends at teardown
	cancel  context.CancelFunc

	grant *protocol.CreditGrant
	sq    sendQueue
	data  *transport.BufferPool // read data, local access only
	slots slotTable

	mu         sync.Mutex
	state      connState
	err        error // why the connection ended
	sess       *session
	peerPage   int               // client's PageSize
	pool       *recvPool         // where its receives come from (recvpool.go)
	authing    bool              // counted in pool.authing: AUTH not yet received
	budget     int               // credits taken from the server-wide budget
	ioInflight int               // READ/WRITE/VEC requests not yet completed
	intr       *slot             // the pending INTERRUPT (FIG. 9A), at most one
	asm        protocol.Assembly // the fragmented write being received (reaper only)
	asmSlot    *slot             // its slot (reaper only)

	// requests counts the requests received; the balancer (budget.go)
	// compares it between sweeps to find idle connections.
	requests     atomic.Uint64
	answered     atomic.Bool // the AUTH response is posted (control.go)
	seenRequests uint64      // balancer only
	idleSweeps   int         // balancer only
	lowHints     int         // consecutive requests with a low Credits hint (reaper only)
	endAfter     int         // slot index+1 whose completion ends the connection (AUTH refused)
	reqs         sync.WaitGroup
	idle         chan struct{} // closing: signalled when nothing is outstanding

	// The reaper role (see reap): hand is epoch<<1 | 1 while the reaper
	// runs a request inline; stall hands the role to a new goroutine if
	// one inline run lasts a whole period (runInline, takeOver;
	// stallPeriod). inlineSeq counts inline runs; stallSeen is the run the
	// stall timer saw running at its last look; stallArmed: the timer is
	// set; stallTicks counts its ticks; tookOver is when it last took the
	// role over (since born; 0: never). reapEnd is closed by the reaper
	// that sees the CQ close. pend is the request the reaper runs inline
	// after its batch.
	hand       atomic.Uint64
	inlineSeq  atomic.Uint64
	stallSeen  atomic.Uint64
	stallArmed atomic.Bool
	stall      *time.Timer
	stallTicks atomic.Uint64
	tookOver   atomic.Int64
	born       time.Time
	reapEnd    chan struct{}
	pend       *slot

	rdma *atomic.Uint64 // the provider's RDMA bytes (stats.go)
}

// recvPad is where a receive starts in its region: the header then ends,
// and a WRITE's or FRAGMENT's data starts, on a page boundary.
const recvPad = 4096 - protocol.HeaderSize

// newConn makes the state of a connection accepted on a listener with
// chooser q (nil: not made by Server.Listen); s.mu is held.
func newConn(s *Server, tc transport.Conn, q *listenQueues) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	id := s.nextConn.Add(1)
	c := &conn{
		s:      s,
		tc:     tc,
		id:     id,
		ctx:    ctx,
		cancel: cancel,
		log: s.log.WithFields(logrus.Fields{
			"conn": id, "provider": tc.Provider(), "remote": tc.RemoteAddr(),
		}),
		data: transport.NewBufferPool(tc.Domain(), transport.AccessLocal, s.cfg.MaxRdmaWindowSize),
		pool: s.poolFor(tc, q),
	}
	c.fill, _ = tc.(transport.RemoteFiller)
	c.lend, _ = tc.(transport.LentReader)
	c.inPlace.Store(c.fill != nil && transport.SharedMemory(tc))
	c.rdma = s.ctr.rdma.Counter(tc.Provider())
	c.reapEnd = make(chan struct{})
	c.born = time.Now()
	c.stall = time.AfterFunc(time.Hour, c.takeOver)
	c.stall.Stop()
	c.sq.init(tc.Limits().SendQueueDepth)
	c.slots.init(c, tc.Domain())
	c.slots.data = c.data
	return c
}

func (c *conn) info() ConnInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	ci := ConnInfo{Provider: c.tc.Provider(), LocalAddr: c.tc.LocalAddr(), RemoteAddr: c.tc.RemoteAddr()}
	if c.sess != nil {
		ci.SessionID = c.sess.id
	}
	if c.state == stateOpen && c.grant != nil {
		ci.Credits = c.grant.Granted()
	}
	return ci
}

// run serves the connection until it ends, then fails what is left and
// frees its memory.
func (c *conn) run() {
	// recv: "shared" when its receives come from its domain's shared
	// receive queue, "own" when from a queue of its own (recvpool.go).
	c.log.WithField("recv", c.pool.kind()).Info("lwio: connection accepted")
	if err := c.postAuthRecv(); err != nil {
		c.fail(err)
	} else {
		timer := time.AfterFunc(c.s.cfg.AuthTimeout, func() {
			c.mu.Lock()
			waiting := c.state == stateAuth
			c.mu.Unlock()
			if waiting {
				c.fail(fmt.Errorf("no AUTH within %v", c.s.cfg.AuthTimeout))
			}
		})
		c.reap()
		<-c.reapEnd // the role may have moved to another goroutine
		timer.Stop()
	}
	c.teardown()
}

// postAuthRecv posts the receive of the connection's AUTH: one counted in
// its pool until the AUTH arrives (endAuth).
func (c *conn) postAuthRecv() error {
	c.mu.Lock()
	c.authing = true
	c.mu.Unlock()
	return c.pool.authStart()
}

// endAuth stops counting the connection's AUTH receive in its pool: the
// AUTH arrived, or the connection is gone.
func (c *conn) endAuth() {
	c.mu.Lock()
	was := c.authing
	c.authing = false
	c.mu.Unlock()
	if was {
		c.pool.authEnd()
	}
}

// fail ends the connection with err (logged once). Every outstanding work
// request then completes flushed and the reaper returns.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil || c.state == stateClosed {
		c.mu.Unlock()
		return
	}
	c.err = err
	c.mu.Unlock()
	var fe *protocol.FieldError
	switch {
	case errors.Is(err, transport.ErrClosed):
		c.log.Info("lwio: connection closed by the peer")
	case errors.As(err, &fe):
		// A broken wire rule (docs/wire.md, "Error scope"): the line names
		// the message and field, e.g. rule=READ.Marker.
		c.log.WithError(err).WithField("rule", fe.Msg+"."+fe.Field).Warn("lwio: malformed message, connection ends")
	default:
		c.log.WithError(err).Warn("lwio: connection ends")
	}
	c.cancel()
	c.sq.close()
	c.tc.Close()
}

// reap is the connection's completion loop: receives are dispatched to
// request goroutines, send completions return send-queue slots and finish
// the request they end. One goroutine at a time holds the role. The last
// I/O request of a batch may run inline, on the reaper, saving the hand-off
// to a goroutine (see onRecv); if it outlasts the stall timer's period (a
// slow disk) a new goroutine takes the role over, so the connection is
// never stalled for longer, and this one returns once its request is done.
func (c *conn) reap() {
	var wcs [64]transport.Completion
	cq := c.tc.CQ()
	for {
		n, err := cq.Wait(context.Background(), wcs[:])
		if err != nil {
			if !errors.Is(err, transport.ErrClosed) {
				c.fail(err)
			}
			c.fail(transport.ErrClosed)
			close(c.reapEnd)
			return
		}
		lastRecv := -1
		for i := range wcs[:n] {
			if wcs[i].Op == transport.OpRecv {
				lastRecv = i
			}
		}
		sent := 0
		for i := range wcs[:n] {
			wc := &wcs[i]
			switch wc.Op {
			case transport.OpRecv:
				c.onRecv(wc, i == lastRecv)
			default:
				sent++
				c.onSent(wc)
			}
		}
		if sent > 0 {
			c.sq.release(sent)
		}
		if sl := c.pend; sl != nil {
			c.pend = nil
			if !c.runInline(sl) {
				return // the role moved on while this one did the disk work
			}
		}
	}
}

// The stall timer's period (stallPeriod): about how long an inline
// request may hold the reaper before the role moves to a new goroutine.
//
// stallAfter is the period on a connection whose inline runs have stalled
// lately (within stallMemory: a slow disk, cache misses): a stalled run
// holds up the requests behind it for one to two periods. stallQuiet is
// the period otherwise, when every inline run is quick (data in memory):
// the timer ticks all the while inline runs go on, and each tick is a
// thread wake-up in a server that is otherwise asleep between requests —
// at 100 µs, 0.73 ticks per 4 KiB qd1 request, and the 4 KiB qd1 p50 was
// 3-6 µs higher, lwio-server 0.6 context switches per request more, than
// with a period twenty times as long (issue 16). A connection's first
// stall after a quiet spell is taken over after one to two stallQuiet
// periods; from then on it is watched with stallAfter again.
const (
	stallAfter  = 100 * time.Microsecond
	stallQuiet  = time.Millisecond
	stallMemory = 100 * time.Millisecond
)

// stallPeriod is the stall timer's period now: stallAfter if the timer
// took the reaper role over within the last stallMemory, else stallQuiet.
func (c *conn) stallPeriod() time.Duration {
	if t := c.tookOver.Load(); t != 0 && time.Since(c.born)-time.Duration(t) < stallMemory {
		return stallAfter
	}
	return stallQuiet
}

// inlineMax is the largest request run inline on the reaper.
const inlineMax = 128 << 10

// runInline runs an I/O request on the reaper; false if the role was
// taken over meanwhile.
//
// The stall timer is not set for each inline run: setting a Go timer due
// before every other one wakes the runtime's poller thread
// (runtime.wakeNetPoller), a thread wake-up per 4 KiB request (issue 16).
// It is set by the first inline run after an idle spell and then ticks
// every stallPeriod while inline runs go on (takeOver), so a run that
// outlasts the period is taken over after between one and two periods.
func (c *conn) runInline(sl *slot) bool {
	v := c.hand.Load() &^ 1
	seq := c.inlineSeq.Add(1)
	c.hand.Store(v | 1)
	if c.stallArmed.CompareAndSwap(false, true) {
		c.stallSeen.Store(seq)
		c.stall.Reset(c.stallPeriod())
	}
	c.execIO(sl, true)
	return c.hand.CompareAndSwap(v|1, v)
}

// takeOver is the stall timer's tick. If the inline run it saw at its last
// look is still running, the reaper is busy with a slow request: this
// goroutine becomes the reaper. Otherwise it looks again a period later
// while inline runs go on, and lets the timer rest once none ran for a
// whole period.
func (c *conn) takeOver() {
	c.stallTicks.Add(1)
	// hand first: a run it shows running has counted itself in inlineSeq
	// already, so if inlineSeq has not moved since the last look, that run
	// was running then.
	v := c.hand.Load()
	seq := c.inlineSeq.Load()
	if seq == c.stallSeen.Load() {
		if v&1 != 0 && c.hand.CompareAndSwap(v, (v>>1+1)<<1) {
			c.tookOver.Store(int64(max(time.Since(c.born), 1)))
			c.stallArmed.Store(false) // the new reaper's inline runs set it again
			c.reap()
			return
		}
		if v&1 == 0 {
			// Nothing ran inline for a whole period. A run that began
			// after the loads above may have seen the timer still set:
			// it is watched from here.
			c.stallArmed.Store(false)
			if c.inlineSeq.Load() != seq && c.stallArmed.CompareAndSwap(false, true) {
				c.stallSeen.Store(c.inlineSeq.Load())
				c.stall.Reset(c.stallPeriod())
			}
			return
		}
	}
	c.stallSeen.Store(seq)
	c.stall.Reset(c.stallPeriod())
}

// onSent handles the completion of one of our SENDs or RDMA WRITEs.
func (c *conn) onSent(wc *transport.Completion) {
	if err := wc.Err(); err != nil {
		var ce *transport.CompletionError
		if errors.As(err, &ce) && ce.Status == transport.StatusFlushed {
			c.fail(transport.ErrClosed)
		} else {
			c.fail(fmt.Errorf("%v failed: %w", wc.Op, err))
		}
	}
	if wc.ID&wrLast != 0 {
		idx := int(wc.ID &^ wrLast)
		c.slots.put(idx)
		c.checkIdle()
		c.mu.Lock()
		end := c.endAfter == idx+1
		c.mu.Unlock()
		if end {
			c.fail(errors.New("authentication refused"))
		}
	}
}

// onRecv handles one received message; last says no other message follows
// it in the reaper's batch.
func (c *conn) onRecv(wc *transport.Completion, last bool) {
	rb, ok := c.pool.take(c, wc.ID)
	if !ok {
		c.fail(fmt.Errorf("receive completion with unknown id %d", wc.ID))
		return
	}
	if err := wc.Err(); err != nil {
		limit := c.s.cfg.MaxRecvBufferSize
		what := "message longer than MaxRecvBufferSize"
		if rb.auth {
			limit, what = authRecvSize, "message before AUTH longer than the AUTH receive"
		}
		c.pool.give(c, rb)
		var ce *transport.CompletionError
		if errors.As(err, &ce) && ce.Status == transport.StatusLocalLength {
			c.fail(fmt.Errorf("%s (%d bytes): %w", what, limit, err))
		} else if errors.As(err, &ce) && ce.Status == transport.StatusFlushed {
			c.fail(transport.ErrClosed)
		} else {
			c.fail(fmt.Errorf("receive failed: %w", err))
		}
		return
	}
	c.mu.Lock()
	if c.err != nil {
		// The connection failed earlier in this batch (a broken rule):
		// nothing after it is served.
		c.mu.Unlock()
		c.pool.give(c, rb)
		return
	}
	state := c.state
	c.mu.Unlock()
	msg, err := c.received(rb, wc)
	if err != nil {
		c.pool.give(c, rb)
		c.fail(err)
		return
	}
	if wc.HasImm {
		c.pool.give(c, rb)
		c.fail(errors.New("protocol violation: RDMA WRITE WITH IMMEDIATE from a client"))
		return
	}
	req, err := protocol.DecodeRequest(msg)
	if state == stateAuth {
		c.auth(&req, err, len(msg), rb)
		return
	}
	if err != nil {
		c.pool.give(c, rb)
		c.fail(err) // a broken wire rule: the FieldError names it
		return
	}
	if err := c.grant.Receive(); err != nil {
		// More messages than credits: the connection ends, and the
		// buffer it took, maybe another's, is posted again at once.
		c.pool.give(c, rb)
		c.fail(err)
		return
	}
	c.requests.Add(1)
	// A fragmented write (fragment.go) is dispatched once its last
	// FRAGMENT is in; every message takes its credit above.
	sl, ok := c.assemble(&req, rb)
	if !ok {
		return
	}
	h := &sl.req.Header
	switch h.Opcode {
	case protocol.OpRead, protocol.OpVecRead, protocol.OpWrite, protocol.OpVecWrite:
		sl.fid = c.sess.lookup(h.Fid)
		if sl.fid != nil {
			sl.cancel = sl.fid.cancelled()
		}
		c.mu.Lock()
		c.ioInflight++
		alone := c.ioInflight == 1
		closing := c.state == stateClosing
		c.mu.Unlock()
		c.policy(h.Credits)
		c.reqs.Add(1)
		if closing {
			go func() {
				defer c.reqs.Done()
				c.complete(sl, nil, protocol.StatusRequestNotAccepted, 0)
			}()
			return
		}
		// The last request of the batch runs inline when a disk worker is
		// free at once and it is small. Not in polling mode: measured
		// slower there (the client spins, and its INTERRUPT must not wait
		// behind the reaper's disk work). Not a large one: copying 1 MiB
		// twice (pread, then the RDMA WRITE's copy) outlasted the stall
		// timer's period when it was 100 µs throughout, and its takeover
		// (a new goroutine each time) cost more than the hand-off saved.
		// A READ of any size alone on a connection that reads in place
		// is the exception: one pread into the client's memory, and the
		// hand-off it saves is a thread wake-up per 1 MiB read (issue 16,
		// docs/bench.md "Split reads on the shared-memory path"). Alone:
		// with others in flight (a deep queue) the reaper keeps taking
		// requests in while the read runs elsewhere.
		small := int(h.Length) <= inlineMax || c.inPlace.Load() && alone && h.Opcode == protocol.OpRead
		if last && h.Flags&protocol.FlagInterrupt != 0 && small && h.Opcode != protocol.OpVecRead {
			select {
			case c.s.workers <- struct{}{}:
				sl.inline = true
				c.pend = sl
				return
			default:
			}
		}
		c.s.runIO(sl)
	case protocol.OpCredit, protocol.OpInterrupt:
		// Their order matters (−N … −1; which INTERRUPT is held), so they
		// are decided here, in arrival order; only the answer is posted
		// from a goroutine.
		c.reqs.Add(1)
		c.ordered(sl)
	default: // REGISTER, CLOSE, CANCEL, a repeated AUTH
		c.policy(h.Credits)
		c.reqs.Add(1)
		go c.execControl(sl)
	}
}

// releaseRecv gives the request's receive buffers back to the pool.
func (c *conn) releaseRecv(sl *slot) {
	rb := sl.recv
	if rb == nil {
		return
	}
	sl.recv = nil
	sl.req.Data, sl.req.Regions = nil, nil // they alias rb
	c.releaseFragments(sl)
	c.giveBack(rb)
}

// giveBack returns a consumed receive buffer to the connection's pool,
// which posts it again or, when credits were taken back, lets it go
// (recvpool.go).
func (c *conn) giveBack(rb *recvBuf) {
	if err := c.pool.give(c, rb); err != nil {
		c.fail(fmt.Errorf("repost receive: %w", err))
	}
}

// post queues a chain of work requests, waiting for send-queue room. The
// last one must carry wrLast|slot so the slot is freed when it completes.
func (c *conn) post(wrs []transport.SendWR) error {
	if err := c.sq.acquire(len(wrs)); err != nil {
		return err
	}
	if err := c.tc.Post(wrs...); err != nil {
		c.sq.release(len(wrs))
		return err
	}
	return nil
}

// postOrDrop posts the slot's chain; if that fails the connection is going
// away and the slot is freed here. A request run inline on the reaper must
// not wait for send-queue room, which only the reaper frees: without room
// it posts from a goroutine.
func (c *conn) postOrDrop(sl *slot, wrs []transport.SendWR) {
	wrs[len(wrs)-1].ID = wrLast | uint64(sl.idx)
	if sl.inline {
		sl.inline = false
		if !c.sq.tryAcquire(len(wrs)) {
			c.reqs.Add(1)
			go func() {
				defer c.reqs.Done()
				c.postOrDrop(sl, wrs)
			}()
			return
		}
		if err := c.tc.Post(wrs...); err != nil {
			c.sq.release(len(wrs))
			c.fail(fmt.Errorf("post: %w", err))
			c.slots.put(sl.idx)
			c.checkIdle()
		}
		return
	}
	if err := c.post(wrs); err != nil {
		c.fail(fmt.Errorf("post: %w", err))
		c.slots.put(sl.idx)
		c.checkIdle()
	}
}

// statusWR is the STATUS_RESPONSE send that completes a request in
// interrupt mode, and every control request (FIG. 6C, 7B, 9B, 11C, 12B,
// 13B, 14B, 15B, 16B, 17D).
func (c *conn) statusWR(sl *slot, st protocol.Status, info uint32) transport.SendWR {
	r := protocol.NewStatusResponse(sl.req.Header.Cookie(), info, st)
	r.Put(sl.resp.Bytes())
	sl.tail[0] = transport.Segment{Region: sl.resp, Length: protocol.StatusResponseSize}
	return transport.SendWR{Op: transport.OpSend, SGL: sl.tail[:]}
}

// iosWR completes a polling-mode request by RDMA-writing the IO_STATUS_BLOCK
// to IosVa/IosMh (FIG. 14D, 15D, 16D, 17E).
func (c *conn) iosWR(sl *slot, st protocol.Status, info uint32) transport.SendWR {
	ios := protocol.NewIOStatusBlock(info, st)
	ios.Put(sl.resp.Bytes()[protocol.StatusResponseSize:])
	sl.tail[0] = transport.Segment{Region: sl.resp, Offset: protocol.StatusResponseSize, Length: protocol.IOStatusBlockSize}
	return transport.SendWR{
		Op:         transport.OpWrite,
		SGL:        sl.tail[:],
		RemoteAddr: sl.req.Header.IosVa,
		RKey:       sl.req.Header.IosMh,
	}
}

// complete is where every request ends: wrs are the work requests its
// handler built (data RDMA WRITEs, the AUTH parameters), then comes the
// status its mode asks for — an IO_STATUS_BLOCK write for a polling I/O
// request, nothing more when the last data write carries the immediate
// cookie, else a STATUS_RESPONSE send. The credit is counted free before
// the post (a CREDIT giving one back retires it), and an I/O completion
// answers the pending INTERRUPT (FIG. 9B). A refused first AUTH ends the
// connection once its answer is out.
func (c *conn) complete(sl *slot, wrs []transport.SendWR, st protocol.Status, info uint32) {
	h := &sl.req.Header
	isIO := h.Opcode.IsIO()
	retire := h.Opcode == protocol.OpCredit && st == protocol.NotifyCredit
	c.releaseRecv(sl)
	if wrs == nil {
		wrs = sl.wrs[:0]
	}
	switch {
	case isIO && h.Flags&protocol.FlagInterrupt == 0:
		wrs = append(wrs, c.iosWR(sl, st, info))
	case isIO && len(wrs) > 0 && wrs[len(wrs)-1].HasImm:
		// RDMA WRITE WITH IMMEDIATE is the completion (FIG. 14A, 16A).
	default:
		wrs = append(wrs, c.statusWR(sl, st, info))
	}
	switch {
	case sl.authn:
		if st != protocol.StatusSuccess {
			c.mu.Lock()
			c.endAfter = sl.idx + 1
			c.mu.Unlock()
		}
	case retire:
		c.grant.CompleteRetire()
	default:
		for range max(sl.msgs, 1) { // a fragmented write took a credit per message
			c.grant.Complete()
		}
	}
	c.count(sl, wrs, st, info) // stats.go
	var intr *slot
	if isIO {
		c.mu.Lock()
		c.ioInflight--
		intr, c.intr = c.intr, nil
		c.mu.Unlock()
	}
	sl.wrs = wrs // keeps a grown array for the slot's next request
	inline := sl.inline
	c.postOrDrop(sl, wrs) // sl may be reused from here on
	if intr != nil {
		intr.inline = inline
		c.complete(intr, nil, protocol.StatusSuccess, 0)
	}
}

// checkIdle wakes a closing connection's shutdown when nothing is left.
func (c *conn) checkIdle() {
	c.mu.Lock()
	ch := c.idle
	c.mu.Unlock()
	if ch != nil && c.slots.inUse() == 0 {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// shutdown is Server.Close for one connection: stop taking new work, let
// in-flight requests finish for up to timeout, then disconnect.
func (c *conn) shutdown(timeout time.Duration) {
	c.mu.Lock()
	if c.state == stateOpen {
		c.state = stateClosing
	}
	c.idle = make(chan struct{}, 1)
	idle := c.idle
	sess := c.sess
	c.mu.Unlock()
	if sess != nil {
		// Queued requests fail with STATUS_CANCELLED rather than wait.
		sess.mu.RLock()
		for _, e := range sess.fids {
			if e != nil {
				e.cancel()
			}
		}
		sess.mu.RUnlock()
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for c.slots.inUse() > 0 || c.grant != nil && c.grant.Outstanding() > c.pendingInterrupts() {
		select {
		case <-idle:
		case <-deadline.C:
			c.fail(errors.New("shutdown timeout"))
			return
		case <-c.ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	c.fail(errors.New("server closing"))
}

func (c *conn) pendingInterrupts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.intr != nil {
		return 1
	}
	return 0
}

// teardown runs after the reaper has returned: every request goroutine
// finishes (their posts fail), then the memory goes.
func (c *conn) teardown() {
	c.fail(transport.ErrClosed)
	c.reqs.Wait()
	c.mu.Lock()
	c.state = stateClosed
	sess, budget := c.sess, c.budget
	c.sess, c.budget = nil, 0
	c.mu.Unlock()
	if sess != nil {
		c.s.detach(sess)
	}
	c.s.budget.Give(budget)
	if c.grant != nil {
		c.s.authed.Add(-1)
	}
	c.endAuth()
	c.pool.addCredits(-budget)
	c.pool.reclaim(c)
	c.s.leavePool(c.pool)
	c.stall.Stop()
	c.slots.drop()
	c.data.Drop()
	c.log.Info("lwio: connection closed")
}

// wrLast marks the work request that ends a slot's chain; the low bits are
// the slot index.
const wrLast = 1 << 63

// sendQueue counts free send-queue entries so that posts never overflow
// the queue pair; request goroutines wait for room, the reaper frees it.
type sendQueue struct {
	mu     sync.Mutex
	cond   sync.Cond
	avail  int
	size   int
	closed bool
}

func (q *sendQueue) init(n int) {
	q.cond.L = &q.mu
	q.avail, q.size = n, n
}

func (q *sendQueue) acquire(n int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n > q.size {
		return fmt.Errorf("chain of %d work requests exceeds send queue of %d", n, q.size)
	}
	for q.avail < n && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return transport.ErrClosed
	}
	q.avail -= n
	return nil
}

// tryAcquire takes n entries if they are free now.
func (q *sendQueue) tryAcquire(n int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || n > q.avail {
		return false
	}
	q.avail -= n
	return true
}

func (q *sendQueue) release(n int) {
	q.mu.Lock()
	q.avail += n
	q.mu.Unlock()
	q.cond.Broadcast()
}

func (q *sendQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}
