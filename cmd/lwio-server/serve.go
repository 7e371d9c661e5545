package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
	"github.com/lwiofs/lwiofs/transport/verbs"
)

// authority adapts the session server to the LWIO engine's Authority. It
// is filled in once the session server exists, which needs the provider
// list, which needs the LWIO listeners: the engine is built first.
type authority struct{ s *session.Server }

func (a *authority) SessionByKey(key [16]byte) (uint64, []byte, bool) {
	return a.s.SessionByKey(key)
}

func (a *authority) OpenByResumeKey(sessionID uint64, key [24]byte) (server.File, error) {
	return a.s.OpenByResumeKey(sessionID, key)
}

// lwioListener is one provider listener and what the negotiate says of it.
type lwioListener struct {
	provider string
	l        transport.Listener
	info     []transport.Instance
}

// serve runs the server until SIGINT or SIGTERM.
func serve(c *Config, log *logrus.Logger) error {
	auth := &authority{}
	engine, err := server.New(server.Config{
		Authority:         auth,
		Logger:            log.WithField("component", "lwio"),
		Credits:           c.Limits.CreditsPerConnection,
		MaxCredits:        c.Limits.CreditsPerConnection,
		CreditBudget:      c.Limits.CreditBudget,
		MaxRdmaWindowSize: c.Limits.MaxRDMAWindow,
		MaxRecvBufferSize: c.Limits.MaxRecvBuffer,
		Workers:           c.Limits.Workers,
	})
	if err != nil {
		return fmt.Errorf("LWIO engine: %w", err)
	}

	// Session channel first: a taken port is the likeliest start-up error.
	sl, err := net.Listen("tcp", c.sessionAddr())
	if err != nil {
		return fmt.Errorf("session channel: %w", err)
	}
	var lls []lwioListener
	closeAll := func() {
		sl.Close()
		for _, ll := range lls {
			ll.l.Close()
		}
	}
	softAddrs, _ := c.softrdmaAddrs()
	if len(softAddrs) > 0 {
		faults, err := soft.FaultsFromEnv()
		if err != nil {
			closeAll()
			return fmt.Errorf("%s: %v", soft.EnvFaults, err)
		}
		if faults != nil {
			log.WithField("faults", faults.String()).Warn("softrdma fault injection on (" + soft.EnvFaults + ")")
		}
		p := soft.New(soft.Options{Logger: log.WithField("provider", soft.Name), Faults: faults})
		for _, a := range softAddrs {
			ll, err := listen(engine, p, a)
			if err != nil {
				closeAll()
				return err
			}
			lls = append(lls, ll)
		}
	}
	if len(c.Listen.Verbs) > 0 {
		p := verbs.New(verbs.Options{Logger: log.WithField("provider", verbs.Name)})
		if err := p.Available(); err != nil {
			closeAll()
			return fmt.Errorf("verbs provider: %v", err)
		}
		for _, a := range c.Listen.Verbs {
			ll, err := listen(engine, p, a)
			if err != nil {
				closeAll()
				return err
			}
			lls = append(lls, ll)
		}
	}

	sess, err := session.NewServer(sessionConfig(c, lls, log))
	if err != nil {
		closeAll()
		return err
	}
	auth.s = sess

	var wg sync.WaitGroup
	stopping := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		keepServing(log.WithFields(logrus.Fields{"listener": "session", "addr": sl.Addr().String()}), stopping, func() error {
			err := sess.Serve(sl)
			if errors.Is(err, session.ErrServerClosed) {
				return nil
			}
			return err
		})
	}()
	for _, ll := range lls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keepServing(log.WithFields(logrus.Fields{"listener": "lwio", "provider": ll.provider, "addr": ll.l.Addr()}), stopping, func() error {
				err := engine.Serve(ll.l)
				if errors.Is(err, transport.ErrClosed) || errors.Is(err, server.ErrServerClosed) {
					return nil
				}
				return err
			})
		}()
	}
	logStart(c, log, sl.Addr().String(), lls)
	if len(lls) == 0 {
		log.Warn("no RDMA provider enabled: clients fall back to file data over the session channel")
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	s := <-sig
	log.WithField("signal", s.String()).Info("shutting down: no new connections, finishing requests in flight")
	signal.Stop(sig)
	close(stopping)
	// Stop accepting everywhere, then let in-flight LWIO requests finish
	// (or fail at the engine's shutdown timeout), then end the sessions.
	for _, ll := range lls {
		ll.l.Close()
	}
	engineErr := engine.Close()
	sessErr := sess.Close()
	wg.Wait()
	if engineErr != nil {
		log.WithError(engineErr).Warn("LWIO engine shutdown")
	}
	if sessErr != nil {
		log.WithError(sessErr).Warn("session server shutdown")
	}
	log.Info("stopped")
	return nil
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

// listen opens one provider listener and works out the instances the
// negotiate advertises for it: a wildcard address is advertised as every
// local address, since a client cannot connect to 0.0.0.0.
func listen(engine *server.Server, p transport.Provider, addr string) (lwioListener, error) {
	l, err := engine.Listen(p, addr)
	if err != nil {
		return lwioListener{}, fmt.Errorf("%s listener %s: %w", p.Name(), addr, err)
	}
	ins, err := instances(l.Addr())
	if err != nil {
		l.Close()
		return lwioListener{}, fmt.Errorf("%s listener %s: %w", p.Name(), addr, err)
	}
	return lwioListener{provider: p.Name(), l: l, info: ins}, nil
}

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

// sessionConfig maps the configuration onto the session server's.
func sessionConfig(c *Config, lls []lwioListener, log *logrus.Logger) session.ServerConfig {
	sc := session.ServerConfig{
		ServerName: c.ServerName,
		Domain:     c.Domain,
		Encrypt:    c.encrypt(),
		Users:      map[string][16]byte{},
		Logger:     log.WithField("component", "session"),
	}
	for name, u := range c.Users {
		h, _ := smbauth.ParseNTHash(u.NTHash) // validated
		sc.Users[name] = h
	}
	for _, name := range sortedKeys(c.Shares) {
		s := c.Shares[name]
		sc.Shares = append(sc.Shares, session.Share{Name: name, Path: s.Path, ReadOnly: s.ReadOnly, Users: s.Users, Encrypt: s.encrypt()})
	}
	// One ProviderInfo per provider name, in listener order (verbs was
	// listed after softrdma in the config, but prefer it when present).
	byName := map[string]*transport.ProviderInfo{}
	var order []string
	for _, ll := range lls {
		pi, ok := byName[ll.provider]
		if !ok {
			pi = &transport.ProviderInfo{Name: ll.provider}
			byName[ll.provider] = pi
			order = append(order, ll.provider)
		}
		pi.Instances = append(pi.Instances, ll.info...)
	}
	if _, ok := byName[verbs.Name]; ok {
		sc.Providers = append(sc.Providers, *byName[verbs.Name])
	}
	for _, n := range order {
		if n != verbs.Name {
			sc.Providers = append(sc.Providers, *byName[n])
		}
	}
	return sc
}

func logStart(c *Config, log *logrus.Logger, sessionAddr string, lls []lwioListener) {
	for _, name := range sortedKeys(c.Shares) {
		s := c.Shares[name]
		log.WithFields(logrus.Fields{"share": name, "path": s.Path, "read_only": s.ReadOnly,
			"users": strings.Join(s.Users, ",")}).Info("share")
	}
	log.WithFields(logrus.Fields{"listener": "session", "addr": sessionAddr}).Info("listening")
	for _, ll := range lls {
		ins := make([]string, len(ll.info))
		for i, in := range ll.info {
			ins[i] = in.String()
		}
		log.WithFields(logrus.Fields{"listener": "lwio", "provider": ll.provider, "addr": ll.l.Addr(),
			"advertised": strings.Join(ins, " ")}).Info("listening")
	}
}
