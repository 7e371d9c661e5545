package session

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/defaults"
	"github.com/lwiofs/lwiofs/internal/quietlog"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/smbauth"
)

// ServerConfig configures a Server. Zero values are usable defaults except
// for Shares and Users, which must be filled for the server to be useful.
type ServerConfig struct {
	// ServerName is the server's name in the resume key context
	// (\\ServerName\share), the negotiate response and the NTLM target
	// info. Empty means os.Hostname().
	ServerName string
	// Domain is the NTLM target (domain) name. Empty means "LWIO".
	Domain string
	// Shares are the shares served; protocol/share opens them and does
	// every disk operation on them.
	Shares []share.Config
	// Users maps user names (matched case-insensitively, as NTLM does) to
	// NT hashes (smbauth.NTHash). Passwords are never kept.
	Users map[string][16]byte
	// Providers is the server's local RDMA provider list, intersected with
	// the client's in the \PIPE\LWIO negotiate. Nil means none in common.
	// Advertise replaces it.
	Providers []ProviderInfo
	// Logger receives connection-level events; nil means quiet.
	Logger logrus.FieldLogger
	// MaxInFlight bounds the requests one connection has in flight on the
	// server; a reader blocks beyond it. Zero means 64.
	MaxInFlight int
	// MaxHandles bounds the files and pipes one session may hold open;
	// beyond it OPEN answers STATUS_TOO_MANY_OPENED_FILES (EMFILE on the
	// client). Zero means DefaultMaxHandles.
	MaxHandles int
	// MaxUserHandles bounds the handles one user holds over all its
	// sessions (TOO_MANY_OPENED_FILES beyond it, EMFILE on that user's
	// mounts only). Zero means DefaultMaxUserHandles.
	MaxUserHandles int
	// MaxOpenFiles bounds the handles of all users together, so that the
	// server never runs out of descriptors (INSUFFICIENT_RESOURCES, ENFILE,
	// beyond it). Zero means three quarters of RLIMIT_NOFILE's soft limit,
	// leaving the rest for connections and the descriptors an operation
	// holds while it runs.
	MaxOpenFiles int
	// MaxPending bounds the connections that have not completed session
	// setup, in all (beyond it the oldest is closed to make room for a new
	// one); MaxPendingPerAddr those from one source address (beyond it a
	// new one is closed at accept). Zero means DefaultMaxPending and
	// DefaultMaxPendingPerAddr.
	MaxPending, MaxPendingPerAddr int
	// IdleTimeout closes a logged-on connection that sent nothing for
	// that long while nothing of it was in flight; a mount's keepalive
	// ECHO keeps a healthy idle session. Zero means DefaultIdleTimeout;
	// negative never.
	IdleTimeout time.Duration
	// LogonDelay and LogonDelayMax shape the logon throttle
	// (throttle.go): after n failures for a (user, source address),
	// attempts for it are LogonDelay·2^(n-1) apart, at most
	// LogonDelayMax; an address's attempts for any user a quarter of
	// that, at most a third. Zero means DefaultLogonDelay and
	// DefaultLogonDelayMax.
	LogonDelay, LogonDelayMax time.Duration
	// ShutdownTimeout bounds how long Close waits for requests in flight
	// (a stuck disk, a long lock wait) before it closes the connections
	// under them and returns. Zero means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// SetupTimeout bounds how long a connection may take to complete
	// session setup. Zero means 30 seconds.
	SetupTimeout time.Duration
	// WriteTimeout bounds one response write; a client that does not read
	// for that long is dropped. Zero means 30 seconds.
	WriteTimeout time.Duration
	// TrustedFabric offers a sealed session the RDMA providers whose
	// connections cannot seal (verbs); its file data then crosses the
	// fabric in clear. False offers it only providers that seal (softrdma).
	// The engine's server.Config.TrustedFabric must say the same.
	TrustedFabric bool
	// Encrypt is the server-wide sealing policy (seal.go); the zero value
	// EncryptIfRequired seals only sessions whose client requires it.
	Encrypt Encrypt
	// ShareEncrypt is a share's own sealing policy, by share name as in
	// Shares: desired seals the share's traffic, required also refuses
	// clients that cannot seal; a share not named (or off, if_required)
	// leaves it to Encrypt.
	ShareEncrypt map[string]Encrypt
	// Ciphers are the ciphers the server seals with, in order of
	// preference; nil means smbauth.DefaultCiphers.
	Ciphers []smbauth.Cipher
	// DisableOpenat2 forces the component-walking resolver used where
	// openat2(2) is missing. For tests and odd kernels; zero uses openat2.
	DisableOpenat2 bool
	// Accounts says which Unix account each user acts as (the account of
	// the same name by default; a map; a guest account). A server that
	// is not root acts as its own account for everyone.
	Accounts share.AccountsConfig
	// StateDir keeps what must survive a restart: the key that seals the
	// file identities clients re-open files by after one
	// (share.LoadIdentityKey; created mode 0700, the key 0600). Empty means
	// a new key per process: after a restart every file a client had open
	// is then ESTALE to it.
	StateDir string
	// DurableTimeout is how long a durable open, with its locks, outlives
	// its connection waiting for the client to reclaim it (REOPEN). Zero
	// means DefaultDurableTimeout (60 s); negative keeps none: every open
	// closes with its connection.
	DurableTimeout time.Duration
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("session: server closed")

// Server is the session channel's server side. It also implements the LWIO
// engine's Authority (SessionByKey, OpenByResumeKey).
type Server struct {
	cfg      ServerConfig
	log      logrus.FieldLogger
	auth     *smbauth.Server
	accounts *share.Accounts
	handles  *handleBudget
	pending  *pendingConns
	throttle *throttle
	closed   chan struct{}           // closed by Close: sleepers wake
	shares   map[string]*share.Share // by lower-cased name
	// shareEncrypt is ServerConfig.ShareEncrypt by lower-cased name.
	shareEncrypt map[string]Encrypt

	mu         sync.Mutex
	closing    bool
	listeners  map[net.Listener]struct{}
	conns      map[*serverConn]struct{}
	sessions   map[uint64]*serverSession
	lwioKeys   map[[16]byte]*serverSession
	resumeKeys map[[24]byte]*openFile
	durables   map[DurableID]*openFile // durable opens, live or parked (server_durable.go)
	connWG     sync.WaitGroup
	registrar  Registrar // set before Serve (SetRegistrar)

	lockTab *share.LockTable // every session's lock waits, by file

	nextSession atomic.Uint64
	nextConn    atomic.Uint64

	// What Stats reports of logons (stats.go).
	logonFailures   atomic.Uint64
	logonsThrottled atomic.Uint64
	throttleWait    atomic.Int64 // nanoseconds
}

// NewServer opens every share's root and returns a server ready to Serve.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.ServerName == "" {
		h, err := os.Hostname()
		if err != nil {
			h = "lwio"
		}
		cfg.ServerName = h
	}
	if cfg.Domain == "" {
		cfg.Domain = "LWIO"
	}
	defaults.Set(&cfg.MaxInFlight, 64)
	defaults.Set(&cfg.MaxHandles, DefaultMaxHandles)
	defaults.Set(&cfg.MaxUserHandles, DefaultMaxUserHandles)
	defaults.Set(&cfg.MaxOpenFiles, DefaultMaxOpenFiles())
	defaults.Set(&cfg.MaxPending, DefaultMaxPending)
	defaults.Set(&cfg.MaxPendingPerAddr, DefaultMaxPendingPerAddr)
	if cfg.IdleTimeout == 0 { // negative: no idle timeout
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	defaults.Set(&cfg.ShutdownTimeout, DefaultShutdownTimeout)
	defaults.Set(&cfg.SetupTimeout, 30*time.Second)
	defaults.Set(&cfg.WriteTimeout, 30*time.Second)
	s := &Server{
		cfg:          cfg,
		log:          quietlog.Or(cfg.Logger),
		shares:       map[string]*share.Share{},
		shareEncrypt: map[string]Encrypt{},
		listeners:    map[net.Listener]struct{}{},
		conns:        map[*serverConn]struct{}{},
		sessions:     map[uint64]*serverSession{},
		lwioKeys:     map[[16]byte]*serverSession{},
		resumeKeys:   map[[24]byte]*openFile{},
		handles:      newHandleBudget(cfg.MaxOpenFiles, cfg.MaxUserHandles),
		pending:      newPendingConns(cfg.MaxPending, cfg.MaxPendingPerAddr),
		throttle:     newThrottle(cfg.LogonDelay, cfg.LogonDelayMax),
		closed:       make(chan struct{}),
		durables:     map[DurableID]*openFile{},
		lockTab:      share.NewLockTable(),
	}
	users := map[string][16]byte{}
	for u, h := range cfg.Users {
		users[strings.ToLower(u)] = h
	}
	s.auth = smbauth.NewServer(smbauth.ServerConfig{
		TargetName:      cfg.Domain,
		NetbiosComputer: strings.ToUpper(cfg.ServerName),
		DNSDomain:       strings.ToLower(cfg.Domain),
		DNSComputer:     strings.ToLower(cfg.ServerName),
		Lookup: func(user, _ string) ([16]byte, bool) {
			h, ok := users[strings.ToLower(user)]
			return h, ok
		},
		DisableSeal: cfg.Encrypt == EncryptOff,
	})
	s.accounts = share.NewAccounts(cfg.Accounts)
	if !s.accounts.PerUser() {
		self := s.accounts.Self()
		s.log.WithFields(logrus.Fields{"account": self.Name, "uid": self.Uid, "gid": self.Gid}).
			Warn("cannot act per user (no CAP_SETUID and CAP_SETGID): every user acts as the server's own account, and the permission checks cannot tell users apart; if that account is root or overrides permission checks, only shares with allow_root accept users")
	}
	if umask := share.Umask(); umask != 0 {
		s.log.WithField("umask", fmt.Sprintf("%03o", umask)).Warn("server umask is not 0; modes of created files are corrected after creation")
	}
	idKey, err := identityKey(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	for _, c := range cfg.Shares {
		key := strings.ToLower(c.Name)
		if _, dup := s.shares[key]; dup {
			s.closeShares()
			return nil, fmt.Errorf("session: share %q listed twice", c.Name)
		}
		sh, err := share.Open(c, cfg.DisableOpenat2)
		if err != nil {
			s.closeShares()
			return nil, fmt.Errorf("session: %w", err)
		}
		sh.SetIdentityKey(idKey)
		s.shares[key] = sh
		if e, ok := cfg.ShareEncrypt[c.Name]; ok {
			s.shareEncrypt[key] = e
		}
		leasing, why := sh.Leasing()
		s.log.WithFields(logrus.Fields{"share": c.Name, "path": c.Path, "readonly": c.ReadOnly, "encrypt": s.shareEncrypt[key],
			"resolver": sh.Resolver(), "leases": leasing}).Debug("share ready")
		if !leasing && !c.NoLeases {
			s.log.WithError(why).WithField("share", c.Name).Warn("leases: off — the kernel cannot watch the share for local changes (fanotify with file identifiers, Linux 5.17); clients cache only for their attribute and entry timeouts")
		}
	}
	var seed [8]byte
	rand.Read(seed[:])
	// Session ids start at a random point so that they say nothing about
	// how many sessions the server has seen; they are never zero.
	s.nextSession.Store(binary.LittleEndian.Uint64(seed[:]) >> 16)
	return s, nil
}

func (s *Server) closeShares() {
	for _, sh := range s.shares {
		sh.Close()
	}
}

// Serve accepts connections on l until Close. It returns ErrServerClosed
// after Close, or the accept error that stopped it.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			if temporaryAcceptError(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.WithError(err).WithField("backoff", backoff).Warn("session: accept failed; retrying")
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		c := s.newConn(nc)
		ok, evicted, why := s.pending.admit(c)
		if why != "" {
			s.pending.logRefusal(s.log, c.addr, why)
		}
		if evicted != nil {
			evicted.nc.Close()
		}
		if !ok {
			nc.Close()
			continue
		}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			nc.Close()
			c.loggedOn()
			return ErrServerClosed
		}
		s.conns[c] = struct{}{}
		s.connWG.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// Close stops accepting, lets requests in flight finish and their answers
// go out, then closes every connection (ending their sessions, their open
// files, resume keys and LWIO keys) and the share roots. Requests still
// running after ShutdownTimeout (a disk that does not answer, a long lock
// wait) do not hold it: their connections are closed under them, and
// Close returns an error saying so, leaving the share roots open for
// them (the process is about to exit).
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	close(s.closed)
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.stopReading()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.connWG.Wait(); close(done) }()
	select {
	case <-done:
		s.closeParked()
		s.closeShares()
		return nil
	case <-time.After(s.cfg.ShutdownTimeout):
	}
	s.mu.Lock()
	n := len(s.conns)
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	select {
	case <-done:
		s.closeParked()
		s.closeShares()
		return nil
	case <-time.After(100 * time.Millisecond):
	}
	s.closeParked()
	return fmt.Errorf("session: %d connection(s) still had requests running %v after the shutdown began; closed under them", n, s.cfg.ShutdownTimeout)
}

// sleep waits d, or less if the server closes meanwhile (false then). A
// sleeping goroutine holds no thread.
func (s *Server) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.closed:
		return false
	}
}

// Advertise sets ServerConfig.Providers, the RDMA providers the
// \PIPE\LWIO negotiate offers, for a server whose LWIO listeners are opened
// after it (they need the engine, which needs this server as its
// Authority). Call it before Serve.
func (s *Server) Advertise(ps []ProviderInfo) { s.cfg.Providers = ps }

// SessionByKey returns the session a negotiate Key was issued to over
// \PIPE\LWIO, with its signing key (the NTLM exported session key). It is
// the LWIO server engine's way to authenticate an RDMA connection (FIG. 5,
// step 605).
func (s *Server) SessionByKey(key [16]byte) (id uint64, signingKey []byte, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.lwioKeys[key]
	if !ok {
		return 0, nil, false
	}
	return ss.id, append([]byte(nil), ss.key...), true
}

// DataCipher is the cipher the session's RDMA data connections seal with:
// the session's own when any of its traffic is sealed (the whole session,
// or a tree of a share that seals), CipherNone otherwise. The LWIO engine
// asks it at AUTH.
func (s *Server) DataCipher(sessionID uint64) smbauth.Cipher {
	s.mu.Lock()
	ss := s.sessions[sessionID]
	s.mu.Unlock()
	if ss == nil || !ss.sealed() {
		return smbauth.CipherNone
	}
	return ss.seal.cipher
}

// OpenByResumeKey resolves a resume key issued by FSCTL_SRV_REQUEST_RESUME_KEY
// on session sessionID to its open file (FIG. 7A: registration names the
// file by its resume key). An unknown key, a key issued on another session
// and the key of a closed handle all give STATUS_ACCESS_DENIED, so that
// nothing can be learnt by probing keys.
func (s *Server) OpenByResumeKey(sessionID uint64, key [24]byte) (share.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	of, ok := s.resumeKeys[key]
	if !ok || of.sess.id != sessionID || of.closed.Load() {
		return nil, protocol.StatusAccessDenied
	}
	return of.file, nil
}

// registerSession makes an authenticated session known.
func (s *Server) registerSession(ss *serverSession) {
	s.mu.Lock()
	s.sessions[ss.id] = ss
	s.mu.Unlock()
}

// endSession forgets a session with everything bound to it: its lock
// waits end, and its open files close — but for the durable ones, which
// are kept for a reconnect unless the client logged off (park).
func (s *Server) endSession(ss *serverSession) {
	s.mu.Lock()
	delete(s.sessions, ss.id)
	for _, k := range ss.lwioKeys {
		delete(s.lwioKeys, k)
	}
	s.mu.Unlock()
	ss.cancelWaits()
	ss.endLeases()
	ss.mu.Lock()
	opens := ss.handles
	ss.handles = map[Handle]*openFile{}
	ss.mu.Unlock()
	for _, of := range opens {
		if !s.park(ss, of) {
			s.closeOpen(of)
		}
	}
}

// closeOpen closes an open file: its locks are released, its resume key
// and durable id die with it.
func (s *Server) closeOpen(of *openFile) error {
	if of.closed.Swap(true) {
		return nil
	}
	s.closeFid(of)
	s.mu.Lock()
	if of.resumeKey != nil {
		delete(s.resumeKeys, *of.resumeKey)
	}
	if !of.durable.IsZero() && s.durables[of.durable] == of {
		delete(s.durables, of.durable)
	}
	if of.parked != nil {
		of.parked.Stop()
		of.parked = nil
	}
	s.mu.Unlock()
	s.handles.give(of.user)
	if of.file != nil {
		if of.locks != nil {
			of.locks.Release(of.file)
		}
		return of.file.Close()
	}
	return nil
}

// newHandle counts a handle against the user's and the server's limits
// (handleBudget) before open makes it — a user at its limit costs no
// descriptor — and registers it on the session (MaxHandles). open returns
// nil for the pipe. Every handle that holds a descriptor goes through it:
// OPEN, TMPFILE, a REOPEN by identity; a durable open reclaimed after a
// reconnect keeps the count it was opened with (it stays counted while
// parked, as it still holds its descriptor).
func (s *Server) newHandle(ss *serverSession, open func() (*share.OpenFile, error)) (Handle, *openFile, error) {
	if err := s.handles.take(ss.user); err != nil {
		ss.overLimit(s.log, err, s.handles)
		return 0, nil, err
	}
	f, err := open()
	if err != nil {
		s.handles.give(ss.user)
		return 0, nil, err
	}
	ss.mu.Lock()
	locks := ss.locks
	ss.mu.Unlock()
	of := &openFile{sess: ss, file: f, locks: locks, user: ss.user}
	h, err := ss.addHandle(of, s.cfg.MaxHandles)
	if err != nil {
		ss.overLimit(s.log, err, s.handles)
		if f != nil {
			f.Close()
		}
		s.handles.give(ss.user)
		return 0, nil, err
	}
	return h, of, nil
}

// DefaultMaxOpenFiles is ServerConfig.MaxOpenFiles's default: three
// quarters of the soft RLIMIT_NOFILE (which lwio-server raises to the hard
// limit at start), or DefaultMaxHandles when it cannot be read.
func DefaultMaxOpenFiles() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return DefaultMaxHandles
	}
	n := rl.Cur - rl.Cur/defaultMaxOpenFilesFactor
	if n > 1<<30 {
		n = 1 << 30
	}
	return int(n)
}

// temporaryAcceptError reports whether an Accept error is a passing
// condition the listener survives, as net/http's Server treats it: a
// timeout, or running out of descriptors or memory (EMFILE, ENFILE,
// ENOBUFS, ENOMEM — what a connection flood produces), or a connection
// that died before it was accepted (ECONNABORTED). Serving must not end
// for those.
func temporaryAcceptError(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
