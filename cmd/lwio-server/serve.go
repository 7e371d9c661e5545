package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/sysmonquiet"
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
	fitDescriptors(&fc.Session, log)
	// SIGTERM is taken before the server listens: one sent as soon as it
	// answers (a service manager stopping it right after its start) finds
	// the handler, not the default action that ends the process unclean.
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	srv, err := fileserver.Start(fc)
	if err != nil {
		return err
	}
	limitMemory(srv.Engine().Budget(), log)
	defer keepSysmonQuiet().Stop()
	logStart(c, log, srv)

	s := <-sig
	log.WithField("signal", s.String()).Info("shutting down: no new connections, finishing requests in flight")
	stopWithin(srv, shutdownBudget, sig, log)
	log.Info("stopped")
	return nil
}

// keepSysmonQuiet starts the server's sysmonquiet.Keeper on a P of its
// own (docs/bench.md, "Go's sysmon"). The server's goroutines wait in the
// netpoller, not in system calls, so between two requests every P is idle
// and Go's sysmon deep-sleeps; the next request's first system call wakes
// it, and it ticks every 20 µs again. In a tar -x that was 12.5 wake-ups
// per file and a fifth of the server's CPU. With the keeper's P held in a
// nanosleep while requests come, sysmon backs off to 10 ms ticks.
func keepSysmonQuiet() *sysmonquiet.Keeper {
	sysmonquiet.AddProcs(1)
	k := &sysmonquiet.Keeper{}
	k.Start()
	return k
}

// shutdownBudget bounds a shutdown: SIGTERM stops the server within 5 s
// whatever its clients are doing. The session channel and the engine each
// give requests in flight drainTimeout; what is still running after the
// budget (a disk that does not answer, a blocked lock wait) is abandoned —
// the process exits under it.
const (
	shutdownBudget = 4500 * time.Millisecond
	drainTimeout   = 3 * time.Second
)

// stopWithin closes srv, but returns after budget, or at a second signal,
// whether or not the close has finished.
func stopWithin(srv *fileserver.Server, budget time.Duration, sig <-chan os.Signal, log logrus.FieldLogger) {
	closed := make(chan error, 1)
	go func() { closed <- srv.Close() }()
	t := time.NewTimer(budget)
	defer t.Stop()
	select {
	case err := <-closed:
		if err != nil {
			log.WithError(err).Warn("shutdown")
		}
	case <-t.C:
		log.WithField("after", budget.String()).Warn("shutdown: requests still running (a disk that does not answer, or a blocked wait); exiting without them")
	case s := <-sig:
		log.WithField("signal", s.String()).Warn("shutdown: second signal; exiting at once")
	}
}

// serverConfig maps the configuration onto the server's: shares, users,
// limits, and the LWIO listeners with their providers — verbs first, so
// that the negotiate prefers it where both ends have it.
func serverConfig(c *Config, log *logrus.Logger) (fileserver.Config, error) {
	fc := fileserver.Config{
		Session: session.ServerConfig{
			ServerName:    c.ServerName,
			Domain:        c.Domain,
			Encrypt:       c.encrypt(),
			TrustedFabric: c.TrustedFabric,
			ShareEncrypt:  map[string]session.Encrypt{},
			Users:         map[string][16]byte{},
			Logger:        log.WithField("component", "session"),
			Accounts: share.AccountsConfig{
				Map:   map[string]string{},
				Guest: c.GuestAccount,
			},
			StateDir:          stateDir(c, log),
			DurableTimeout:    seconds(c.Limits.DurableTimeout),
			MaxUserHandles:    c.Limits.MaxOpenFilesPerUser,
			MaxOpenFiles:      c.Limits.MaxOpenFiles,
			MaxPending:        c.Limits.MaxPendingConnections,
			MaxPendingPerAddr: c.Limits.MaxPendingPerAddress,
			IdleTimeout:       seconds(c.Limits.IdleTimeout),
			LogonDelayMax:     seconds(c.Limits.LogonDelayMax),
			// within shutdownBudget
			ShutdownTimeout: drainTimeout,
		},
		Engine: server.Config{
			Logger:            log.WithField("component", "lwio"),
			Credits:           c.Limits.CreditsPerConnection,
			MaxCredits:        c.Limits.CreditsPerConnection,
			MaxBufferMemory:   c.Limits.MaxBufferMemory,
			CreditBudget:      c.Limits.CreditBudget,
			MaxRdmaWindowSize: c.Limits.MaxRDMAWindow,
			MaxRecvBufferSize: c.Limits.MaxRecvBuffer,
			Workers:           c.Limits.Workers,
			TrustedFabric:     c.TrustedFabric,
			ShutdownTimeout:   drainTimeout,
			// shared_receive_queue = false
			PrivateReceiveQueues: c.Limits.SharedReceiveQueue != nil && !*c.Limits.SharedReceiveQueue,
		},
		SessionAddr: c.sessionAddr(),
		MetricsAddr: c.Listen.Metrics,
		Logger:      log,
	}
	for name, u := range c.Users {
		h, _ := smbauth.ParseNTHash(u.NTHash) // validated
		fc.Session.Users[name] = h
		if u.Account != "" {
			fc.Session.Accounts.Map[name] = u.Account
		}
	}
	for _, name := range sortedKeys(c.Shares) {
		s := c.Shares[name]
		fc.Session.Shares = append(fc.Session.Shares, share.Config{Name: name, Path: s.Path, ReadOnly: s.ReadOnly, Users: s.Users,
			AllowRoot: s.AllowRoot, AllowSetid: s.AllowSetid, AllowDevices: s.AllowDevices,
			NoLeases: !s.leases(), LeaseBreakTimeout: time.Duration(c.Limits.LeaseBreakTimeout * float64(time.Second))})
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
		p := soft.New(soft.Options{Logger: log.WithField("provider", soft.Name), Faults: faults, TCPOnly: soft.TCPOnlyFromEnv(), NoSharedMemory: soft.NoSharedMemoryFromEnv(), NoPipes: soft.NoPipesFromEnv()})
		adv, _ := c.softrdmaAdvertise() // validated
		for _, a := range softAddrs {
			fc.Listeners = append(fc.Listeners, fileserver.Listener{Provider: p, Addr: a, Advertise: adv})
		}
	}
	return fc, nil
}

// seconds is n seconds; -1 is the session server's "never" (negative).
func seconds(n int) time.Duration { return time.Duration(n) * time.Second }

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
			"encrypt": s.encrypt(), "users": strings.Join(s.Users, ","), "allow_root": s.AllowRoot,
			"allow_setid": s.AllowSetid, "allow_devices": s.AllowDevices}).Info("share")
	}
	logAccounts(c, log)
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

// memoryOverhead is what lwio-server needs besides its receive buffers
// (the Go runtime, the session channel, sockets, the READ replies' buffers,
// metrics), for the soft memory limit.
const memoryOverhead = 64 << 20

// gcPercent is lwio-server's GC target (GOGC, unless that is set): a
// collection starts once the heap has grown by this much over what the
// last one left live. Nearly all of that live heap is receive buffers and
// read buffers — byte slices the collector does not scan — so a cycle
// costs little, while with the default 100 the heap, and the resident
// memory the runtime keeps, grew to twice those buffers (bench/memory.sh,
// issue 20: GC headroom was most of a mount's growth). Unlike a limit at
// the live size (below) a percentage never makes the collector run
// without pause: its target moves with what is live.
const gcPercent = 50

// limitMemory sets the Go runtime's soft memory limit from the receive
// memory budget, unless GOMEMLIMIT is set. The budget bounds the live
// receive buffers, but buffers given back are garbage until a collection,
// and with the default GC target the heap grows to twice its live size
// before one; the runtime keeps what it grew to. With the limit the
// collector runs, and returns memory to the OS, as the heap nears it, so
// resident memory follows the budget (bench/memory.sh measures it).
//
// The limit is twice the budget with its possible overdraft (a quarter),
// plus memoryOverhead: room for the garbage of one collection cycle. A
// limit at the live size itself (the budget, its overdraft and 24 MiB, as
// it first was) is a trap: what is live outside the budget — the READ
// replies' pooled buffers of three busy mounts — filled it, the collector
// then ran without pause, and a server with three mounts spent a second of
// CPU per second on 1,000 4 KiB writes (4,000 without the limit) and took
// 2.5× as long for tar -x (make bench at 0caaebf).
func limitMemory(b server.BudgetInfo, log logrus.FieldLogger) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	budget := int64(b.Credits) * int64(b.BufferSize)
	limit := 2*(budget+budget/4) + memoryOverhead
	debug.SetMemoryLimit(limit)
	log.WithField("limit_mib", limit>>20).Debug("Go soft memory limit from max_buffer_memory")
}

// logAccounts says, once at start, who the users act as: for each user
// its Unix account (and a warning for one that has none, whose logons
// will be refused unless guest_account is set) — or that the server is
// not root and acts as its own account for everyone, which
// session.NewServer has said already.
func logAccounts(c *Config, log *logrus.Logger) {
	if !share.PerUser() {
		return
	}
	for _, name := range sortedKeys(c.Users) {
		acct := c.Users[name].Account
		if acct == "" {
			acct = name
		}
		a, err := share.LookupAccount(acct)
		switch {
		case err == nil:
			log.WithFields(logrus.Fields{"user": name, "account": a.Name, "uid": a.Uid, "gid": a.Gid}).Info("user")
		case c.GuestAccount != "":
			log.WithFields(logrus.Fields{"user": name, "account": acct, "guest_account": c.GuestAccount}).
				Info("user has no Unix account on this host: it acts as the guest account")
		default:
			log.WithFields(logrus.Fields{"user": name, "account": acct}).WithError(err).
				Warn("user has no Unix account on this host: its logons will be refused (set [users." + name + "] account, or guest_account)")
		}
	}
}

// fitDescriptors raises the soft RLIMIT_NOFILE to the hard limit (Go does
// it too since 1.19; this says so in the log) and keeps the server-wide
// handle limit below it: three quarters by default, and a configured
// max_open_files that would not leave a quarter for connections and the
// descriptors an operation holds is cut down, with a warning.
func fitDescriptors(sc *session.ServerConfig, log logrus.FieldLogger) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		log.WithError(err).Warn("cannot read RLIMIT_NOFILE")
		return
	}
	if rl.Cur < rl.Max {
		raised := syscall.Rlimit{Cur: rl.Max, Max: rl.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			log.WithError(err).WithField("soft", rl.Cur).Warn("cannot raise RLIMIT_NOFILE to its hard limit")
		} else {
			rl = raised
		}
	}
	fit := session.DefaultMaxOpenFiles()
	if sc.MaxOpenFiles > fit {
		log.WithFields(logrus.Fields{"max_open_files": sc.MaxOpenFiles, "nofile": rl.Cur, "using": fit}).
			Warn("limits.max_open_files does not leave a quarter of RLIMIT_NOFILE for connections; lowered")
		sc.MaxOpenFiles = fit
	}
	if sc.MaxOpenFiles == 0 {
		sc.MaxOpenFiles = fit
	}
	log.WithFields(logrus.Fields{"nofile": rl.Cur, "max_open_files": sc.MaxOpenFiles}).Debug("file descriptors")
}
