// Package fileserver builds a complete lwiofs server in one process from
// one Config: the session channel (protocol/session, which opens the shares
// through protocol/share) on a TCP listener, the LWIO engine
// (protocol/server) on RDMA provider listeners, the provider list the
// \PIPE\LWIO negotiate offers — worked out from what those listeners
// advertise — and one shutdown order. cmd/lwio-server, test/hostile's rig
// and fs's tests all build their servers with Start and differ only in the
// Config, as every go-fuse mount is built by fs.Mount from options.
package fileserver

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/quietlog"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/transport"
)

// Config is a whole server. Zero fields keep the defaults of the session
// server and the engine.
type Config struct {
	// Session configures the session channel and names the shares and
	// users. Providers is filled in from Listeners.
	Session session.ServerConfig
	// Engine configures the LWIO engine. Authority is filled in: the
	// session server.
	Engine server.Config
	// SessionAddr is the session channel's TCP address; "127.0.0.1:0"
	// picks a free port (SessionAddr reports it).
	SessionAddr string
	// Listeners are the engine's RDMA listeners, in the order the
	// negotiate prefers their providers (the first listener's provider
	// first). None: clients move file data over the session channel.
	Listeners []Listener
	// WrapFile, when not nil, wraps every file the engine registers — a
	// test hook to hold requests or count registrations.
	WrapFile func(share.File) share.File
	// Logger receives listener events (a listener failing and served
	// again); nil is quiet.
	Logger logrus.FieldLogger
	// MetricsAddr, when not empty, is the TCP address where the
	// Prometheus text exposition is served at /metrics (metrics.go).
	MetricsAddr string
}

// Listener is one LWIO listener to open: a provider and an address
// ("host:0" picks a free port).
type Listener struct {
	Provider transport.Provider
	Addr     string
	// Advertise, when not empty, is what the negotiate offers for this
	// listener instead of the addresses it listens on (a NAT or a port
	// forward in between).
	Advertise []transport.Instance
}

// ListenerInfo is an open LWIO listener: its provider, the address it
// listens on and what the negotiate advertises for it.
type ListenerInfo struct {
	Provider   string
	Addr       string
	Advertised []transport.Instance
	// Seals: the provider's connections can seal (transport.ProviderSeals).
	Seals bool
}

// Server is a running server.
type Server struct {
	sess     *session.Server
	engine   *server.Server
	sl       net.Listener
	lls      []transport.Listener
	info     []ListenerInfo
	log      logrus.FieldLogger
	stopping chan struct{}
	wg       sync.WaitGroup
	once     sync.Once

	metrics     *Metrics
	httpSrv     *http.Server // serves metrics at MetricsAddr, or nil
	metricsAddr string
}

// Start opens the shares and every listener and serves them until Close.
// Nothing is left open when it fails.
func Start(cfg Config) (*Server, error) {
	s := &Server{log: quietlog.Or(cfg.Logger), stopping: make(chan struct{})}
	// The session channel's port first: a taken port is the likeliest
	// start-up error.
	var err error
	if s.sl, err = net.Listen("tcp", cfg.SessionAddr); err != nil {
		return nil, fmt.Errorf("session channel: %w", err)
	}
	if s.sess, err = session.NewServer(cfg.Session); err != nil {
		s.sl.Close()
		return nil, err
	}
	ec := cfg.Engine
	ec.Authority = s.sess
	if cfg.WrapFile != nil {
		ec.Authority = wrapping{s.sess, cfg.WrapFile}
	}
	if s.engine, err = server.New(ec); err != nil {
		s.abort()
		return nil, fmt.Errorf("LWIO engine: %w", err)
	}
	// OPEN registers files with the engine when the client asks, so the
	// data path has its Fid with the open's answer.
	s.sess.SetRegistrar(registrar{s.engine, cfg.WrapFile})
	for _, l := range cfg.Listeners {
		if err := s.listen(l); err != nil {
			s.abort()
			return nil, err
		}
	}
	s.metrics = newMetrics(s)
	if cfg.MetricsAddr != "" {
		if err := s.serveMetrics(cfg.MetricsAddr); err != nil {
			s.abort()
			return nil, err
		}
	}
	s.sess.Advertise(providers(s.info))
	s.serve("session", s.sl.Addr().String(), func() error {
		if err := s.sess.Serve(s.sl); !errors.Is(err, session.ErrServerClosed) {
			return err
		}
		return nil
	})
	for i, l := range s.lls {
		s.serve(s.info[i].Provider, s.info[i].Addr, func() error {
			if err := s.engine.Serve(l); !errors.Is(err, transport.ErrClosed) && !errors.Is(err, server.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	return s, nil
}

// listen opens one LWIO listener and works out what the negotiate
// advertises for it.
func (s *Server) listen(l Listener) error {
	name := l.Provider.Name()
	tl, err := s.engine.Listen(l.Provider, l.Addr)
	if err != nil {
		return fmt.Errorf("%s listener %s: %w", name, l.Addr, err)
	}
	ins, err := instances(tl.Addr())
	if len(l.Advertise) > 0 {
		ins, err = l.Advertise, nil
	}
	if err != nil {
		tl.Close()
		return fmt.Errorf("%s listener %s: %w", name, l.Addr, err)
	}
	s.lls = append(s.lls, tl)
	s.info = append(s.info, ListenerInfo{Provider: name, Addr: tl.Addr(), Advertised: ins, Seals: transport.ProviderSeals(l.Provider)})
	return nil
}

// abort undoes a Start that failed half way.
func (s *Server) abort() {
	s.sl.Close()
	for _, l := range s.lls {
		l.Close()
	}
	if s.engine != nil {
		s.engine.Close()
	}
	s.sess.Close()
}

// serve runs one listener's Serve in the background, served again when it
// fails (see keepServing).
func (s *Server) serve(what, addr string, serve func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		keepServing(s.log.WithFields(logrus.Fields{"listener": what, "addr": addr}), s.stopping, serve)
	}()
}

// keepServing runs serve until it returns nil (the server closed) or
// stopping is closed. An accept error — EMFILE under a connection flood,
// say — is logged and serving resumes after a backoff: one bad moment on a
// listener must not end the server for everyone.
func keepServing(log logrus.FieldLogger, stopping <-chan struct{}, serve func() error) {
	backoff := 10 * time.Millisecond
	for {
		err := serve()
		if err == nil {
			return
		}
		select {
		case <-stopping:
			return
		default:
		}
		log.WithError(err).WithField("retry_in", backoff.String()).Error("listener failed; serving it again")
		select {
		case <-stopping:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// Close stops accepting everywhere, lets in-flight requests finish — the
// LWIO engine's and the session channel's at once, each bounded by its
// ShutdownTimeout — then ends the sessions (their open files, resume keys
// and LWIO keys) and closes the shares. cmd/lwio-server bounds the whole
// of it again, so that SIGTERM stops the server whatever its clients do.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		close(s.stopping)
		for _, l := range s.lls {
			l.Close()
		}
		if s.httpSrv != nil {
			s.httpSrv.Close()
		}
		var engineErr error
		engineDone := make(chan struct{})
		go func() { engineErr = s.engine.Close(); close(engineDone) }()
		sessErr := s.sess.Close()
		<-engineDone
		err = errors.Join(engineErr, sessErr)
		s.wg.Wait()
	})
	return err
}

// Session is the session server.
func (s *Server) Session() *session.Server { return s.sess }

// Engine is the LWIO engine.
func (s *Server) Engine() *server.Server { return s.engine }

// SessionAddr is the session channel's listening address.
func (s *Server) SessionAddr() string { return s.sl.Addr().String() }

// Listeners are the LWIO listeners, in Config order.
func (s *Server) Listeners() []ListenerInfo { return s.info }

// providers is what the negotiate offers: one ProviderInfo per provider
// name, in the order the names first appear, with the instances of every
// listener of that provider.
func providers(ls []ListenerInfo) []transport.ProviderInfo {
	var out []transport.ProviderInfo
	at := map[string]int{}
	for _, l := range ls {
		i, ok := at[l.Provider]
		if !ok {
			i = len(out)
			at[l.Provider] = i
			out = append(out, transport.ProviderInfo{Name: l.Provider, Seals: l.Seals})
		}
		out[i].Instances = append(out[i].Instances, l.Advertised...)
	}
	return out
}

// instances is what the negotiate advertises for a listener at addr: the
// address itself, or for a wildcard every local address (loopback last),
// since a client cannot connect to 0.0.0.0.
func instances(addr string) ([]transport.Instance, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsUnspecified() {
		in, err := transport.InstanceFor(addr)
		if err != nil {
			return nil, err
		}
		return []transport.Instance{in}, nil
	}
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out, loop []transport.Instance
	for _, a := range ifaddrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLinkLocalUnicast() || (ip.To4() != nil && ipn.IP.To4() == nil) {
			continue
		}
		in, err := transport.InstanceFor(net.JoinHostPort(ipn.IP.String(), port))
		if err != nil {
			continue
		}
		if ipn.IP.IsLoopback() {
			loop = append(loop, in)
		} else {
			out = append(out, in)
		}
	}
	return append(out, loop...), nil
}

// wrapping is the session server as the engine's Authority with
// Config.WrapFile applied to every file it hands out.
type wrapping struct {
	*session.Server
	wrap func(share.File) share.File
}

func (w wrapping) OpenByResumeKey(id uint64, key [24]byte) (share.File, error) {
	f, err := w.Server.OpenByResumeKey(id, key)
	if err != nil {
		return nil, err
	}
	return w.wrap(f), nil
}

// registrar is the session server's way into the engine's Fid tables: the
// file a session OPEN registers (wrapped like those REGISTER finds, when
// a test wraps them), owned by that open.
type registrar struct {
	engine *server.Server
	wrap   func(share.File) share.File
}

func (r registrar) RegisterOpen(id uint64, f share.File, flags uint32) (uint16, bool) {
	wf := f
	if r.wrap != nil && r.engine.HasSession(id) {
		wf = r.wrap(f)
	}
	return r.engine.RegisterFile(id, wf, flags, f)
}

func (r registrar) CloseOpen(id uint64, fid uint16, f share.File) { r.engine.CloseFile(id, fid, f) }
