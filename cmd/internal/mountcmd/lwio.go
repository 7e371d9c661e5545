package mountcmd

import (
	"context"
	"fmt"
	"io"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/fs"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
	"github.com/lwiofs/lwiofs/transport/verbs"
)

// dataPath is the file data path of a mount and how to shut it down.
type dataPath struct {
	fs.DataPath
	close func() error
	done  <-chan struct{} // closed when the data path died; nil: never
}

func (d *dataPath) Close() error {
	if d.close == nil {
		return nil
	}
	return d.close()
}

// openDataPath sets up the LWIO client for the mount: negotiate over
// \PIPE\LWIO, connect and authenticate on the first common provider. When
// that is impossible it falls back to the session channel, loudly: silent
// fallback is what SMB Direct users complain about most.
func openDataPath(ctx context.Context, o *Options, c *session.Client, tree *session.Tree, log *logrus.Logger) (*dataPath, error) {
	fallback := &dataPath{DataPath: fs.SessionDataPath(tree)}
	if o.Provider == "none" {
		log.WithFields(logrus.Fields{"provider": "none", "data_path": "session"}).
			Warn("provider=none: file data goes over the session channel, not RDMA")
		return fallback, nil
	}
	dp, err := openLWIO(ctx, o, c, tree, log)
	if err == nil {
		return dp, nil
	}
	if o.Provider != "auto" {
		return nil, fmt.Errorf("provider=%s: %v", o.Provider, err)
	}
	log.WithError(err).WithField("data_path", "session").
		Warn("NO RDMA: LWIO data path unavailable, file data falls back to the session channel (TCP); see lwio-mount -providers")
	return fallback, nil
}

// localProviders are the providers this host can use, for the negotiate
// and for -providers, restricted to want ("auto" = all).
func localProviders(want string, log logrus.FieldLogger) []transport.Provider {
	var ps []transport.Provider
	if want == "auto" || want == verbs.Name {
		ps = append(ps, verbs.New(verbs.Options{Logger: log}))
	}
	if want == "auto" || want == soft.Name {
		// LWIO_SOFT_FAULTS injects faults for end-to-end tests; a bad
		// specification was already refused at start-up (checkFaultsEnv).
		faults, _ := soft.FaultsFromEnv()
		ps = append(ps, soft.New(soft.Options{Logger: log, Faults: faults}))
	}
	return ps
}

// describeProviders is `lwio-mount -providers`.
func describeProviders(w io.Writer) {
	fmt.Fprintln(w, "Local RDMA providers (the mount uses the first one the server also offers):")
	d := transport.Describe(w, transport.DiscoverConfig{
		Verbs:     verbs.New(verbs.Options{}),
		VerbsPort: 1, // a client listens nowhere; any port lists the devices
		Others:    []transport.ProviderInfo{{Name: soft.Name}},
	})
	fmt.Fprintf(w, "softrdma: usable (built in: software RDMA over TCP, no RDMA hardware needed)\n")
	if d.VerbsErr == nil {
		fmt.Fprintln(w, "=> a mount uses verbs when the server offers it, else softrdma, else the session channel (no RDMA)")
	} else {
		fmt.Fprintln(w, "=> a mount uses softrdma when the server offers it, else the session channel (no RDMA)")
	}
}

// checkFaultsEnv refuses a malformed LWIO_SOFT_FAULTS and says loudly when
// fault injection is on.
func checkFaultsEnv(log logrus.FieldLogger) error {
	faults, err := soft.FaultsFromEnv()
	if err != nil {
		return fmt.Errorf("%s: %v", soft.EnvFaults, err)
	}
	if faults != nil {
		log.WithField("faults", faults.String()).Warn("softrdma fault injection on (" + soft.EnvFaults + ")")
	}
	return nil
}
