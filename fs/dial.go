package fs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
)

// DialConfig says how to reach a share and carry its file data.
type DialConfig struct {
	// Addr is the session channel's host:port.
	Addr string
	// Share is the share's name (or \\server\share).
	Share string
	// Session holds the credentials and the session channel's options.
	Session session.ClientConfig
	// Providers are the local RDMA providers the LWIO negotiate offers;
	// those not Available here are left out. None: file data goes over the
	// session channel.
	Providers []transport.Provider
	// RequireRDMA fails the dial when the LWIO data path cannot come up;
	// otherwise file data falls back to the session channel, with a
	// warning (silent fallback is what SMB Direct users complain about
	// most).
	RequireRDMA bool
	// Completion is the LWIO completion mode (the zero value is
	// client.Interrupt).
	Completion client.Mode
	// Conns is how many RDMA connections to open; 0 is the client's
	// default.
	Conns int
	// PoolMemory bounds the LWIO client's idle registered buffers
	// (client.Config.PoolMemory; 0 its default).
	PoolMemory int
	// SplitRead is the size from which a read goes in pieces over idle
	// connections (client.Config.SplitRead; 0 its default, negative
	// never).
	SplitRead int
	// Logger receives the data path's events; nil is quiet.
	Logger logrus.FieldLogger
	// Stats, when not nil, receive the LWIO client's counters and the
	// bytes of file data the session channel carries (stats.go).
	Stats *Stats
}

// DialError is a Dial that failed, with the step that failed: "session"
// (reaching the server, logon), "tree" (tree connect) or "lwio" (the LWIO
// data path, with RequireRDMA).
type DialError struct {
	Step string
	Err  error
}

func (e *DialError) Error() string { return e.Step + ": " + e.Err.Error() }
func (e *DialError) Unwrap() error { return e.Err }

// Dial establishes a Session from nothing: session setup, tree connect,
// the LWIO negotiate over \PIPE\LWIO, and the RDMA connections'
// authentication. lwio-mount and the tests dial with it; a Reconnector
// dials again with it after the server went away.
func Dial(ctx context.Context, cfg DialConfig) (*Session, error) {
	log := cfg.Logger
	if log == nil {
		log = Options{}.logger()
	}
	c, err := session.Dial(ctx, cfg.Addr, cfg.Session)
	if err != nil {
		return nil, &DialError{"session", err}
	}
	tree, err := c.TreeConnect(ctx, cfg.Share)
	if err != nil {
		c.Close()
		return nil, &DialError{"tree", err}
	}
	var data HandleIO = tree
	if cfg.Stats != nil {
		data = countedIO{tree, cfg.Stats}
	}
	s := &Session{Tree: tree, Data: SessionDataPath(data), Done: c.Done(), Close: c.Close, ReadOnly: tree.ReadOnly(),
		Account: treeAccount(tree)}
	if len(cfg.Providers) == 0 {
		return s, nil
	}
	cl, err := dialLWIO(ctx, cfg, c, tree, log)
	if err != nil {
		if cfg.RequireRDMA {
			c.Close()
			return nil, &DialError{"lwio", err}
		}
		log.WithError(err).WithField("data_path", "session").
			Warn("NO RDMA: LWIO data path unavailable, file data falls back to the session channel (TCP); see lwio-mount -providers")
		return s, nil
	}
	s.Data = lwioDataPath(tree, cl, s.Data, log.WithField("component", "fs"))
	// The LWIO connections are authenticated: every open from now on
	// registers its file and answers the Fid (no REGISTER round trip).
	tree.RegisterOnOpen(true)
	s.LWIO = cl
	done := make(chan struct{})
	go func() {
		select {
		case <-c.Done():
		case <-cl.Done():
		}
		close(done)
	}()
	s.Done = done
	s.Close = func() error { cl.Close(); return c.Close() }
	return s, nil
}

// dialLWIO negotiates over \PIPE\LWIO and connects and authenticates the
// LWIO client engine on the providers usable here that the server offers.
func dialLWIO(ctx context.Context, cfg DialConfig, c *session.Client, tree *session.Tree, log logrus.FieldLogger) (*client.Client, error) {
	var ps []transport.Provider
	var why []string
	for _, p := range cfg.Providers {
		if err := p.Available(); err != nil {
			why = append(why, fmt.Sprintf("%s: %v", p.Name(), err))
			log.WithField("provider", p.Name()).WithError(err).Debug("provider not usable here")
			continue
		}
		ps = append(ps, p)
	}
	if len(ps) == 0 {
		return nil, fmt.Errorf("no usable local RDMA provider (%s)", strings.Join(why, "; "))
	}
	var ctr *client.Counters
	if cfg.Stats != nil {
		ctr = &cfg.Stats.LWIO
	}
	cph := smbauth.CipherNone
	if c.Sealed() {
		// The data connections seal as the session does (softrdma), or
		// are refused by a server that does not trust its fabric (verbs).
		cph = c.Cipher()
	}
	cl, err := client.New(ctx, client.Config{
		Counters:    ctr,
		Providers:   ps,
		Negotiate:   tree.Negotiate,
		SessionID:   c.SessionID(),
		SigningKey:  c.SessionKey(),
		Cipher:      cph,
		Completion:  cfg.Completion,
		Connections: cfg.Conns,
		PoolMemory:  cfg.PoolMemory,
		SplitRead:   cfg.SplitRead,
		Logger:      log.WithField("component", "lwio"),
	})
	if err != nil {
		return nil, err
	}
	var desc []string
	for _, ci := range cl.Conns() {
		desc = append(desc, ci.Provider+" "+ci.RemoteAddr)
	}
	log.WithFields(logrus.Fields{"completion": cfg.Completion.String(), "connections": len(desc), "sealed": cph,
		"max_read": cl.MaxRead(), "max_write": cl.MaxWrite(), "providers": strings.Join(dedupe(cl.Providers()), ","),
		"rdma_connections": strings.Join(desc, "; ")}).Info("LWIO data path up")
	go func() {
		<-cl.Done()
		if err := cl.Err(); err != nil && !errors.Is(err, client.ErrClosed) {
			log.WithError(err).Error("all LWIO connections lost")
		}
	}()
	return cl, nil
}

// dedupe returns s without repeats, in first-seen order.
func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
