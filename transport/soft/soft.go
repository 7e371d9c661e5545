// Package soft is the software RDMA provider "softrdma": the verbs-shaped
// transport interface carried over TCP, on loopback or any network, or
// over an AF_UNIX socket between two processes of one host (local.go).
//
// It behaves like a NIC so protocol code cannot cheat (docs/transport.md):
// remote writes land only inside regions registered for remote write, by
// handle and bounds, or the initiator's work request fails with
// StatusRemoteAccess and the connection goes to error on both sides; a SEND
// that finds no posted receive waits the initiator's RNR timeout and then
// fails (its connection's own receive queue or a shared one, srq.go); a
// SEND longer than the posted buffer fails with a length error;
// send completions come only after the peer acknowledged placement; on
// disconnect every outstanding work request is flushed. Incoming data is
// placed by the provider's receive engine, read from the socket into the
// target memory, before the application hears of it: the engine runs in
// the connection's reader goroutine, or, while an application goroutine
// waits in CQ.Wait on the connection's own completion queue, in that
// goroutine (readside.go), never waiting for the application. Completion
// queues may be shared by several connections (cq.go).
package soft

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/quietlog"
	"github.com/lwiofs/lwiofs/transport"
)

// Name is the provider's name in the negotiate.
const Name = "softrdma"

// Options configure a Provider; the zero value is the production default.
type Options struct {
	// Logger receives connection events (fields provider, conn, why);
	// nil means quiet.
	Logger logrus.FieldLogger
	// Faults, when non-nil, injects faults into the provider's
	// connections (tests). See ParseFaults and EnvFaults.
	Faults *Faults
	// RNRTimeout is how long a SEND or WRITE WITH IMMEDIATE this provider
	// initiates may wait at the peer for a posted receive before it fails
	// with StatusRNRRetryExceeded (the receiver-not-ready retry). The peer
	// learns it in the connection's hello. Zero means 2 s.
	RNRTimeout time.Duration
	// TransportTimeout is how long transmitted work may go
	// unacknowledged, beyond RNRTimeout, before the connection fails with
	// StatusTransportError (a NIC's transport retry counter). Zero means
	// 10 s; negative disables the check.
	TransportTimeout time.Duration
	// HandshakeTimeout bounds the hello exchange of an accepted
	// connection. Zero means 10 s.
	HandshakeTimeout time.Duration
	// SocketBuffer sets a TCP connection's SO_SNDBUF and SO_RCVBUF, and a
	// same-host unix socket's SO_SNDBUF (its receiver has no buffer of its
	// own). Zero leaves TCP to the kernel's autotuning, which on Linux
	// grows larger than a fixed size may, and gives a unix socket
	// localBuffer (local.go).
	SocketBuffer int
	// TCPOnly keeps every connection on TCP: a listener offers no
	// same-host unix socket, a dialer takes none (local.go).
	TCPOnly bool
	// NoSharedMemory keeps same-host connections off shared memory
	// (shm.go): a dialer keeps its registered memory in Go memory and
	// shares none, a listener maps none; every byte crosses the socket.
	NoSharedMemory bool
	// ArenaSize is the size of a dialer's shared-memory arena (address
	// space; pages are allocated as regions are registered). Zero means
	// 4 GiB, the most a listener maps. Regions that do not fit are Go
	// memory and cross the socket.
	ArenaSize int64
	// NoPipes keeps a same-host connection's frames on the unix socket;
	// by default they move on to two pipes when the peer's do too
	// (local_pipe.go): half the round trip of a small message.
	NoPipes bool
}

func (o Options) withDefaults() Options {
	if o.RNRTimeout == 0 {
		o.RNRTimeout = 2 * time.Second
	}
	if o.TransportTimeout == 0 {
		o.TransportTimeout = 10 * time.Second
	}
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	return o
}

// Provider is the softrdma provider. It has one protection domain, which
// every connection it makes reports as its Domain.
type Provider struct {
	opts   Options
	log    logrus.FieldLogger
	pd     *domain
	nconns atomic.Int64 // connections made, for Faults.Conns
	// sameHost is sameHost (local.go); a test makes a peer on this host
	// stand for one on another.
	sameHost func(*net.TCPConn) bool
	// arenaOnce makes the shared-memory arena at the first same-host
	// dial (arenaFor); arenaHook, in tests, replaces the memfd and size
	// a dialer passes with a hostile one.
	arenaOnce sync.Once
	arenaHook func(*arena) (fd int, size int64)
	// shmMinCopy and shmMinRef are shmwire.go's thresholds (tests lower
	// them); shmCopies and shmRefs count WRITEs copied into a peer's arena
	// and SEND references copied out of one.
	shmMinCopy, shmMinRef int
	shmCopies, shmRefs    atomic.Int64
	// shmFills counts fills of a peer's arena in place (shmfill.go).
	shmFills atomic.Int64
	// shmLent counts SEND tails left lent in a peer's arena, shmPins
	// those read where they are (shmlend.go).
	shmLent, shmPins atomic.Int64
	// shmCopyHook, in tests, runs in each copy into a peer's arena
	// between taking the slot and copying.
	shmCopyHook func()
	// shmLocalToo, in tests, puts local-only regions in the arena too, so
	// that a suite's SENDs from them go by reference.
	shmLocalToo bool
	// pipeConns bounds a listener's connections on pipes (0:
	// maxPipeConns), and pipeWant, if set, replaces the pipe size a
	// listener needs (pipeSlots, local_pipe.go): tests lower the one and
	// raise the other.
	pipeConns int
	pipeWant  func() int
}

var _ transport.Provider = (*Provider)(nil)

// New returns a provider with opts.
func New(opts Options) *Provider {
	opts = opts.withDefaults()
	return &Provider{opts: opts, log: quietlog.Or(opts.Logger), pd: newDomain(), sameHost: sameHost,
		shmMinCopy: shmMinCopy, shmMinRef: shmMinRef}
}

// Name returns "softrdma".
func (p *Provider) Name() string { return Name }

// Available always reports nil: the provider needs only TCP.
func (p *Provider) Available() error { return nil }

// Domain returns the provider's protection domain, so memory can be
// registered before any connection exists.
func (p *Provider) Domain() transport.Domain { return p.pd }

// Dial connects to a softrdma listener at addr.
func (p *Provider) Dial(ctx context.Context, addr string, cfg transport.Config) (transport.Conn, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("softrdma: dial %s: %w", addr, err)
	}
	tc := nc.(*net.TCPConn)
	stop := context.AfterFunc(ctx, func() { _ = tc.SetDeadline(time.Unix(1, 0)) })
	var s sock = tc
	local := !p.opts.TCPOnly && p.sameHost(tc)
	var a *arena
	if local {
		a = p.arenaFor()
	}
	peer, err := p.handshake(tc, cfg, local, a != nil)
	if err == nil && peer.Flags&helloLocal != 0 && local {
		s, err = p.takeOffer(ctx, tc)
	}
	shm := false
	if uc, ok := s.(*net.UnixConn); ok && err == nil && a != nil && peer.Flags&helloShm != 0 {
		shm, err = p.offerArena(ctx, uc, a)
	}
	if uc, ok := s.(*net.UnixConn); ok && err == nil && p.pipesWith(peer) {
		var ps sock
		if ps, err = takePipes(uc, time.Now().Add(p.opts.HandshakeTimeout)); err == nil {
			s = ps
		}
	}
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err == nil && s == tc {
		err = tc.SetDeadline(time.Time{})
	}
	if err != nil {
		if s != nil {
			_ = s.Close()
		}
		_ = tc.Close()
		return nil, fmt.Errorf("softrdma: dial %s: %w", addr, err)
	}
	c, err := p.newConn(s, tc, cfg, peer, shmEnds{out: shm, lend: shm && peer.Flags&helloLend != 0})
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("softrdma: dial %s: %w", addr, err)
	}
	return c, nil
}

// Listen listens on addr ("ip:port"; port 0 picks one).
func (p *Provider) Listen(addr string, cfg transport.Config) (transport.Listener, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("softrdma: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{p: p, ln: ln.(*net.TCPListener), cfg: cfg,
		ready: make(chan *conn), ctx: ctx, cancel: cancel, closed: ctx.Done()}
	l.pipes.max = int32(cmp.Or(p.pipeConns, maxPipeConns))
	l.pipes.want = pipeWant
	if p.pipeWant != nil {
		l.pipes.want = p.pipeWant
	}
	if !p.opts.TCPOnly {
		l.local = l.listenLocal()
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

func checkConfig(cfg transport.Config) error {
	cfg = cfg.WithDefaults()
	if cfg.SendQueueDepth < 0 || cfg.RecvQueueDepth < 0 || cfg.MaxSGE < 0 ||
		cfg.MaxMessageSize < 0 || int64(cfg.MaxMessageSize) > 1<<32-1 {
		return fmt.Errorf("softrdma: config out of range: %+v", cfg)
	}
	return nil
}

// handshake exchanges hellos, ours with helloLocal if local and helloShm
// if shm; the deadline must be set (and cleared) by the caller.
func (p *Provider) handshake(tc *net.TCPConn, cfg transport.Config, local, shm bool) (hello, error) {
	_ = tc.SetNoDelay(true)
	if n := p.opts.SocketBuffer; n > 0 {
		_ = tc.SetReadBuffer(n)
		_ = tc.SetWriteBuffer(n)
	}
	var b [helloSize]byte
	h := hello{RNRTimeout: p.opts.RNRTimeout, MaxMessageSize: uint32(cfg.WithDefaults().MaxMessageSize)}
	if local {
		h.Flags = helloLocal
		if shm {
			h.Flags |= helloShm
			if cfg.TakeLent {
				h.Flags |= helloLend
			}
		}
		if p.pipes() {
			h.Flags |= helloPipe
		}
	}
	h.encode(b[:])
	if _, err := tc.Write(b[:]); err != nil {
		return hello{}, err
	}
	if _, err := io.ReadFull(tc, b[:]); err != nil {
		return hello{}, err
	}
	var peer hello
	if err := peer.decode(b[:]); err != nil {
		return hello{}, err
	}
	return peer, nil
}

// pipesWith reports whether the same-host path with peer goes on pipes:
// both hellos carry helloPipe.
func (p *Provider) pipesWith(peer hello) bool { return p.pipes() && peer.Flags&helloPipe != 0 }

// pipes reports whether p offers or accepts pipes: not with NoPipes, nor
// on a kernel whose pipes take no RWF_NOWAIT (local_pipe.go).
func (p *Provider) pipes() bool { return !p.opts.NoPipes && pipesNoWait() }

// newConn starts a connection on s, which is tc, the unix socket the
// same-host step moved to, or the pipes passed over it; tc's addresses
// name it either way.
func (p *Provider) newConn(s sock, tc *net.TCPConn, cfg transport.Config, peer hello, shm shmEnds) (*conn, error) {
	qs, err := p.chooseQueues(cfg)
	if err != nil {
		return nil, err
	}
	var f *Faults
	if p.opts.Faults != nil {
		if n := p.nconns.Add(1); p.opts.Faults.Conns <= 0 || n <= int64(p.opts.Faults.Conns) {
			f = p.opts.Faults
		}
	}
	return newConn(p, s, tc, cfg, peer, f, qs, shm)
}

// queues are the shared queues Config.Queues chose for a connection,
// checked and attached.
type queues struct {
	send, recv *cq
	srq        *srq
}

// chooseQueues asks Config.Queues and checks that what it names was made
// by this provider's domain.
func (p *Provider) chooseQueues(cfg transport.Config) (queues, error) {
	var qs queues
	if cfg.Queues == nil {
		return qs, nil
	}
	tq, err := cfg.Queues.ChooseQueues(p.pd)
	if err != nil {
		return qs, fmt.Errorf("choosing the connection's queues: %w", err)
	}
	cqOf := func(what string, q transport.SharedCQ) (*cq, error) {
		if q == nil {
			return nil, nil
		}
		c, ok := q.(*cq)
		if !ok || c.pd != p.pd || c.owner != nil {
			return nil, fmt.Errorf("%s is not a completion queue made by this provider's QueueDomain.CreateCQ", what)
		}
		return c, nil
	}
	if qs.send, err = cqOf("Queues.SendCQ", tq.SendCQ); err != nil {
		return queues{}, err
	}
	if qs.recv, err = cqOf("Queues.RecvCQ", tq.RecvCQ); err != nil {
		return queues{}, err
	}
	if qs.recv == nil {
		qs.recv = qs.send
	}
	if tq.SRQ != nil {
		s, ok := tq.SRQ.(*srq)
		if !ok || s.pd != p.pd {
			return queues{}, errors.New("Queues.SRQ is not a shared receive queue made by this provider's QueueDomain.CreateSRQ")
		}
		qs.srq = s
	}
	return qs, nil
}

// listener accepts TCP connections and runs each hello in its own
// goroutine, so a silent client cannot hold up the others.
type listener struct {
	p     *Provider
	ln    *net.TCPListener
	cfg   transport.Config
	ready chan *conn
	// ctx ends (closed is ctx.Done()) at Close: the accept loop and the
	// pending handshakes stop.
	ctx    context.Context
	cancel context.CancelFunc
	closed <-chan struct{}
	wg     sync.WaitGroup
	// hellos are the connections whose hello is in progress, oldest first.
	hellos helloTable
	// local is the same-host unix socket; nil with TCPOnly or when it
	// could not be bound.
	local *localListener
	// pipes counts the connections on pipes (local_pipe.go).
	pipes pipeSlots
}

// maxHandshakes bounds hellos in progress at once. When the table is full
// the oldest hello is abandoned to make room: a peer that connects and says
// nothing must not be able to hold the listener for HandshakeTimeout by
// opening maxHandshakes sockets.
const maxHandshakes = 64

// helloTable tracks the sockets whose hello is in progress, oldest first.
type helloTable struct {
	mu    sync.Mutex
	conns []*net.TCPConn
}

func (h *helloTable) add(tc *net.TCPConn) {
	h.mu.Lock()
	h.conns = append(h.conns, tc)
	h.mu.Unlock()
}

// remove forgets tc; it reports false if tc was already evicted.
func (h *helloTable) remove(tc *net.TCPConn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, c := range h.conns {
		if c == tc {
			h.conns = append(h.conns[:i], h.conns[i+1:]...)
			return true
		}
	}
	return false
}

// evictOldest cuts the oldest hello short: its deadline passes at once, so
// its handshake fails and frees its slot. It returns the evicted socket.
func (h *helloTable) evictOldest() *net.TCPConn {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.conns) == 0 {
		return nil
	}
	tc := h.conns[0]
	h.conns = h.conns[1:]
	_ = tc.SetDeadline(time.Unix(1, 0))
	return tc
}

func (l *listener) acceptLoop() {
	defer l.wg.Done()
	sem := make(chan struct{}, maxHandshakes)
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.closed:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			l.p.log.WithError(err).Warn("softrdma: accept failed")
			select {
			case <-l.closed:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			if old := l.hellos.evictOldest(); old != nil {
				l.p.log.WithField("peer", old.RemoteAddr().String()).Info("softrdma: hello table full; dropped the oldest hello in progress")
			}
			select {
			case sem <- struct{}{}:
			case <-l.closed:
				_ = nc.Close()
				return
			}
		}
		tc := nc.(*net.TCPConn)
		// The deadline before the table: an eviction (a past deadline)
		// must not be undone by a hello goroutine that starts after it.
		_ = tc.SetDeadline(time.Now().Add(l.p.opts.HandshakeTimeout))
		l.hellos.add(tc)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() { <-sem }()
			l.admit(tc)
		}()
	}
}

func (l *listener) admit(tc *net.TCPConn) {
	stop := context.AfterFunc(l.ctx, func() { _ = tc.SetDeadline(time.Unix(1, 0)) })
	var s sock = tc
	local := l.local != nil && l.p.sameHost(tc)
	shmOK := local && !l.p.opts.NoSharedMemory
	peer, err := l.p.handshake(tc, l.cfg, local, shmOK)
	if err == nil && peer.Flags&helloLocal != 0 && local {
		s, err = l.local.serveOffer(tc)
	}
	var pa *peerArena
	if uc, ok := s.(*net.UnixConn); ok && err == nil && shmOK && peer.Flags&helloShm != 0 {
		pa, err = l.acceptArena(uc)
	}
	if uc, ok := s.(*net.UnixConn); ok && err == nil && l.p.pipesWith(peer) {
		var ps sock
		if ps, err = servePipes(uc, &l.pipes, l.p.log); err == nil {
			s = ps
		}
	}
	stop()
	if !l.hellos.remove(tc) && err == nil {
		err = errors.New("evicted: hello table full")
	}
	if err == nil && s == tc {
		err = tc.SetDeadline(time.Time{})
	}
	if err != nil {
		l.p.log.WithError(err).WithField("peer", tc.RemoteAddr().String()).Info("softrdma: handshake failed")
		pa.unmap()
		if s != nil {
			_ = s.Close()
		}
		_ = tc.Close()
		return
	}
	c, err := l.p.newConn(s, tc, l.cfg, peer, shmEnds{peer: pa})
	if err != nil {
		l.p.log.WithError(err).WithField("peer", tc.RemoteAddr().String()).Warn("softrdma: connection refused")
		pa.unmap()
		_ = s.Close()
		return
	}
	select {
	case l.ready <- c:
	case <-l.closed:
		_ = c.Close()
	}
}

func (l *listener) Accept(ctx context.Context) (transport.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.closed:
		return nil, transport.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *listener) Addr() string { return l.ln.Addr().String() }

// Close stops accepting; connections already accepted stay up.
func (l *listener) Close() error {
	l.cancel()
	_ = l.ln.Close()
	if l.local != nil {
		l.local.close()
	}
	l.wg.Wait()
	return nil
}
