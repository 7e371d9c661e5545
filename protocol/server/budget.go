package server

import (
	"maps"
	"slices"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
)

// The memory budget (issue 20; docs/engine.md, "Credits"): each credit is
// a posted receive buffer, so the server's receive memory is its credits
// in use times a buffer's size. Config.MaxBufferMemory fixes how many
// credits all connections share. Within it:
//
//   - a new connection always gets at least MinCredits, even when the
//     budget is spent — the balancer then takes credits back from those
//     above their share — but never so many more that the overdraft
//     passes a quarter of the budget: then AUTH waits (authWait at most)
//     for the balancer to take back what others hold above their fair
//     share, and is refused with STATUS_INSUFFICIENT_RESOURCES only when
//     no one holds more or the wait runs out;
//   - a connection whose client keeps every credit busy grows (doubling, as
//     far as the budget allows: policy in control.go);
//   - every balanceEvery, connections that carried no request for
//     idleSweeps sweeps and have none outstanding give back everything
//     above MinCredits, and while
//     the budget is overdrawn or a connection wanted more than it could
//     get, those above their fair share (the budget over the connections,
//     at least MinCredits) give back the surplus — by negative credit
//     deltas, the seed's own mechanism (FIG. 11A–C);
//   - a connection keeps at most MinCredits spare receive buffers of
//     credits it gave back; the rest are deregistered, so the memory goes.

// Defaults of the budget's Config fields.
const (
	DefaultMaxBufferMemory = 32 << 20
	DefaultMinCredits      = 4
)

// balanceEvery is the balancer's period; a connection is idle after
// idleSweeps periods with no request.
const (
	balanceEvery = 500 * time.Millisecond
	idleSweeps   = 4
)

// bufferBytes is the memory one credit holds: a receive buffer and the
// padding that page-aligns write data in it.
func (c *Config) bufferBytes() int { return recvPad + c.MaxRecvBufferSize }

// takeForAuth takes a new connection's grant from the budget: what it asks
// for as far as the budget allows, and at least MinCredits (the balancer
// then takes the overdraft back from others) as long as the overdraft
// stays within a quarter of the budget. Past that, while others hold
// credits above their fair share, it waits up to authWait for the balancer
// to take them back, so that clients logging on together are not refused
// for the round trips paying an overdraft back takes (issue 20); else it
// returns what is left. 0: refused.
func (s *Server) takeForAuth(want int) int {
	got := s.budget.Take(want)
	if got >= min(want, s.cfg.MinCredits) {
		if got < want {
			s.short()
		}
		return got
	}
	need := min(want, s.cfg.MinCredits) - got
	limit := s.budget.Total() + s.budget.Total()/4
	deadline := time.NewTimer(authWait)
	defer deadline.Stop()
	for {
		s.short()
		given := s.budget.Given() // before the look: a Give after it wakes us
		switch {
		case s.budget.Overdraw(need, limit):
			return got + need
		case s.reclaimable() == 0:
			return got // what is left, or 0: refused
		}
		select {
		case <-given:
		case <-deadline.C:
			return got
		case <-s.quit:
			return got
		}
	}
}

// authWait bounds how long an AUTH waits for the balancer to pay an
// overdraft back: well within the client's AuthTimeout (5 s by default).
const authWait = 4 * balanceEvery

// reclaimable is how many credits the authenticated connections hold
// above their fair share: what the balancer takes back while the budget
// is short.
func (s *Server) reclaimable() int {
	fair, n := s.fairShare(), 0
	for _, c := range s.connList() {
		if g := c.openGrant(); g != nil {
			n += max(0, g.Granted()-fair)
		}
	}
	return n
}

// short records that a connection got less than it wanted: the balancer
// sweeps at once, and for contendedFor no connection grows past its fair
// share (policy in control.go).
func (s *Server) short() {
	s.contended.Store(time.Now().Add(contendedFor).UnixNano())
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// contendedFor is how long after a shortage growth stays capped at the
// fair share.
const contendedFor = 4 * balanceEvery

// growthCap is how many credits a connection may grow to: its fair share
// while the budget is contended, else unbounded (MaxCredits applies).
func (s *Server) growthCap() int {
	if time.Now().UnixNano() > s.contended.Load() {
		return int(^uint(0) >> 1)
	}
	return s.fairShare()
}

// fairShare is the budget over the authenticated connections, at least
// MinCredits.
func (s *Server) fairShare() int {
	return max(s.cfg.MinCredits, s.budget.Total()/max(int(s.authed.Load()), 1))
}

// balance is the balancer: every balanceEvery until the server closes, and
// at once when a connection came up short, it takes credits back from idle
// connections, and from those above their fair share while the budget is
// short.
func (s *Server) balance() {
	t := time.NewTicker(balanceEvery)
	defer t.Stop()
	for {
		tick := false
		select {
		case <-t.C:
			tick = true
		case <-s.poke:
		case <-s.quit:
			return
		}
		conns := s.connList()
		now := time.Now()
		for _, p := range s.recvPools() {
			if int(s.recvBufs.Load()) > s.budget.Total() {
				p.dropSpares()
			}
			s.dropIdle(p, now) // a shared queue no connection uses any more
		}
		short := time.Now().UnixNano() <= s.contended.Load() || s.budget.Used() > s.budget.Total()
		fair := s.fairShare()
		for _, c := range conns {
			c.rebalance(tick, short, fair)
		}
	}
}

// rebalance is the balancer's look at one connection: it takes back what
// the connection does not keep.
func (c *conn) rebalance(tick, short bool, fair int) {
	if !c.answered.Load() {
		return
	}
	g := c.grant.Granted()
	if keep := c.keep(tick, short, fair, g); keep < g && !c.grant.Open() {
		c.startDelta(-(g - keep))
	}
}

// keep is how many of its g credits the connection keeps: MinCredits when
// idle for idleSweeps ticks, its fair share while the budget is short,
// else all. A connection that carried a request since the balancer last
// looked, on a tick or a poke, or has requests outstanding, is busy: its
// idle count starts again (else one busy again, or waiting on slow I/O,
// lost everything above MinCredits at the next poke).
func (c *conn) keep(tick, short bool, fair, g int) int {
	switch n := c.requests.Load(); {
	case n != c.seenRequests || c.grant.Outstanding() > 0:
		c.seenRequests, c.idleSweeps = n, 0
	case tick:
		c.idleSweeps++
	}
	switch {
	case c.idleSweeps >= idleSweeps:
		return c.s.cfg.MinCredits
	case short:
		return fair
	}
	return g
}

// BudgetInfo is the server's receive memory and the credits granted
// against it: what /metrics and lwio stat show (issue 20).
type BudgetInfo struct {
	// MaxBufferMemory is the configured budget in bytes, BufferSize the
	// memory one credit holds (a posted receive buffer).
	MaxBufferMemory int64
	BufferSize      int
	// Credits is the budget in credits; Granted the credits connections
	// hold now (more than Credits while new connections' minimal grants
	// overdraw it); Outstanding the requests in flight against them.
	Credits, Granted, Outstanding int
	// Connections is the number of authenticated connections.
	Connections int
	// RecvBuffers and RecvBytes are the receive buffers registered now,
	// posted, held by requests or spare, and their memory (RecvBytes also
	// counts the small AUTH receives of connections with queues of their
	// own). RecvQueues is
	// the number of receive queues they are posted to: one per shared
	// receive queue, one per connection that has its own.
	RecvBuffers int
	RecvBytes   int64
	RecvQueues  int
}

// Budget reports the memory budget and its use.
func (s *Server) Budget() BudgetInfo {
	bi := BudgetInfo{
		MaxBufferMemory: s.cfg.MaxBufferMemory,
		BufferSize:      s.cfg.bufferBytes(),
		Credits:         s.budget.Total(),
		Granted:         s.budget.Used(),
	}
	for _, c := range s.connList() {
		if g := c.openGrant(); g != nil {
			bi.Connections++
			bi.Outstanding += g.Outstanding()
		}
	}
	for _, p := range s.recvPools() {
		bi.RecvQueues++
		bi.RecvBuffers += p.usage()
		bi.RecvBytes += p.bytes()
	}
	return bi
}

// connList returns the server's connections at this moment.
func (s *Server) connList() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.conns))
}

// openGrant is c's credit grant while c is open (authenticated); nil
// before AUTH and once it closes.
func (c *conn) openGrant() *protocol.CreditGrant {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != stateOpen {
		return nil
	}
	return c.grant
}
