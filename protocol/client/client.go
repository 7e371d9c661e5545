// Package client is the LWIO client engine (seed 001, FIG. 2–17E): it
// discovers the providers it shares with a server (the negotiate over
// \PIPE\LWIO, handed in as a function so this package does not depend on
// the session channel), opens and mutually authenticates one or more RDMA
// connections, registers files by resume key, and runs reads, vectored
// reads, writes and vectored writes over them in interrupt or polling mode
// with server-managed credits. All methods are safe for concurrent use.
// See docs/engine.md.
package client

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/defaults"
	"github.com/lwiofs/lwiofs/internal/enum"
	"github.com/lwiofs/lwiofs/internal/quietlog"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
)

// Mode is how the server completes I/O requests (FIG. 8).
type Mode uint8

const (
	// Interrupt: the server completes a request with a SEND of a
	// STATUS_RESPONSE or, for a full read, RDMA WRITE WITH IMMEDIATE on the
	// last segment; the client's completion queue wakes it.
	Interrupt Mode = iota
	// Polling: the server RDMA-writes the IO_STATUS_BLOCK into client
	// memory; the client spins on it for SpinTime, then sends an INTERRUPT
	// request and sleeps until the server's next completion wakes it.
	Polling
	// Auto: each connection chooses per request by its load (seed 001:
	// polling for busy connections, interrupts for idle ones). See auto.go.
	Auto
)

var modeNames = [...]string{Interrupt: "interrupt", Polling: "polling", Auto: "auto"}

func (m Mode) String() string { return enum.Name(modeNames[:], m, "Mode") }

// Defaults for the zero values of Config.
const (
	DefaultCredits         = 32
	DefaultPoolMemory      = 32 << 20
	DefaultMaxCredits      = 64
	DefaultSpinTime        = 20 * time.Microsecond
	DefaultBounceThreshold = 1024
	DefaultMaxIO           = 1 << 20
	DefaultPageSize        = 4096
	DefaultAuthTimeout     = 5 * time.Second
)

// Config configures a Client.
type Config struct {
	// Providers are the local providers the client may use, in order of
	// preference. Required.
	Providers []transport.Provider
	// Negotiate runs the LWIO negotiate over \PIPE\LWIO (session.Tree's
	// Negotiate). Required.
	Negotiate func(ctx context.Context, req protocol.NegotiateRequest) (protocol.NegotiateResponse, error)
	// SessionID and SigningKey are the session's id and key (session.Client
	// SessionID and SessionKey): the server must return that SessionId and
	// sign its AUTH parameters with that key.
	SessionID  uint64
	SigningKey []byte
	// Cipher is the session's cipher when the session is sealed
	// (session.Client Sealed and Cipher): every connection then seals its
	// frames with keys derived from SigningKey, the negotiate Key and both
	// AUTH nonces (smbauth.DataSealKeys). CipherNone: not sealed.
	Cipher smbauth.Cipher
	// ClientName is sent in the negotiate ("" = the host name).
	ClientName string
	// Completion is the mode every request uses (zero = Interrupt).
	Completion Mode
	// Connections is the number of RDMA connections, each with its own
	// completion queue (0 = DefaultConnections(): one per CPU).
	Connections int
	// Credits is the number of credits asked for at AUTH per connection
	// (0 = DefaultCredits).
	Credits int
	// MaxCredits is the most credits a connection keeps; more offered by a
	// positive delta are reported unused (0 = DefaultMaxCredits).
	MaxCredits int
	// SpinTime is how long a polling-mode request spins on its status block
	// before it sends an INTERRUPT and sleeps (0 = DefaultSpinTime).
	SpinTime time.Duration
	// BounceThreshold: reads of at most this many bytes land in a slot's
	// pre-registered bounce buffer and are copied (0 = DefaultBounceThreshold).
	BounceThreshold int
	// PoolMemory bounds the registered data buffers the client keeps
	// between requests, over all its connections (issue 20; 0 =
	// DefaultPoolMemory, negative: unbounded). Buffers of requests in
	// flight are not counted: the credits bound those.
	PoolMemory int
	// SplitRead: a read of at least this many bytes, when at least two
	// connections have nothing in flight, goes as pieces of at least
	// SplitRead/2 bytes on those connections at once (split.go; 0 =
	// DefaultSplitRead, except where every connection shares its memory
	// with a server on this host and the session is not sealed, which
	// then never splits; negative: never split).
	SplitRead int
	// MaxIO is the largest read this client accepts in one RDMA transfer,
	// announced as its MaxRdmaWindowSize (0 = DefaultMaxIO).
	MaxIO int
	// PageSize is announced at AUTH and used by vectored requests
	// (0 = DefaultPageSize).
	PageSize int
	// AuthTimeout bounds connecting and authenticating each connection
	// (0 = DefaultAuthTimeout).
	AuthTimeout time.Duration
	// Logger receives connection events; nil is quiet.
	Logger logrus.FieldLogger
	// Counters receive the client's request counts, bytes and latencies;
	// nil gives the client counters of its own. A mount hands the same
	// Counters to every Client it dials, so they outlive reconnects.
	Counters *Counters
	// Transport shapes the connections (zero fields: queue depths sized to
	// the credits, provider defaults otherwise).
	Transport transport.Config
}

func (c Config) withDefaults() Config {
	defaults.Set(&c.Connections, DefaultConnections())
	defaults.Set(&c.Credits, DefaultCredits)
	if c.PoolMemory == 0 {
		c.PoolMemory = DefaultPoolMemory
	}
	defaults.Set(&c.MaxCredits, DefaultMaxCredits)
	c.MaxCredits = min(max(c.MaxCredits, c.Credits), maxSlots/2)
	c.Credits = min(c.Credits, c.MaxCredits)
	defaults.Set(&c.BounceThreshold, DefaultBounceThreshold)
	c.BounceThreshold = min(c.BounceThreshold, bounceSize)
	defaults.Set(&c.MaxIO, DefaultMaxIO)
	defaults.Set(&c.PageSize, DefaultPageSize)
	defaults.Set(&c.SpinTime, DefaultSpinTime)
	defaults.Set(&c.AuthTimeout, DefaultAuthTimeout)
	if c.ClientName == "" {
		c.ClientName, _ = os.Hostname()
	}
	return c
}

// DefaultConnections is one connection per CPU (seed 003: a completion
// queue per processor, each completion handled where it was issued), at
// least 2 and at most maxDefaultConnections.
func DefaultConnections() int { return min(max(runtime.NumCPU(), 2), maxDefaultConnections) }

// maxDefaultConnections caps the default on large hosts: each connection
// holds credits, and so receive buffers, on the server.
const maxDefaultConnections = 16

// ErrClosed is returned by calls on a closed Client or File.
var ErrClosed = errors.New("lwio client: closed")

// Client is a set of authenticated LWIO connections to one server for one
// session.
type Client struct {
	cfg   Config
	log   logrus.FieldLogger
	conns []*conn
	// splitAt is the read size from which ReadBuf splits (split.go's
	// splitDefault of Config.SplitRead); 0 or negative: never.
	splitAt int

	closeOnce sync.Once
	done      chan struct{} // closed when every connection is dead
	dead      atomic.Int32
	errMu     sync.Mutex
	err       error

	ctr *Counters
}

// New discovers the common providers, connects and authenticates
// cfg.Connections connections, and returns the client. It fails if no
// connection can be made.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if len(cfg.Providers) == 0 || cfg.Negotiate == nil {
		return nil, errors.New("lwio client: Config.Providers and Config.Negotiate are required")
	}
	cfg = cfg.withDefaults()
	log := quietlog.Or(cfg.Logger)
	cl := &Client{cfg: cfg, log: log, done: make(chan struct{}), ctr: cfg.Counters}
	if cl.ctr == nil {
		cl.ctr = new(Counters)
	}

	// FIG. 2: negotiate with the providers usable here.
	var key [16]byte
	if _, err := rand.Read(key[:]); err != nil {
		return nil, err
	}
	byName := map[string]transport.Provider{}
	var offer []transport.ProviderInfo
	for _, p := range cfg.Providers {
		if err := p.Available(); err != nil {
			log.WithField("provider", p.Name()).WithError(err).Info("lwio: provider unavailable")
			continue
		}
		if _, dup := byName[p.Name()]; dup {
			continue
		}
		byName[p.Name()] = p
		offer = append(offer, transport.ProviderInfo{Name: p.Name()})
	}
	if len(offer) == 0 {
		return nil, errors.New("lwio client: no usable provider")
	}
	resp, err := cfg.Negotiate(ctx, protocol.NewNegotiateRequest(cfg.ClientName, key, offer))
	if err != nil {
		return nil, fmt.Errorf("lwio client: negotiate: %w", err)
	}
	targets := preferred(resp.Providers, cfg.Providers, byName)
	if len(targets) == 0 {
		return nil, fmt.Errorf("lwio client: no common provider with %q", resp.SrvName)
	}

	// FIG. 5: connect and authenticate. Every connection goes to the
	// first common provider in our order of preference (its instances in
	// turn): a mount that can use verbs must not carry half its I/O over
	// softrdma. A connection that fails there tries the next target, so a
	// provider that is down costs one failed dial per connection, not the
	// data path. A negotiate Key authenticates one connection only (the
	// server refuses it a second time, so a captured AUTH cannot be
	// replayed), so every connection after the first asks the pipe for a
	// Key of its own.
	var firstErr error
	authKey, keyUsed := resp.Key, false
	nfirst := targets[0].group
conns:
	for len(cl.conns) < cfg.Connections {
		k := len(cl.conns)
		for try := 0; try < len(targets); try++ {
			t := targets[(k%nfirst+try)%len(targets)]
			if keyUsed {
				more, err := cfg.Negotiate(ctx, protocol.NewNegotiateRequest(cfg.ClientName, key, offer))
				if err != nil {
					if firstErr == nil {
						firstErr = fmt.Errorf("lwio client: negotiate: %w", err)
					}
					break conns
				}
				authKey = more.Key
			}
			keyUsed = true
			cctx, cancel := context.WithTimeout(ctx, cfg.AuthTimeout)
			c, err := dial(cctx, cl, k, t.p, t.addr, authKey)
			cancel()
			if err == nil {
				cl.conns = append(cl.conns, c)
				continue conns
			}
			log.WithFields(logrus.Fields{"provider": t.p.Name(), "addr": t.addr}).WithError(err).Warn("lwio: connection failed")
			if firstErr == nil {
				firstErr = err
			}
			if errors.Is(err, errAuth) {
				break conns // the server said no; another instance will too
			}
		}
		break // no target took this connection
	}
	if len(cl.conns) == 0 {
		return nil, firstErr
	}
	cl.splitAt = splitDefault(cfg.SplitRead, cfg.Cipher != smbauth.CipherNone, cl.conns)
	for _, c := range cl.conns {
		c.counted.Store(true)
		if !c.alive() {
			c.countDeath() // died between AUTH and now
		}
		go c.reap()
		log.WithFields(logrus.Fields{"provider": c.tc.Provider(), "remote": c.tc.RemoteAddr(), "credits": c.credits.Limit(), "mode": cfg.Completion}).Info("lwio: connected")
	}
	return cl, nil
}

// target is one place a connection can be dialled: a provider and one of
// its instances at the server. group is how many targets of that provider
// there are (the instances a connection index is spread over).
type target struct {
	p     transport.Provider
	addr  string
	group int
}

// preferred lists where connections go: the instances of every provider
// both ends have, grouped by provider in the client's order of preference
// (Config.Providers), each provider's instances in the server's order.
func preferred(offered []transport.ProviderInfo, mine []transport.Provider, byName map[string]transport.Provider) []target {
	var out []target
	for _, p := range mine {
		if byName[p.Name()] != p {
			continue // unavailable, or a duplicate name
		}
		start := len(out)
		for _, pi := range offered {
			if pi.Name != p.Name() {
				continue
			}
			for _, in := range pi.Instances {
				if addr, err := in.Addr(); err == nil {
					out = append(out, target{p: p, addr: addr})
				}
			}
		}
		for i := start; i < len(out); i++ {
			out[i].group = len(out) - start
		}
	}
	return out
}

// Conns describes the client's connections.
func (cl *Client) Conns() []ConnInfo {
	out := make([]ConnInfo, len(cl.conns))
	for i, c := range cl.conns {
		out[i] = c.info()
	}
	return out
}

// Providers names the provider of each connection.
func (cl *Client) Providers() []string {
	out := make([]string, len(cl.conns))
	for i, c := range cl.conns {
		out[i] = c.tc.Provider()
	}
	return out
}

// Done is closed when every connection has died (or Close was called): the
// caller should build a new Client. Err says why.
func (cl *Client) Done() <-chan struct{} { return cl.done }

// Err is the first connection failure, or nil.
func (cl *Client) Err() error {
	cl.errMu.Lock()
	defer cl.errMu.Unlock()
	return cl.err
}

func (cl *Client) connDied(err error) {
	cl.errMu.Lock()
	if cl.err == nil {
		cl.err = err
	}
	cl.errMu.Unlock()
	if int(cl.dead.Add(1)) == len(cl.conns) {
		cl.closeOnce.Do(func() { close(cl.done) })
	}
}

// MaxRead is the largest read one request carries; ReadAt splits larger
// ones, ReadBuf refuses them.
func (cl *Client) MaxRead() int { return cl.conns[0].maxRead }

// MaxWrite is the largest write one request carries.
func (cl *Client) MaxWrite() int { return cl.conns[0].maxWrite }

// Close disconnects every connection; outstanding requests fail at once.
func (cl *Client) Close() error {
	for _, c := range cl.conns {
		c.die(ErrClosed)
	}
	return nil
}

// pick returns the live connection with the most credits free. Ties go to
// the connection of the CPU the caller runs on (seed 003: per-processor
// queues; the requester reaps its own completion, so it is handled on
// that connection's queue by the thread that issued it), so requests from
// several CPUs spread over the connections, and a lone requester keeps to
// one connection, where the provider's acknowledgement of each answer
// rides on the next request.
func (cl *Client) pick() (*conn, error) {
	n := len(cl.conns)
	home := 0
	if n > 1 {
		home = currentCPU() % n
	}
	var best *conn
	bestLoad := 0
	for i := 0; i < n; i++ {
		c := cl.conns[(home+i)%n]
		if !c.alive() {
			continue
		}
		load := c.credits.Pending() - c.credits.Limit()
		if best == nil || load < bestLoad {
			best, bestLoad = c, load
		}
	}
	if best == nil {
		err := cl.Err()
		if err == nil {
			err = ErrClosed
		}
		return nil, &protocol.ConnectionError{Conn: "all", Err: err}
	}
	return best, nil
}
