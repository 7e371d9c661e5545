package server

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// Receive buffers (issue 20 item 2; docs/engine.md, "Receive buffers").
// Every credit is a posted receive buffer. Where the provider can make a
// shared receive queue the server keeps one per protection domain (one per
// device), and every connection of that domain takes its receives from it
// (transport.SRQ, Config.Queues: the server is the QueueChooser); where it
// cannot, each connection has its own receive queue, filled the same way.
// A recvPool is either.
//
// The rule is the NIC's: a SEND that finds the queue empty is
// receiver-not-ready, so every credit granted must be a buffer posted. A
// pool keeps live buffers — posted, or held by a request — for the credits
// its connections hold (the budget's, budget.go), one for each connection
// not yet authenticated (its AUTH), up to authAllowance, and headroom:
// want. A buffer a request is done with is posted again while live is
// within want, else it goes (a few kept as spares). So the pool grows the
// moment credits are granted (posted before the grant goes out), and
// shrinks as credits taken back are consumed: a retiring CREDIT message
// brings its buffer back, and that buffer is not posted again. A buffer
// posted to a shared queue cannot be taken back; what a closed
// connection's unused credits left posted stays for the others and counts
// toward their grants.
//
// Sum over a pool's connections: messages sent and not yet released ≤
// credits granted ≤ want ≤ live buffers, so posted ≥ what can arrive
// unannounced. A client sending beyond its credits can take another's
// buffer, but its connection ends at its first surplus message (the
// CreditGrant's Receive), and the buffers it held come back then
// (reclaim); the others' SENDs meanwhile wait at most for a repost
// (receiver-not-ready waits the initiator's RNR time).
type recvPool struct {
	s *Server
	// key is the domain ChooseQueues made the shared queue for; users
	// the connections using the pool, chosen when ChooseQueues last gave
	// its queue out (both s.mu).
	key    transport.Domain
	users  int
	chosen time.Time
	// srq is the shared receive queue, or nil: the receive queue of tc,
	// the one connection using the pool.
	srq transport.SRQ
	tc  transport.Conn
	// headroom and authAllowance: see want.
	headroom, authAllowance int

	// bufs is every entry, by RecvWR.ID. take reads it without mu (the
	// receive path); alloc replaces it under mu, never changing an
	// element below the old length. An entry whose buffer went is reused
	// (freeIDs).
	bufs atomic.Pointer[[]*recvBuf]

	mu      sync.Mutex
	dom     transport.Domain // where its buffers are registered
	freeIDs []uint64         // entries of bufs without a buffer
	spare   []*recvBuf       // registered, not posted
	credits int              // credits granted to the connections using the pool
	authing int              // connections using it not yet past AUTH
	live    int              // buffers posted or held by a request (not spare)
	auths   int              // small AUTH receives registered (own queue; not live)
	// pending counts the live buffers a fill is still registering or
	// posting; settled (on mu) is broadcast as each is done.
	pending int
	settled sync.Cond
	closed  bool
}

// recvBuf is one receive buffer: seg is where in its region the message
// lands (recvPad bytes in, so that data after a 48-byte header starts on
// a page). region, seg, wr and auth change under the pool's mu, only
// while owner is goneOwner (no buffer) or being set up by alloc.
type recvBuf struct {
	id     uint64
	region transport.Region
	seg    transport.Segment
	wr     [1]transport.RecvWR // what posts it: no allocation per post
	auth   bool                // a small AUTH receive (authRecvSize): freed once given back
	// owner is the connection whose request holds it, from its receive
	// completion until it is given back; nil while posted, being
	// posted, or spare; givingOwner while give decides; goneOwner while
	// the entry has no buffer. take and give change it by
	// compare-and-swap, without the pool's mu: a buffer is taken once and
	// given back once.
	owner atomic.Pointer[conn]
	// lent is the tail of the message in it left in the client's memory
	// (lent.go), until placed; set by each receive.
	lent   transport.Lent
	lender transport.LentReader // whose lent is it (the completion's Conn)
}

// Markers for recvBuf.owner.
var givingOwner, goneOwner = new(conn), new(conn)

// kind names where the pool's receives are posted, for logs: "shared" (a
// shared receive queue) or "own" (one connection's own receive queue).
func (p *recvPool) kind() string {
	if p.srq != nil {
		return "shared"
	}
	return "own"
}

// A shared pool's headroom: one receive beyond the credits, and the AUTH
// receives of at most srqAuthAllowance connections authenticating at once.
// More AUTHs arriving together take receives posted for credits, and an
// authenticated client's SEND may then wait receiver-not-ready for a
// repost (docs/engine.md, "What the shared queue does not isolate").
const (
	srqHeadroom      = 1
	srqAuthAllowance = 16
)

// authRecvSize is the receive a connection with a queue of its own posts
// for its AUTH, before it has credits: an AUTH is a header and its
// parameters (under 200 bytes), and nothing else may come first — a longer
// message fails the receive (local length) and ends the connection. So a
// connection that never authenticates holds 1 KiB, not a full receive
// buffer. A shared queue cannot do the same: its receives go to whichever
// connection's message arrives next, so each must hold the largest.
const authRecvSize = 1024

// newRecvPool returns a pool posting to srq, or, with srq nil, to tc's own
// receive queue (whose AUTH receive is a small one outside want: authStart).
func newRecvPool(s *Server, dom transport.Domain, srq transport.SRQ, tc transport.Conn) *recvPool {
	p := &recvPool{s: s, dom: dom, srq: srq, tc: tc}
	p.bufs.Store(new([]*recvBuf))
	p.settled.L = &p.mu
	if srq != nil {
		p.headroom, p.authAllowance = srqHeadroom, srqAuthAllowance
	}
	return p
}

// want is how many live buffers the pool keeps.
func (p *recvPool) want() int {
	return p.credits + min(p.authing, p.authAllowance) + p.headroom
}

// post posts rb, with or without p.mu (the providers' PostRecv may be
// called concurrently).
func (p *recvPool) post(rb *recvBuf) error {
	if p.srq != nil {
		return p.srq.PostRecv(rb.wr[:]...)
	}
	return p.tc.PostRecv(rb.wr[:]...)
}

// addCredits counts n credits granted (negative: given back) to a
// connection using the pool, and posts receives for new ones before it
// returns.
func (p *recvPool) addCredits(n int) error {
	p.mu.Lock()
	p.credits += n
	p.mu.Unlock()
	if n <= 0 {
		return nil // nothing to post (and no other connection's registration to wait for)
	}
	return p.fill()
}

// authStart counts a connection that will send AUTH and posts its receive:
// on a shared queue one of the pool's buffers (within authAllowance), on a
// connection's own queue a small one of its own (authRecvSize). authEnd
// counts its AUTH received (or the connection gone before).
func (p *recvPool) authStart() error {
	p.mu.Lock()
	p.authing++
	p.mu.Unlock()
	if p.srq != nil {
		return p.fill()
	}
	rb, err := p.alloc(true)
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.closed {
		err = transport.ErrClosed
	} else {
		err = p.post(rb)
	}
	p.mu.Unlock()
	if err != nil {
		p.free(rb)
	}
	return err
}

func (p *recvPool) authEnd() {
	p.mu.Lock()
	p.authing--
	p.mu.Unlock()
}

// fill posts receive buffers until live reaches want: spares first, then
// new ones. It returns only when every live buffer is posted or held —
// none still being registered by another fill — since its caller sends a
// grant next, and a SEND on that grant must find its buffer posted. If
// another fill's registration fails meanwhile, this one makes up for it.
func (p *recvPool) fill() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.closed {
			return transport.ErrClosed
		}
		if p.live >= p.want() {
			if p.pending == 0 {
				return nil
			}
			p.settled.Wait()
			continue
		}
		p.live++
		p.pending++
		var rb *recvBuf
		if l := len(p.spare); l > 0 {
			rb = p.spare[l-1]
			p.spare = p.spare[:l-1]
		}
		var err error
		if rb == nil {
			p.mu.Unlock()
			rb, err = p.alloc(false)
			p.mu.Lock()
		}
		if err == nil && p.closed { // released while it registered
			err = transport.ErrClosed
		}
		if err == nil {
			err = p.post(rb)
		}
		p.pending--
		p.settled.Broadcast()
		if err != nil {
			if !p.closed { // release zeroed the counts
				p.live--
			}
			if rb != nil {
				p.mu.Unlock()
				p.free(rb)
				p.mu.Lock()
			}
			return err
		}
	}
}

// alloc registers a new receive buffer and gives it an id: a full one
// (MaxRecvBufferSize, counted in the server's buffers), or with auth a
// small AUTH receive (authRecvSize, counted in auths).
func (p *recvPool) alloc(auth bool) (*recvBuf, error) {
	size, pad := p.s.cfg.MaxRecvBufferSize, recvPad
	if auth {
		size, pad = authRecvSize, 0 // an AUTH carries no data to align
	}
	p.mu.Lock()
	dom := p.dom
	p.mu.Unlock()
	r, err := dom.Alloc(pad+size, transport.AccessLocal)
	if err != nil {
		return nil, err
	}
	if !auth {
		p.s.recvBufs.Add(1)
	}
	seg := transport.Segment{Region: r, Offset: pad, Length: size}
	p.mu.Lock()
	defer p.mu.Unlock()
	if auth {
		p.auths++
	}
	var rb *recvBuf
	if n := len(p.freeIDs); n > 0 { // an entry whose buffer went
		rb = (*p.bufs.Load())[p.freeIDs[n-1]]
		p.freeIDs = p.freeIDs[:n-1]
	} else {
		bufs := *p.bufs.Load()
		rb = &recvBuf{id: uint64(len(bufs))}
		bufs = append(bufs, rb) // past the old length: take never reads it there
		p.bufs.Store(&bufs)
	}
	rb.region, rb.seg, rb.auth = r, seg, auth
	rb.wr[0] = transport.RecvWR{ID: rb.id, Buf: seg}
	rb.owner.Store(nil) // set up: take may find it once it is posted
	return rb, nil
}

// free deregisters rb's memory; its entry stays for its id, and is used
// again by the next alloc. A no-op for an entry already without a buffer.
func (p *recvPool) free(rb *recvBuf) {
	p.mu.Lock()
	r, auth := rb.region, rb.auth
	if r == nil {
		p.mu.Unlock()
		return
	}
	rb.owner.Store(goneOwner)
	rb.region, rb.seg, rb.auth = nil, transport.Segment{}, false
	rb.wr[0] = transport.RecvWR{}
	p.freeIDs = append(p.freeIDs, rb.id)
	if auth {
		p.auths--
	}
	p.mu.Unlock()
	r.Deregister()
	if !auth {
		p.s.recvBufs.Add(-1)
	}
}

// take hands the buffer of receive id, just completed on c, to c; false
// if no posted buffer has that id (a provider's bug or a stale id). It
// takes no lock: the receive path of every connection of a device.
func (p *recvPool) take(c *conn, id uint64) (*recvBuf, bool) {
	bufs := *p.bufs.Load()
	if id >= uint64(len(bufs)) {
		return nil, false
	}
	rb := bufs[id]
	if !rb.owner.CompareAndSwap(nil, c) {
		return nil, false
	}
	return rb, true
}

// give takes back a buffer c held: posted again while the pool's live
// buffers are within want, else kept as a spare (a few, while the server's
// buffers are within the budget) or freed. A no-op when c no longer holds
// it (reclaim took it).
//
// The repost is made after p.mu is let go, and before give returns. That
// keeps fill's promise (every live buffer posted or held when a grant goes
// out): a buffer between the two is still held as far as credits go — the
// message it carried keeps its sender's credit until the response, which
// its request sends after give returns — so what can arrive unannounced
// still finds a buffer posted.
func (p *recvPool) give(c *conn, rb *recvBuf) error {
	if rb.owner.Load() != c {
		return nil
	}
	if rb.auth {
		if rb.owner.CompareAndSwap(c, givingOwner) {
			p.free(rb) // never live, never posted again
		}
		return nil
	}
	p.mu.Lock()
	if !rb.owner.CompareAndSwap(c, nil) { // nil before the post: its completion may come at once
		p.mu.Unlock()
		return nil
	}
	if p.closed || p.live > p.want() {
		return p.unlive(rb, nil)
	}
	p.mu.Unlock()
	err := p.post(rb)
	if err == nil || !rb.owner.CompareAndSwap(nil, givingOwner) {
		return err // posted; or completed anyway, or the pool was released
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.free(rb)
		return err
	}
	return p.unlive(rb, err)
}

// unlive takes rb, given back and not posted, out of the live buffers: a
// spare or freed. p.mu held; unlive lets it go.
func (p *recvPool) unlive(rb *recvBuf, err error) error {
	p.live--
	if !p.closed && len(p.spare) < p.s.cfg.MinCredits && int(p.s.recvBufs.Load()) <= p.s.budget.Total() {
		rb.owner.Store(nil)
		p.spare = append(p.spare, rb)
		p.mu.Unlock()
		return err
	}
	p.mu.Unlock()
	p.free(rb)
	return err
}

// reclaim gives back every buffer c still holds: at its teardown, what a
// request never released (a fragmented write cut short, a held INTERRUPT,
// a message after the connection failed).
func (p *recvPool) reclaim(c *conn) {
	for _, rb := range *p.bufs.Load() {
		if rb.owner.Load() == c {
			p.give(c, rb)
		}
	}
}

// dropSpares frees the spare buffers: the server's buffers are past the
// budget.
func (p *recvPool) dropSpares() {
	p.mu.Lock()
	spare := p.spare
	p.spare = nil
	p.mu.Unlock()
	for _, rb := range spare {
		p.free(rb)
	}
}

// usage is the pool's registered buffers, posted, held or spare (not the
// small AUTH receives: see bytes).
func (p *recvPool) usage() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.live + len(p.spare)
}

// bytes is the memory the pool has registered: its buffers and its small
// AUTH receives.
func (p *recvPool) bytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return int64(p.live+len(p.spare))*int64(p.s.cfg.bufferBytes()) + int64(p.auths)*authRecvSize
}

// release frees every buffer once no connection uses the pool any more:
// the shared queue was destroyed (its posted receives are then the
// server's again), a connection's own queue was flushed by its close.
func (p *recvPool) release() {
	p.mu.Lock()
	p.closed = true
	p.settled.Broadcast()
	bufs := *p.bufs.Load()
	p.spare = nil
	p.live = 0
	p.mu.Unlock()
	for _, rb := range bufs {
		p.free(rb)
	}
}

// srqDepth is the shared receive queue's size: the budget with its
// possible overdraft (a quarter), and the headroom.
func (s *Server) srqDepth() int {
	return s.budget.Total()*5/4 + s.cfg.MaxCredits + srqAuthAllowance + srqHeadroom
}

// listenQueues is the QueueChooser of a listener made by Server.Listen
// (unless Config.Transport.Queues names another): every connection of a
// domain takes its receives from the domain's shared receive queue, made
// on first use. A domain that cannot make one gets connections with their
// own receive queues. pools are the shared ones it handed out (s.mu).
type listenQueues struct {
	s     *Server
	pools map[*recvPool]struct{}
}

func (q *listenQueues) ChooseQueues(d transport.QueueDomain) (transport.Queues, error) {
	s := q.s
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.srqs[d]
	if !ok {
		srq, err := d.CreateSRQ(transport.SRQConfig{Depth: s.srqDepth()})
		if err != nil {
			s.log.WithError(err).Warn("lwio: no shared receive queue; each connection gets its own")
		} else {
			p = newRecvPool(s, d, srq, nil)
			p.key = d
			s.pools[p] = struct{}{}
		}
		s.srqs[d] = p
	}
	if p == nil {
		return transport.Queues{}, nil
	}
	p.chosen = time.Now()
	q.pools[p] = struct{}{}
	return transport.Queues{SRQ: p.srq}, nil
}

// poolFor is where a connection accepted on a listener with chooser q
// (nil: not made by Server.Listen) takes its receives: the shared pool of
// its domain if q handed one out — found by the connection's Domain, or
// q's only one when the connection's Domain wraps the provider's (a
// test's counting wrapper) — else a pool of its own. s.mu is held.
func (s *Server) poolFor(tc transport.Conn, q *listenQueues) *recvPool {
	if q != nil {
		p, ok := s.srqs[tc.Domain()]
		if !ok && len(q.pools) == 1 {
			for p = range q.pools {
			}
		}
		if p != nil {
			p.mu.Lock()
			p.dom = tc.Domain() // what a wrapper counts; the provider's memory
			p.mu.Unlock()
			p.users++
			return p
		}
	}
	p := newRecvPool(s, tc.Domain(), nil, tc)
	p.users = 1
	s.pools[p] = struct{}{}
	return p
}

// leavePool is a connection's teardown in its pool: its own pool goes,
// and so does a shared one it was the last to use.
func (s *Server) leavePool(p *recvPool) {
	s.mu.Lock()
	p.users--
	s.mu.Unlock()
	s.dropIdle(p, time.Now())
}

// dropIdle frees a pool no connection uses: a shared one's queue is
// destroyed, with the receives it held posted — which no connection would
// consume — and the next connection of its domain makes a new one. Not
// while a connection being accepted may have been given its queue
// (chosen less than idleChosen before now; the balancer tries again).
func (s *Server) dropIdle(p *recvPool, now time.Time) {
	s.mu.Lock()
	_, live := s.pools[p]
	if !live || p.users > 0 || p.srq != nil && now.Sub(p.chosen) < idleChosen {
		s.mu.Unlock()
		return
	}
	if p.srq != nil {
		if err := p.srq.Close(); err != nil {
			s.mu.Unlock()
			return // a connection still uses it (ErrInUse): a later sweep
		}
		delete(s.srqs, p.key)
		for _, q := range s.chooser {
			delete(q.pools, p)
		}
	}
	delete(s.pools, p)
	s.mu.Unlock()
	p.release()
}

// idleChosen is how long after ChooseQueues gave a shared queue out it is
// kept though no connection uses it: the connection is being set up.
const idleChosen = 2 * time.Second

// recvPools returns every pool, shared or a connection's own.
func (s *Server) recvPools() []*recvPool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ps := make([]*recvPool, 0, len(s.pools))
	for p := range s.pools {
		ps = append(ps, p)
	}
	return ps
}
