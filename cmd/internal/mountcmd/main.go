// Package mountcmd is lwio-mount: it mounts a share with FUSE, namespace
// operations over the session channel and file data over LWIO. The same
// code runs as `lwio-mount` and as `lwio`, the name mount.fuse3 looks for
// behind an fstab entry of type fuse.lwio.
package mountcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/cmd/internal/cli"
	"github.com/lwiofs/lwiofs/fs"
	"github.com/lwiofs/lwiofs/internal/sysmonquiet"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// connectTimeout bounds reaching the server, session setup and tree
// connect at mount time.
const connectTimeout = 20 * time.Second

// Main runs the command and exits. A password in LWIO_PASSWORD is first
// moved out of the environment (secret.go).
func Main(prog string) {
	if err := scrubPasswordEnv(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: warning: %v; the password stays in this process's environment\n", prog, oneLine(err))
	}
	pw, handed, err := handedPassword()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s\n", prog, oneLine(err))
		os.Exit(2)
	}
	os.Exit(runEnv(prog, os.Args[1:], os.Stdout, os.Stderr, envWithHandedPassword(pw, handed)))
}

func run(prog string, args []string, stdout, stderr io.Writer) int {
	return runEnv(prog, args, stdout, stderr, os.Getenv)
}

// runEnv is the command with getenv as its environment.
func runEnv(prog string, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) > 0 {
		switch args[0] {
		case "stat":
			return runStat(args[1:], stdout, stderr)
		case "devices":
			return runDevices(args[1:], stdout, stderr)
		}
	}
	if len(args) == 1 && (args[0] == "-providers" || args[0] == "--providers" || args[0] == "providers") {
		describeProviders(stdout)
		return 0
	}
	if len(args) >= 1 && (args[0] == "login" || args[0] == "logout") {
		return runLogin(prog, args[0], args[1:], os.Stdin, stdout, stderr, getenv)
	}
	if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprint(stdout, usage)
		return 0
	}
	fail := func(code int, err error) int {
		fmt.Fprintf(stderr, "%s: %s\n", prog, oneLine(err))
		return code
	}
	o, err := parseArgs(args)
	if err != nil {
		return fail(2, err)
	}
	if err := o.resolveCredentials(getenv); err != nil {
		return fail(2, err)
	}
	ready := newReadyReporter()
	bg := !ready.active() && (o.Background != nil && *o.Background || o.Background == nil && startedByMountHelper())
	if bg {
		// Check what can be checked here, so the common mistakes fail
		// with the message on the caller's terminal either way.
		if err := checkMountpoint(o.Mountpoint); err != nil {
			return fail(1, err)
		}
		secret := ""
		if o.passwordFromEnv {
			secret = o.password
		}
		if err := background(o.LogFile, secret); err != nil {
			return fail(1, err)
		}
		return 0
	}
	logOut := stderr
	if o.LogFile != "" && !ready.active() {
		f, err := os.OpenFile(o.LogFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return fail(1, err)
		}
		defer f.Close()
		logOut = f
	}
	level := o.LogLevel
	if level == "" && o.Debug {
		level = "debug"
	}
	log, err := cli.NewLogger(logOut, level, o.LogFormat)
	if err != nil {
		return fail(2, err)
	}
	if err := checkFaultsEnv(log); err != nil {
		ready.report(err)
		return fail(2, err)
	}
	err = mount(o, log, ready)
	ready.report(err)
	if err != nil {
		return fail(1, err)
	}
	return 0
}

const usage = `usage: lwio-mount //HOST[:PORT]/SHARE MOUNTPOINT [-o opts]
       lwio-mount -providers
       lwio stat MOUNTPOINT [-json]     what a running mount moves, and how
       lwio devices [-json]             RDMA devices and the mounts using them
       lwio login|logout [-user NAME] [-credentials FILE] //HOST[:PORT]/SHARE|MOUNTPOINT
options (comma separated, mount(8) style):
  credentials=FILE   lines username=, password=, domain=
  username=NAME      user name (password from LWIO_PASSWORD or the credentials file)
  domain=NAME        NTLM domain
  ro                 read-only mount
  noexec             nothing on the mount may be executed (always nosuid,nodev);
                     exec (the default) undoes it
  seal               require sealing (AES-GCM encryption) of the session channel;
                     without it, sealed when the server or share asks
  provider=P         auto (default), verbs, softrdma, or none (session channel only)
  completion=M       auto (default: by each connection's load), interrupt or polling
  attr_timeout=SEC   attribute cache timeout (default 1)
  entry_timeout=SEC  name cache timeout (default 1)
  actimeo=SEC        both timeouts
  noleases           no leases: cache for the timeouts only, check at open, write through
  allow_other        let other users use the mount
  default_permissions  the kernel checks the mode bits of the owners shown
  uid=ID, gid=ID     local owner shown for the account's files (default: yours)
  idmap=M            user (default), none or names: how other owners show
  multiuser          each local user gets a session with their own credentials
  credentials_dir=DIR  multiuser: one credentials file per local user name (0600)
  guest_credentials=FILE  multiuser: for local users without credentials
  idle_timeout=SEC   multiuser: close a user's idle session (default 600)
  conns=N            RDMA connections to open (default: one per CPU, 2–16)
  readahead=KIB      readahead window (default 1024; 0 keeps the kernel's 128)
  writebehind=N      buffered writes of a file in flight (default 8; 0 writes through)
  sync_close         close(2) waits until the file's held-back writes are on the server
  pool_memory=MIB    registered data buffers kept between requests (default 32; 0: unbounded)
  split_read=KIB     reads this large go in pieces over idle connections (default 1024; 0: never)
  reconnect_timeout=SEC  how long file operations wait for a lost server (default 30)
  debug              log every FUSE request
  bg | fg            return once mounted | stay in the foreground (default: fg,
                     bg when started by mount(8)/mount.fuse3)
  log=FILE           log here instead of stderr
  log_level=L, log_format=text|json
`

func oneLine(err error) string {
	s := err.Error()
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}

// checkMountpoint refuses what would leave a confusing mount: a path that
// is not a directory, a non-empty directory, or one that is already a
// mount point.
func checkMountpoint(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) && errno == syscall.ENOTCONN {
			return fmt.Errorf("mountpoint %s: a dead FUSE mount is still there (umount -l %s)", p, p)
		}
		return fmt.Errorf("mountpoint %s: %v", p, unwrapPathErr(err))
	}
	if !st.IsDir() {
		return fmt.Errorf("mountpoint %s is not a directory", p)
	}
	parent, err := os.Stat(filepath.Join(p, ".."))
	if err == nil {
		a, b := st.Sys().(*syscall.Stat_t), parent.Sys().(*syscall.Stat_t)
		if a.Dev != b.Dev || a.Ino == b.Ino {
			return fmt.Errorf("mountpoint %s is busy: something is already mounted there", p)
		}
	}
	d, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("mountpoint %s: %v", p, unwrapPathErr(err))
	}
	defer d.Close()
	names, err := d.Readdirnames(1)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("mountpoint %s: %v", p, err)
	}
	if len(names) > 0 {
		return fmt.Errorf("mountpoint %s is not an empty directory", p)
	}
	return nil
}

func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// connectError turns a failure to reach, log on to, or tree-connect to the
// server, or to bring up the RDMA data path asked for, into the one-line
// message a user needs.
func connectError(o *Options, err error) error {
	var ne net.Error
	var oe *net.OpError
	stage := "dial"
	var de *fs.DialError
	if errors.As(err, &de) {
		stage, err = de.Step, de.Err
	}
	switch {
	case stage == "lwio":
		return fmt.Errorf("provider=%s: %v", o.Provider, err)
	case errors.Is(err, session.ErrLogonFailure), errors.Is(err, protocol.StatusLogonFailure):
		return fmt.Errorf("logon to %s as %q failed: wrong user name or password", o.Addr(), o.Username)
	case errors.Is(err, session.ErrNoAccount):
		return fmt.Errorf("logon to %s as %q refused: the server has no Unix account for this user (its administrator can create one, map the user to one with [users.%s] account, or set guest_account)", o.Addr(), o.Username, o.Username)
	case stage == "tree" && errors.Is(err, protocol.StatusBadNetworkName):
		return fmt.Errorf("share %q not found on %s", o.Share, o.Addr())
	case stage == "tree" && errors.Is(err, protocol.StatusAccessDenied):
		return fmt.Errorf("user %q may not use share %q on %s", o.Username, o.Share, o.Addr())
	case errors.As(err, &oe) && oe.Op == "dial", errors.Is(err, syscall.ECONNREFUSED),
		errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("cannot reach server %s: %v", o.Addr(), unwrapOp(err))
	}
	return fmt.Errorf("%s %s: %v", stage, o.Addr(), err)
}

func unwrapOp(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		if se, ok := oe.Err.(*os.SyscallError); ok {
			return se.Err
		}
		return oe.Err
	}
	return err
}

// mount connects, mounts, and serves until unmounted or signalled.
func mount(o *Options, log *logrus.Logger, ready *readyReporter) error {
	// Catch SIGINT/SIGTERM from the start: one that comes as the mount
	// appears must unmount cleanly, not kill the process with the mount
	// left behind (a signal before the mount is up unmounts it at once).
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	if err := checkMountpoint(o.Mountpoint); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	// Until the mount is up a signal aborts the connect; it is passed on
	// to the serving loop below, which then unmounts at once.
	early := make(chan os.Signal, 1)
	connecting, connected := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case s := <-sig:
			early <- s
			cancel()
		case <-connecting.Done():
		}
	}()
	defer func() { connected(); <-watched }()
	o.stats = new(fs.Stats)
	first := true
	dial := func(ctx context.Context) (*fs.Session, error) {
		s, err := dialSession(ctx, o, log)
		if err == nil && first && s.ReadOnly && !o.ReadOnly {
			log.WithField("share", o.Share).Info("share is read-only on the server: mounting read-only")
			o.ReadOnly = true
		}
		first = false
		return s, err
	}
	// The first dial's errors (wrong password, unknown share, unreachable
	// server) fail the mount; later ones are retried in the background.
	r, err := fs.NewReconnector(ctx, dial, o.ReconnectWait, log.WithField("component", "fs"))
	if err != nil {
		select {
		case s := <-early:
			return fmt.Errorf("interrupted by %v while connecting", s)
		default:
		}
		return err
	}
	defer r.Close()
	r.CountInto(o.stats)

	fopts := o.fsOptions()
	fopts.Logger = log.WithField("component", "fs")
	tree, data, um, stop := o.mountTree(r, log, &fopts)
	defer stop()
	srv, err := fs.Mount(o.Mountpoint, tree, data, fopts)
	if err != nil {
		return fmt.Errorf("mount %s: %v", o.Mountpoint, unwrapPathErr(errors.Unwrap(err)))
	}
	spareProcs()
	log.WithFields(logrus.Fields{"source": o.Source(), "mountpoint": o.Mountpoint, "user": o.Username,
		"data_path": r.Name(), "read_only": o.ReadOnly, "idmap": o.idMapMode().String(), "multiuser": o.MultiUser}).Info("mounted")
	if o.passwordFromEnv {
		// Once mounted, so that a failure stays one line.
		log.Warn("the password came from " + passwordEnv + ": other processes of yours can read a program's environment; " +
			"prefer -o credentials=FILE (mode 0600). It has been taken out of this process's environment")
	}
	if c := startControl(o, r, o.stats, log); c != nil {
		defer c.Close()
		um.serve(c)
	}
	ready.report(nil)
	connected()
	<-watched

	waited := make(chan struct{})
	go func() { srv.Wait(); close(waited) }()
	for {
		select {
		case <-waited:
			log.WithField("mountpoint", o.Mountpoint).Info("unmounted")
			return nil
		case s := <-early:
			log.WithField("signal", s.String()).Info("signalled while mounting: unmounting")
			unmount(srv, o.Mountpoint, log)
		case s := <-sig:
			log.WithField("signal", s.String()).Info("unmounting")
			unmount(srv, o.Mountpoint, log)
		}
	}
}

// unmount unmounts, detaching (lazily) when the mount is busy.
func unmount(srv *fs.Server, mountpoint string, log *logrus.Logger) {
	if err := srv.Unmount(); err != nil {
		// Busy: detach it so the name is free at once; the kernel
		// finishes with open files, and we exit after.
		log.WithError(err).Warn("unmount failed; detaching (lazy unmount)")
		if derr := syscall.Unmount(mountpoint, syscall.MNT_DETACH); derr != nil {
			log.WithError(derr).Error("lazy unmount failed")
		}
	}
}

// dialSession makes one session of the mount (fs.Dial) and turns a
// failure into the message a user needs.
func dialSession(ctx context.Context, o *Options, log *logrus.Logger) (*fs.Session, error) {
	s, err := fs.Dial(ctx, dialConfig(o, log))
	if err != nil {
		return nil, connectError(o, err)
	}
	return s, nil
}

// goFuseMaxReaders is go-fuse's cap on its request readers (maxMaxReaders
// in fuse/server.go); below it, NewServer starts as many as GOMAXPROCS.
const goFuseMaxReaders = 16

// spareProcs gives the Go scheduler two more Ps than go-fuse sized its
// request readers for (sysmonquiet.AddProcs). Between requests each reader
// is blocked in read(2) on /dev/fuse, and a goroutine in a system call
// keeps its P: with every P held so, sysmon finds no idle P, takes one back
// at every 20 µs tick (waking a thread that finds nothing to run) and never
// backs off. In a tar -x through a mount on 2 CPUs that was a fifth of
// lwio-mount's CPU and a quarter of its context switches (docs/bench.md);
// with a P to spare, sysmon leaves a short system call alone and sleeps
// longer. Two more still leave sysmon ticking at 20 µs much of a tar (up to
// three readers block at once); four more cut those ticks by 5× but cost
// the mount more CPU than they saved (more idle Ps, more threads woken to
// spin), and a sysmonquiet.Keeper, which the server needs, adds nothing
// here: the readers already hold Ps in system calls (docs/bench.md, "Go's
// sysmon"). It runs after fs.Mount (go-fuse reads GOMAXPROCS in
// NewServer); a GOMAXPROCS set in the environment is left as it is.
func spareProcs() {
	if runtime.GOMAXPROCS(0) <= goFuseMaxReaders {
		sysmonquiet.AddProcs(2)
	}
}
