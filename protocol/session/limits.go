package session

import (
	clist "container/list"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

// Limits that keep one user, or one unauthenticated peer, from taking the
// server: handles per user and for the whole server, connections that
// have not logged on yet (in all and per source address), and sessions
// idle after logon. Defaults are in ServerConfig's documentation.

// Defaults of the limits' zero values.
const (
	DefaultMaxHandles         = 16384
	DefaultMaxUserHandles     = 16384
	DefaultMaxPending         = 512
	DefaultMaxPendingPerAddr  = 64
	DefaultIdleTimeout        = 5 * time.Minute
	DefaultShutdownTimeout    = 4 * time.Second
	defaultMaxOpenFilesFactor = 4 // MaxOpenFiles: 3/4 of RLIMIT_NOFILE
)

// handleBudget counts open handles (files and pipes) per user and for the
// whole server. A handle is taken before the file is opened, so a user at
// its limit costs the server no descriptor.
type handleBudget struct {
	maxTotal, maxUser int

	mu      sync.Mutex
	total   int
	perUser map[string]int // by lower-cased logon name
}

func newHandleBudget(maxTotal, maxUser int) *handleBudget {
	return &handleBudget{maxTotal: maxTotal, maxUser: maxUser, perUser: map[string]int{}}
}

// take counts one more handle for user: TOO_MANY_OPENED_FILES (EMFILE on
// that user's mount) when the user holds its limit, INSUFFICIENT_RESOURCES
// (ENFILE) when the server does.
func (b *handleBudget) take(user string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.perUser[user] >= b.maxUser {
		return ntstatus.TooManyOpenedFiles
	}
	if b.total >= b.maxTotal {
		return protocol.StatusInsufficientResources
	}
	b.total++
	b.perUser[user]++
	return nil
}

// give returns a handle take counted.
func (b *handleBudget) give(user string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total--
	if b.perUser[user]--; b.perUser[user] <= 0 {
		delete(b.perUser, user)
	}
}

// held is how many handles user holds, and the server in all.
func (b *handleBudget) held(user string) (int, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.perUser[user], b.total
}

// pendingConns counts connections that have not completed session setup,
// in all and per source address. A connection from an address that holds
// its share already is closed at accept. When all the room is taken — a
// flood from many addresses — the oldest pending connection is closed to
// make room for the new one instead: a client that means to log on does
// so within milliseconds and is gone from the list, while connections held
// idle to fill it are the oldest, so a flood of them cannot starve logons.
type pendingConns struct {
	max, maxPerAddr int

	mu     sync.Mutex
	byAddr map[string]int
	order  *clist.List // of *serverConn, oldest first
	// refused counts refusals since the last log line, so that a flood
	// is logged once a second, not once per connection.
	refused    int
	lastLogged time.Time
}

func newPendingConns(max, maxPerAddr int) *pendingConns {
	return &pendingConns{max: max, maxPerAddr: maxPerAddr, byAddr: map[string]int{}, order: clist.New()}
}

// hostOf is the address part of a "host:port" remote address.
func hostOf(remote net.Addr) string {
	if remote == nil {
		return ""
	}
	s := remote.String()
	if h, _, err := net.SplitHostPort(s); err == nil {
		return h
	}
	return s
}

// admit counts a new connection, or says why it is refused; evicted is
// the oldest pending connection, taken out of the count to make room, for
// the caller to close.
func (p *pendingConns) admit(c *serverConn) (ok bool, evicted *serverConn, why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byAddr[c.addr] >= p.maxPerAddr {
		p.refused++
		return false, nil, "too many connections from this address have not logged on (max_pending_per_address)"
	}
	if p.order.Len() >= p.max {
		evicted = p.order.Remove(p.order.Front()).(*serverConn)
		evicted.pendingAt = nil
		evicted.notPending.Store(true)
		p.forget(evicted.addr)
		p.refused++
		why = "too many connections have not logged on (max_pending_connections): closed the oldest"
	}
	p.byAddr[c.addr]++
	c.pendingAt = p.order.PushBack(c)
	return true, evicted, why
}

// logRefusal logs refused connections at most once a second, with the
// count since the last line.
func (p *pendingConns) logRefusal(log logrus.FieldLogger, addr, why string) {
	p.mu.Lock()
	if time.Since(p.lastLogged) < time.Second {
		p.mu.Unlock()
		return
	}
	n := p.refused
	p.refused = 0
	p.lastLogged = time.Now()
	p.mu.Unlock()
	log.WithFields(logrus.Fields{"addr": addr, "refused": n}).Warn("connection refused at accept: " + why)
}

// done forgets a connection admit counted: it logged on, or it closed.
func (p *pendingConns) done(c *serverConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.pendingAt != nil {
		p.order.Remove(c.pendingAt)
		c.pendingAt = nil
	}
	p.forget(c.addr)
}

func (p *pendingConns) forget(addr string) {
	if p.byAddr[addr]--; p.byAddr[addr] <= 0 {
		delete(p.byAddr, addr)
	}
}

// counts is how many connections are pending, in all and from addr.
func (p *pendingConns) counts(addr string) (int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.order.Len(), p.byAddr[addr]
}

// idleWatch closes a logged-on connection that has received no frame for
// the idle timeout while nothing of it was in flight. A healthy idle
// mount keeps its session: its ECHO keepalive (every 15 s by default) is a
// frame like any other. One timer per connection, re-armed for the
// remaining time when it fires early; no goroutine waits.
type idleWatch struct {
	timeout time.Duration
	last    atomic.Int64 // unix nanoseconds of the last frame read
	busy    atomic.Int32 // requests running
	stopped atomic.Bool
	timer   *time.Timer
}

// start arms the watch; expire runs (once) when the connection has been
// idle for the timeout.
func (w *idleWatch) start(expire func(idle time.Duration)) {
	w.touch()
	var check func()
	check = func() {
		if w.stopped.Load() {
			return
		}
		idle := time.Duration(time.Now().UnixNano() - w.last.Load())
		if idle >= w.timeout && w.busy.Load() == 0 {
			expire(idle)
			return
		}
		w.timer.Reset(max(w.timeout-idle, w.timeout/8))
	}
	w.timer = time.AfterFunc(w.timeout, check)
}

func (w *idleWatch) touch() { w.last.Store(time.Now().UnixNano()) }

func (w *idleWatch) stop() {
	w.stopped.Store(true)
	if w.timer != nil {
		w.timer.Stop()
	}
}
