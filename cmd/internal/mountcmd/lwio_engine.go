package mountcmd

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/fs"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/transport"
)

// openLWIO negotiates over \PIPE\LWIO, connects and authenticates the LWIO
// client engine on the providers this host has and the server offers, and
// returns the data path that registers every opened file with it.
func openLWIO(ctx context.Context, o *Options, c *session.Client, tree *session.Tree, log *logrus.Logger) (*dataPath, error) {
	var ps []transport.Provider
	var why []string
	// The providers are made once per mount and reused by every reconnect:
	// their registered memory and device contexts are not per session.
	o.providersOnce.Do(func() { o.providers = localProviders(o.Provider, log.WithField("component", "transport")) })
	for _, p := range o.providers {
		if err := p.Available(); err != nil {
			why = append(why, fmt.Sprintf("%s: %v", p.Name(), err))
			log.WithFields(logrus.Fields{"provider": p.Name()}).WithError(err).Debug("provider not usable here")
			continue
		}
		ps = append(ps, p)
	}
	if len(ps) == 0 {
		return nil, fmt.Errorf("no usable local RDMA provider (%s)", strings.Join(why, "; "))
	}
	mode := client.Interrupt
	if o.Completion == "polling" {
		mode = client.Polling
	}
	cl, err := client.New(ctx, client.Config{
		Providers:   ps,
		Negotiate:   tree.Negotiate,
		SessionID:   c.SessionID(),
		SigningKey:  c.SessionKey(),
		Completion:  mode,
		Connections: o.Conns,
		Logger:      log.WithField("component", "lwio"),
	})
	if err != nil {
		return nil, err
	}
	conns := cl.Conns()
	fields := logrus.Fields{"completion": mode.String(), "connections": len(conns),
		"max_read": cl.MaxRead(), "max_write": cl.MaxWrite()}
	var desc []string
	for _, ci := range conns {
		desc = append(desc, ci.Provider+" "+ci.RemoteAddr)
	}
	fields["providers"] = strings.Join(dedupe(cl.Providers()), ",")
	fields["rdma_connections"] = strings.Join(desc, "; ")
	log.WithFields(fields).Info("LWIO data path up")
	go func() {
		<-cl.Done()
		if err := cl.Err(); err != nil && !errors.Is(err, client.ErrClosed) {
			log.WithError(err).Error("all LWIO connections lost")
		}
	}()
	return &dataPath{
		DataPath: fs.LWIODataPath(tree, cl, fs.SessionDataPath(tree), log.WithField("component", "fs")),
		close:    cl.Close,
		done:     cl.Done(),
	}, nil
}

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
