package mountcmd

import (
	"fmt"
	"io"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/fs"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
	"github.com/lwiofs/lwiofs/transport/verbs"
)

// dialConfig is what fs.Dial needs to make one session of the mount: the
// credentials, and the local providers — made once per mount and reused by
// every reconnect, since their registered memory and device contexts are
// not per session. provider=none means no RDMA at all (loudly: silent
// fallback is what SMB Direct users complain about most); a provider named
// explicitly must come up; auto falls back to the session channel.
func dialConfig(o *Options, log *logrus.Logger) fs.DialConfig {
	o.providersOnce.Do(func() {
		if o.Provider == "none" {
			log.WithFields(logrus.Fields{"provider": "none", "data_path": "session"}).
				Warn("provider=none: file data goes over the session channel, not RDMA")
			return
		}
		o.providers = localProviders(o.Provider, log.WithField("component", "transport"))
	})
	mode := client.Auto
	switch o.Completion {
	case "interrupt":
		mode = client.Interrupt
	case "polling":
		mode = client.Polling
	}
	return fs.DialConfig{
		Addr:  o.Addr(),
		Share: o.Share,
		Session: session.ClientConfig{
			User: o.Username, Domain: o.Domain, Password: o.password,
			Logger: log.WithField("component", "session"), Seal: sealMode(o.Seal),
		},
		Providers:   o.providers,
		RequireRDMA: o.Provider != "auto",
		Completion:  mode,
		Conns:       o.Conns,
		PoolMemory:  o.PoolMiB << 20,
		SplitRead:   o.SplitReadKB << 10,
		Logger:      log,
		Stats:       o.stats,
	}
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
		ps = append(ps, soft.New(soft.Options{Logger: log, Faults: faults, TCPOnly: soft.TCPOnlyFromEnv(), NoSharedMemory: soft.NoSharedMemoryFromEnv(), NoPipes: soft.NoPipesFromEnv()}))
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
