package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol/fileserver"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport/soft"
	"github.com/lwiofs/lwiofs/transport/verbs"
)

// serve runs the server until SIGINT or SIGTERM.
func serve(c *Config, log *logrus.Logger) error {
	fc, err := serverConfig(c, log)
	if err != nil {
		return err
	}
	srv, err := fileserver.Start(fc)
	if err != nil {
		return err
	}
	logStart(c, log, srv)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	s := <-sig
	log.WithField("signal", s.String()).Info("shutting down: no new connections, finishing requests in flight")
	signal.Stop(sig)
	if err := srv.Close(); err != nil {
		log.WithError(err).Warn("shutdown")
	}
	log.Info("stopped")
	return nil
}

// serverConfig maps the configuration onto the server's: shares, users,
// limits, and the LWIO listeners with their providers — verbs first, so
// that the negotiate prefers it where both ends have it.
func serverConfig(c *Config, log *logrus.Logger) (fileserver.Config, error) {
	fc := fileserver.Config{
		Session: session.ServerConfig{
			ServerName:     c.ServerName,
			Domain:         c.Domain,
			Encrypt:        c.encrypt(),
			TrustedFabric:  c.TrustedFabric,
			ShareEncrypt:   map[string]session.Encrypt{},
			Users:          map[string][16]byte{},
			Logger:         log.WithField("component", "session"),
			StateDir:       stateDir(c, log),
			DurableTimeout: time.Duration(c.Limits.DurableTimeout) * time.Second,
		},
		Engine: server.Config{
			Logger:            log.WithField("component", "lwio"),
			Credits:           c.Limits.CreditsPerConnection,
			MaxCredits:        c.Limits.CreditsPerConnection,
			CreditBudget:      c.Limits.CreditBudget,
			MaxRdmaWindowSize: c.Limits.MaxRDMAWindow,
			MaxRecvBufferSize: c.Limits.MaxRecvBuffer,
			Workers:           c.Limits.Workers,
			TrustedFabric:     c.TrustedFabric,
		},
		SessionAddr: c.sessionAddr(),
		MetricsAddr: c.Listen.Metrics,
		Logger:      log,
	}
	for name, u := range c.Users {
		h, _ := smbauth.ParseNTHash(u.NTHash) // validated
		fc.Session.Users[name] = h
	}
	for _, name := range sortedKeys(c.Shares) {
		s := c.Shares[name]
		fc.Session.Shares = append(fc.Session.Shares, share.Config{Name: name, Path: s.Path, ReadOnly: s.ReadOnly, Users: s.Users})
		fc.Session.ShareEncrypt[name] = s.encrypt()
	}
	if len(c.Listen.Verbs) > 0 {
		p := verbs.New(verbs.Options{Logger: log.WithField("provider", verbs.Name)})
		if err := p.Available(); err != nil {
			return fc, fmt.Errorf("verbs provider: %v", err)
		}
		for _, a := range c.Listen.Verbs {
			fc.Listeners = append(fc.Listeners, fileserver.Listener{Provider: p, Addr: a})
		}
	}
	softAddrs, _ := c.softrdmaAddrs()
	if len(softAddrs) > 0 {
		faults, err := soft.FaultsFromEnv()
		if err != nil {
			return fc, fmt.Errorf("%s: %v", soft.EnvFaults, err)
		}
		if faults != nil {
			log.WithField("faults", faults.String()).Warn("softrdma fault injection on (" + soft.EnvFaults + ")")
		}
		p := soft.New(soft.Options{Logger: log.WithField("provider", soft.Name), Faults: faults})
		adv, _ := c.softrdmaAdvertise() // validated
		for _, a := range softAddrs {
			fc.Listeners = append(fc.Listeners, fileserver.Listener{Provider: p, Addr: a, Advertise: adv})
		}
	}
	return fc, nil
}

// stateDir is the state directory: state_dir as given (the server then
// fails to start if it cannot be used), or DefaultStateDir when it can be
// made — else none, with a warning: durable handles then do not survive a
// restart (clients get ESTALE on the files they had open).
func stateDir(c *Config, log *logrus.Logger) string {
	if c.StateDir != "" {
		return c.StateDir
	}
	if _, err := share.LoadIdentityKey(DefaultStateDir); err != nil {
		log.WithError(err).WithField("state_dir", DefaultStateDir).Warn("no state directory: files clients have open will be ESTALE to them after a restart (set state_dir)")
		return ""
	}
	return DefaultStateDir
}

func logStart(c *Config, log *logrus.Logger, srv *fileserver.Server) {
	for _, name := range sortedKeys(c.Shares) {
		s := c.Shares[name]
		log.WithFields(logrus.Fields{"share": name, "path": s.Path, "read_only": s.ReadOnly,
			"encrypt": s.encrypt(), "users": strings.Join(s.Users, ",")}).Info("share")
	}
	log.WithFields(logrus.Fields{"listener": "session", "addr": srv.SessionAddr()}).Info("listening")
	for _, l := range srv.Listeners() {
		ins := make([]string, len(l.Advertised))
		for i, in := range l.Advertised {
			ins[i] = in.String()
		}
		log.WithFields(logrus.Fields{"listener": "lwio", "provider": l.Provider, "addr": l.Addr,
			"advertised": strings.Join(ins, " ")}).Info("listening")
	}
	if a := srv.MetricsAddr(); a != "" {
		log.WithFields(logrus.Fields{"listener": "metrics", "addr": a, "url": "http://" + a + "/metrics"}).Info("listening")
	}
	if len(srv.Listeners()) == 0 {
		log.Warn("no RDMA provider enabled: clients fall back to file data over the session channel")
	}
}
