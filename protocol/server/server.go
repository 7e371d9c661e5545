// Package server is the LWIO server engine (seed 001, FIG. 5–17E): it accepts
// RDMA connections on transport listeners, authenticates each one (AUTH must
// come first), registers files by resume key, serves READ and VEC_READ by
// RDMA WRITE and WRITE and VEC_WRITE from the SEND, completes requests in
// interrupt or polling mode, and manages credits under a server-wide budget.
//
// Everything it knows about sessions and open files comes through Authority,
// which the session channel implements; the engine imports neither it nor any
// file system code. See docs/engine.md.
package server

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/defaults"
	"github.com/lwiofs/lwiofs/internal/quietlog"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
)

// Authority is what the engine needs from the session layer;
// *session.Server implements it.
type Authority interface {
	// SessionByKey returns the session a negotiate Key was issued to over
	// \PIPE\LWIO, with its signing key (the session key from NTLM).
	SessionByKey(key [16]byte) (id uint64, signingKey []byte, ok bool)
	// OpenByResumeKey resolves a resume key on a session to its open file.
	// The key must have been issued on that session for a handle still open.
	OpenByResumeKey(sessionID uint64, key [24]byte) (share.File, error)
	// DataCipher is the cipher a session's data connections seal with
	// (smbauth.DataSealKeys), CipherNone when the session is not sealed.
	DataCipher(sessionID uint64) smbauth.Cipher
}

// Defaults for the zero values of Config.
const (
	DefaultAuthTimeout       = 5 * time.Second
	DefaultCredits           = 32
	DefaultMaxCredits        = 64
	DefaultMaxRdmaWindowSize = 1 << 20
	DefaultMaxRecvBufferSize = 128<<10 + protocol.HeaderSize
	DefaultWorkers           = 64
	DefaultPageSize          = 4096
	DefaultShutdownTimeout   = 5 * time.Second
	// DefaultSendQueueDepth is each connection's send queue
	// (Transport.SendQueueDepth's zero value).
	DefaultSendQueueDepth = 1024
)

// Config configures a Server. The zero value of every field but Authority
// picks the default named beside it.
type Config struct {
	// Authority resolves negotiate keys and resume keys. Required.
	Authority Authority
	// Logger receives one line per connection event; nil is quiet.
	Logger logrus.FieldLogger
	// AuthTimeout is how long a new connection has to authenticate
	// (0 = DefaultAuthTimeout).
	AuthTimeout time.Duration
	// Credits is the most credits granted to a connection at AUTH
	// (0 = DefaultCredits); a client asking for fewer gets what it asked.
	Credits int
	// MaxCredits is the most credits one connection may grow to through
	// delta-credit transactions (0 = DefaultMaxCredits; < Credits means
	// Credits).
	MaxCredits int
	// MaxBufferMemory is the server's receive memory in bytes: every
	// credit is a posted receive buffer (MaxRecvBufferSize, plus 4 KiB
	// that page-aligns write data), and all connections' credits together
	// stay within this, rebalanced as clients come and go (budget.go; 0 =
	// DefaultMaxBufferMemory, 32 MiB: 248 credits).
	MaxBufferMemory int64
	// CreditBudget, when set, is the budget in credits instead of
	// MaxBufferMemory's (tests).
	CreditBudget int
	// MinCredits is the grant a new connection always gets, even with the
	// budget spent (the others then give credits back), and what an idle
	// one keeps (0 = DefaultMinCredits; at most Credits).
	MinCredits int
	// MaxRdmaWindowSize is the most bytes one READ moves and the largest
	// VEC_READ (0 = DefaultMaxRdmaWindowSize).
	MaxRdmaWindowSize int
	// MaxRecvBufferSize is the size of each posted receive: the largest
	// message a client may send, header included; a longer one ends the
	// connection. A longer write comes fragmented (docs/wire.md,
	// "Fragmented writes"), a buffer's worth per message, up to
	// MaxRdmaWindowSize (0 = DefaultMaxRecvBufferSize: the header and
	// 128 KiB of data, so a 1 MiB write is 8 messages).
	MaxRecvBufferSize int
	// Workers is the number of disk operations run at once server-wide;
	// requests beyond it queue, and CANCEL completes queued ones
	// (0 = DefaultWorkers).
	Workers int
	// PageSize is announced in the AUTH parameters (0 = DefaultPageSize).
	PageSize int
	// NoImmediate makes interrupt-mode reads complete with a STATUS_RESPONSE
	// send rather than RDMA WRITE WITH IMMEDIATE on the last segment.
	NoImmediate bool
	// Transport shapes accepted connections (zero fields: SendQueueDepth
	// DefaultSendQueueDepth, RecvQueueDepth MaxCredits+8, provider
	// defaults otherwise).
	Transport transport.Config
	// ShutdownTimeout bounds how long Close waits for in-flight requests
	// (0 = DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// TrustedFabric lets a sealed session's connections on a provider that
	// cannot seal (verbs) carry data in clear; false refuses them at AUTH
	// (lwio.toml's trusted_fabric, docs/security.md).
	TrustedFabric bool
	// PrivateReceiveQueues gives every connection a receive queue of its
	// own instead of its device's shared one (lwio.toml's
	// shared_receive_queue = false): more memory per connection, but a
	// peer flooding the listener before AUTH cannot take the receives
	// posted for other clients' credits (docs/security.md).
	PrivateReceiveQueues bool
}

func (c Config) withDefaults() Config {
	defaults.Set(&c.Credits, DefaultCredits)
	defaults.Set(&c.MaxCredits, DefaultMaxCredits)
	c.MaxCredits = max(c.MaxCredits, c.Credits)
	defaults.Set(&c.MaxRdmaWindowSize, DefaultMaxRdmaWindowSize)
	defaults.Set(&c.MaxRecvBufferSize, DefaultMaxRecvBufferSize)
	defaults.Set(&c.MaxBufferMemory, DefaultMaxBufferMemory)
	defaults.Set(&c.CreditBudget, max(int(c.MaxBufferMemory/int64(c.bufferBytes())), 1))
	defaults.Set(&c.MinCredits, DefaultMinCredits)
	c.MinCredits = min(c.MinCredits, c.Credits)
	defaults.Set(&c.Workers, DefaultWorkers)
	defaults.Set(&c.PageSize, DefaultPageSize)
	defaults.Set(&c.AuthTimeout, DefaultAuthTimeout)
	defaults.Set(&c.ShutdownTimeout, DefaultShutdownTimeout)
	c.Transport.SendQueueDepth = cmp.Or(c.Transport.SendQueueDepth, DefaultSendQueueDepth)
	c.Transport.RecvQueueDepth = cmp.Or(c.Transport.RecvQueueDepth, c.MaxCredits+8)
	if c.Transport.MaxMessageSize != 0 && c.Transport.MaxMessageSize < c.MaxRdmaWindowSize {
		c.MaxRdmaWindowSize = c.Transport.MaxMessageSize
	}
	return c
}

// Server is the LWIO server engine. Its methods are safe for concurrent use.
type Server struct {
	cfg     Config
	log     logrus.FieldLogger
	budget  *protocol.CreditPool
	workers chan struct{}

	mu       sync.Mutex
	closed   bool
	sessions map[uint64]*session
	// usedKeys are the negotiate Keys that have authenticated a connection.
	// A Key is good for one connection: the AUTH parameters carry nothing
	// fresh, so without this the bytes of any AUTH seen on the wire would
	// authenticate a new connection as that session. Entries go once the
	// Authority no longer knows the Key (its session ended).
	usedKeys  map[[16]byte]struct{}
	sweepKeys int // len(usedKeys) at which the next sweep runs
	conns     map[*conn]struct{}
	listeners map[transport.Listener]struct{}
	wg        sync.WaitGroup // Serve loops and connections
	nextConn  atomic.Uint64

	ctr counters // stats.go

	// The memory budget's balancer (budget.go): contended is when growth
	// stops being capped at the fair share (unix ns), poke wakes the
	// balancer, authed counts authenticated connections.
	contended atomic.Int64
	poke      chan struct{}
	authed    atomic.Int32
	recvBufs  atomic.Int64 // receive buffers registered, posted, held or spare (recvpool.go)
	// pools are the receive buffer pools, shared or a connection's own;
	// srqs the shared ones by domain (nil: the domain cannot make one).
	pools map[*recvPool]struct{}
	srqs  map[transport.Domain]*recvPool
	// chooser is the QueueChooser of each listener Listen made.
	chooser map[transport.Listener]*listenQueues

	runq      chan *slot    // to an idle request goroutine (run.go)
	quit      chan struct{} // closed by Close: request goroutines exit
	closeOnce sync.Once
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("lwio server: closed")

// New returns a server; Serve it on one or more listeners.
func New(cfg Config) (*Server, error) {
	if cfg.Authority == nil {
		return nil, errors.New("lwio server: Config.Authority is required")
	}
	cfg = cfg.withDefaults()
	if cfg.MaxRecvBufferSize < protocol.HeaderSize+protocol.RDMARegionSize {
		return nil, fmt.Errorf("lwio server: MaxRecvBufferSize %d is too small", cfg.MaxRecvBufferSize)
	}
	if cfg.PageSize > 0xFFFF {
		return nil, fmt.Errorf("lwio server: PageSize %d does not fit the wire", cfg.PageSize)
	}
	log := quietlog.Or(cfg.Logger)
	s := &Server{
		cfg:       cfg,
		log:       log,
		budget:    protocol.NewCreditPool(cfg.CreditBudget),
		workers:   make(chan struct{}, cfg.Workers),
		sessions:  make(map[uint64]*session),
		usedKeys:  make(map[[16]byte]struct{}),
		sweepKeys: 64,
		conns:     make(map[*conn]struct{}),
		listeners: make(map[transport.Listener]struct{}),
		runq:      make(chan *slot),
		quit:      make(chan struct{}),
		poke:      make(chan struct{}, 1),
		pools:     make(map[*recvPool]struct{}),
		srqs:      make(map[transport.Domain]*recvPool),
		chooser:   make(map[transport.Listener]*listenQueues),
	}
	go s.balance()
	return s, nil
}

// TransportConfig is the connection shape listeners should be made with.
// A listener made with it alone gives each connection its own receive
// queue; Listen adds the shared ones (recvpool.go).
func (s *Server) TransportConfig() transport.Config {
	cfg := s.cfg.Transport
	cfg.TakeLent = true // the receive path reads lent WRITE data (lent.go)
	return cfg
}

// Listen listens on addr with provider p, shaped by TransportConfig, its
// connections taking their receives from their domain's shared receive
// queue unless Config.Transport.Queues names a chooser or
// Config.PrivateReceiveQueues is set. Pass the listener to Serve.
func (s *Server) Listen(p transport.Provider, addr string) (transport.Listener, error) {
	cfg := s.TransportConfig()
	var q *listenQueues
	if cfg.Queues == nil && !s.cfg.PrivateReceiveQueues {
		// Shared receive queues (recvpool.go).
		q = &listenQueues{s: s, pools: make(map[*recvPool]struct{})}
		cfg.Queues = q
	}
	l, err := p.Listen(addr, cfg)
	if err == nil && q != nil {
		s.mu.Lock()
		s.chooser[l] = q
		s.mu.Unlock()
	}
	return l, err
}

// Serve accepts connections on l until l fails or the server is closed. It
// closes l when it returns and returns ErrServerClosed after Close.
func (s *Server) Serve(l transport.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	q := s.chooser[l]
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		delete(s.chooser, l)
		s.mu.Unlock()
		l.Close()
	}()
	s.log.WithField("addr", l.Addr()).Info("lwio: serving")
	for {
		tc, err := l.Accept(contextBackground)
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			return err
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			tc.Close()
			return ErrServerClosed
		}
		c := newConn(s, tc, q)
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c.run()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Close stops accepting, lets in-flight requests finish (queued ones fail
// with STATUS_CANCELLED, new ones with STATUS_REQUEST_NOT_ACCEPTED) for up to
// ShutdownTimeout, then closes every connection and waits for them.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	for l := range s.listeners {
		l.Close()
	}
	conns := slices.Collect(maps.Keys(s.conns))
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.shutdown(s.cfg.ShutdownTimeout)
		}()
	}
	wg.Wait()
	s.wg.Wait()
	s.closeOnce.Do(func() { close(s.quit) })
	late := time.Now().Add(idleChosen) // no connection is being set up now
	for _, p := range s.recvPools() {
		s.dropIdle(p, late)
	}
	return nil
}

// Abort drops every connection at once, without letting requests finish:
// to clients it looks like a crash. The server goes on accepting.
func (s *Server) Abort() {
	for _, c := range s.connList() {
		c.fail(errors.New("aborted"))
	}
}

// NumConns is the number of live connections (for tests and status output).
func (s *Server) NumConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// ConnInfo describes one live connection, for logs and status commands.
type ConnInfo struct {
	Provider   string
	LocalAddr  string
	RemoteAddr string
	SessionID  uint64
	Credits    int
}

// Conns describes the live connections.
func (s *Server) Conns() []ConnInfo {
	conns := s.connList()
	out := make([]ConnInfo, len(conns))
	for i, c := range conns {
		out[i] = c.info()
	}
	return out
}

// session is the server's state for one authenticated session: its Fids,
// shared by every connection of the session (FIG. 7B: a Fid is scoped to
// the session that registered it).
type session struct {
	id   uint64
	key  []byte
	refs int // connections, under Server.mu

	mu   sync.RWMutex
	fids []*fidEntry // index fid-1
	free []uint16
}

// fidEntry is one registered file.
type fidEntry struct {
	fid      uint16
	file     share.File
	flags    uint32
	owner    any // RegisterFile's owner: CloseFile closes only its own
	mu       sync.Mutex
	closed   bool
	cancelCh chan struct{} // closed by CANCEL and CLOSE, then replaced
}

// cancelled returns the channel queued requests on the Fid watch.
func (f *fidEntry) cancelled() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cancelCh
}

// close marks the Fid closed (later requests find it so) and fails its
// queued requests; executing ones finish.
func (f *fidEntry) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.cancel()
}

// cancel fails the requests queued on the Fid now.
func (f *fidEntry) cancel() {
	f.mu.Lock()
	close(f.cancelCh)
	f.cancelCh = make(chan struct{})
	f.mu.Unlock()
}

// RegisterFile registers f on session sessionID with flagsAndAttributes,
// as REGISTER by resume key does (FIG. 7A/B), for the session channel's
// OPEN (session.Registrar, wired by fileserver): the client then has its
// Fid with the open's answer. owner names the open for CloseFile. ok is
// false when the session has no authenticated LWIO connection or its Fid
// table is full.
func (s *Server) RegisterFile(sessionID uint64, f share.File, flagsAndAttributes uint32, owner any) (uint16, bool) {
	s.mu.Lock()
	ss := s.sessions[sessionID]
	s.mu.Unlock()
	if ss == nil {
		return 0, false
	}
	return ss.registerOwned(f, flagsAndAttributes, owner)
}

// HasSession reports whether session sessionID has an authenticated LWIO
// connection, so that RegisterFile can succeed.
func (s *Server) HasSession(sessionID uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[sessionID] != nil
}

// CloseFile closes fid on session sessionID, as LWIO CLOSE does (FIG.
// 12A/B), if RegisterFile registered it for owner: the open it belonged
// to closed. A Fid closed and reused since is left alone.
func (s *Server) CloseFile(sessionID uint64, fid uint16, owner any) {
	s.mu.Lock()
	ss := s.sessions[sessionID]
	s.mu.Unlock()
	if ss == nil {
		return
	}
	if e := ss.unregisterIf(fid, func(e *fidEntry) bool { return e.owner != nil && e.owner == owner }); e != nil {
		e.close()
	}
}

// maxFids is the number of Fids a session can hold (Fid is 16 bits, 0 unused).
const maxFids = 0xFFFF

func (ss *session) register(file share.File, flags uint32) (uint16, bool) {
	return ss.registerOwned(file, flags, nil)
}

func (ss *session) registerOwned(file share.File, flags uint32, owner any) (uint16, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	e := &fidEntry{file: file, flags: flags, owner: owner, cancelCh: make(chan struct{})}
	if n := len(ss.free); n > 0 {
		e.fid = ss.free[n-1]
		ss.free = ss.free[:n-1]
		ss.fids[e.fid-1] = e
		return e.fid, true
	}
	if len(ss.fids) >= maxFids {
		return 0, false
	}
	ss.fids = append(ss.fids, e)
	e.fid = uint16(len(ss.fids))
	return e.fid, true
}

func (ss *session) lookup(fid uint16) *fidEntry {
	ss.mu.RLock()
	defer ss.mu.RUnlock()
	return ss.entry(fid)
}

// entry is fid's entry or nil; under ss.mu.
func (ss *session) entry(fid uint16) *fidEntry {
	if fid == 0 || int(fid) > len(ss.fids) {
		return nil
	}
	return ss.fids[fid-1]
}

// unregister recycles fid; it returns the entry or nil.
func (ss *session) unregister(fid uint16) *fidEntry {
	return ss.unregisterIf(fid, func(*fidEntry) bool { return true })
}

// unregisterIf recycles fid if its entry passes ok; it returns the entry
// or nil.
func (ss *session) unregisterIf(fid uint16, ok func(*fidEntry) bool) *fidEntry {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	e := ss.entry(fid)
	if e == nil || !ok(e) {
		return nil
	}
	ss.fids[fid-1] = nil
	ss.free = append(ss.free, fid)
	return e
}

// attach returns the session state for id, creating it on first use.
func (s *Server) attach(id uint64, key []byte) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[id]
	if ss == nil {
		ss = &session{id: id, key: key}
		s.sessions[id] = ss
	}
	ss.refs++
	return ss
}

// detach drops a connection's reference; the session's Fids go with the last.
func (s *Server) detach(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss.refs--
	if ss.refs == 0 {
		delete(s.sessions, ss.id)
	}
}

// claimKey marks a negotiate Key as having authenticated a connection; it
// reports false if the Key already had. When the set has doubled since the
// last sweep, Keys of sessions that have ended are forgotten.
func (s *Server) claimKey(key [16]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, used := s.usedKeys[key]; used {
		return false
	}
	s.usedKeys[key] = struct{}{}
	if len(s.usedKeys) >= s.sweepKeys {
		for k := range s.usedKeys {
			if _, _, ok := s.cfg.Authority.SessionByKey(k); !ok {
				delete(s.usedKeys, k)
			}
		}
		s.sweepKeys = max(64, 2*len(s.usedKeys))
	}
	return true
}
