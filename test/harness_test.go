package test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// Credentials every test server knows.
const (
	testUser     = "alice"
	testPassword = "correct horse battery staple"
)

// Timeouts of the harness: how long a process may take to become ready and
// to exit after SIGTERM.
const (
	readyTimeout = 20 * time.Second
	stopTimeout  = 15 * time.Second
)

// binaries are the programs TestMain built; a field is empty when that
// program could not be built, and the matching skip reason says why.
var binaries struct {
	dir    string
	server string // lwio-server
	mount  string // lwio-mount
	lwio   string // lwio: lwio-mount's other name, with lwio stat and lwio devices
	nullfs string // bench/nullfs, the no-op FUSE reference
	// lwioSkip is why the lwiofs tests cannot run ("" when they can).
	lwioSkip string
	// lwioErr is set when the sources are there but did not build: the
	// lwiofs tests then fail with it instead of skipping.
	lwioErr  error
	nullSkip string
	nullErr  error
}

func TestMain(m *testing.M) {
	if dir := os.Getenv(corruptFSEnv); dir != "" {
		// This binary re-executed as the corrupting filesystem of
		// mutation_test.go: serve it, then exit.
		os.Exit(serveCorruptFS(dir, os.Args[len(os.Args)-1]))
	}
	if os.Getenv(posixDirEnv) != "" {
		// TestPOSIXAt on a mount made elsewhere (the Soft-RoCE guest, or
		// this binary run as another local user by users_test.go): it
		// needs no binaries, and that user could not build them.
		os.Exit(m.Run())
	}
	code := func() int {
		dir, err := os.MkdirTemp("", "lwiofs-e2e-bin-")
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		buildAll(dir)
		return m.Run()
	}()
	os.Exit(code)
}

// repoRoot is the module root: the tests run in test/.
func repoRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return filepath.Dir(wd)
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if r := os.Getenv("GOROOT"); r != "" {
		return filepath.Join(r, "bin", "go")
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// hasMain reports whether dir holds a Go main package, i.e. whether the
// program is supposed to exist in this tree.
func hasMain(dir string) bool {
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err == nil && bytes.Contains(b, []byte("package main")) {
			return true
		}
	}
	return false
}

func buildAll(dir string) {
	binaries.dir = dir
	root := repoRoot()
	build := func(pkg, out string) error {
		cmd := exec.Command(goTool(), "build", "-o", out, "./"+pkg)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./%s: %v\n%s", pkg, err, b)
		}
		return nil
	}
	var missing []string
	for _, p := range []string{"cmd/lwio-server", "cmd/lwio-mount"} {
		if !hasMain(filepath.Join(root, p)) {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		binaries.lwioSkip = fmt.Sprintf("no main package in %s yet (issue 7 items 1-2): nothing to test end to end",
			strings.Join(missing, ", "))
	} else {
		binaries.server = filepath.Join(dir, "lwio-server")
		binaries.mount = filepath.Join(dir, "lwio-mount")
		binaries.lwio = filepath.Join(dir, "lwio")
		binaries.lwioErr = errors.Join(build("cmd/lwio-server", binaries.server), build("cmd/lwio-mount", binaries.mount),
			build("cmd/lwio", binaries.lwio))
	}
	if !hasMain(filepath.Join(root, "bench/nullfs")) {
		binaries.nullSkip = "bench/nullfs is not in this tree"
	} else {
		binaries.nullfs = filepath.Join(dir, "nullfs")
		binaries.nullErr = build("bench/nullfs", binaries.nullfs)
	}
}

// needFUSE skips when the kernel offers no FUSE device.
func needFUSE(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("SKIP: /dev/fuse is missing (%v): no FUSE mount is possible on this machine", err)
	}
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			t.Skipf("SKIP: not root and no fusermount3: no FUSE mount is possible for this user")
		}
	}
}

// needLWIO skips or fails depending on whether the binaries are expected.
func needLWIO(t testing.TB) {
	t.Helper()
	needBuilt(t, binaries.lwioSkip, binaries.lwioErr, "the binaries are in the tree but do not build")
}

func needNullFS(t testing.TB) {
	t.Helper()
	needBuilt(t, binaries.nullSkip, binaries.nullErr, "bench/nullfs does not build")
}

// needBuilt needs FUSE and a program: skipped with skip's reason when it
// is not in the tree, failed with what and err when it does not build.
func needBuilt(t testing.TB, skip string, err error, what string) {
	t.Helper()
	needFUSE(t)
	if skip != "" {
		t.Skip("SKIP: " + skip)
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func needTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("SKIP: %s is not installed (scripts/deps.sh installs it): %v", name, err)
	}
	return p
}

// freeAddr returns a loopback address with a port nothing listened on a
// moment ago, below the ephemeral range (testutil.LoopbackAddr): the server
// is restarted on it (crashAndRestart). Another process may take it first;
// startServer retries.
func freeAddr(t testing.TB) string { return testutil.LoopbackAddr(t) }

// logBuffer collects a process's output, safe for concurrent use, and
// keeps only the last part so a chatty process cannot eat the memory.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

const logKeep = 256 << 10

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if b.buf.Len() > 2*logKeep {
		tail := append([]byte(nil), b.buf.Bytes()[b.buf.Len()-logKeep:]...)
		b.buf.Reset()
		b.buf.WriteString("[... earlier output dropped ...]\n")
		b.buf.Write(tail)
	}
	return len(p), nil
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a started program and its exit.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *logBuffer
	done chan struct{}
	err  error // valid once done is closed
}

func startProc(t testing.TB, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	return startProcAs(t, name, nil, env, bin, args...)
}

// startProcAs is startProc as the user cred names (nil: the test's own).
func startProcAs(t testing.TB, name string, cred *syscall.Credential, env []string, bin string, args ...string) *proc {
	t.Helper()
	return startProcIn(t, name, cred, nil, env, bin, args...)
}

// startProcIn is startProcAs reading stdin (nil: /dev/null).
func startProcIn(t testing.TB, name string, cred *syscall.Credential, stdin *os.File, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &logBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	if stdin != nil {
		p.cmd.Stdin = stdin
	}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	// Its own process group: a test's Ctrl-C or SIGTERM is for the test.
	// SIGTERM when the test binary dies (a -timeout panic, a crash), so a
	// mount or server never outlives the test that started it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM, Credential: cred}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits; it returns the exit error, or an error
// saying it had to be killed.
func (p *proc) stop() error {
	if p.exited() {
		return p.err
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not exit within %v of SIGTERM; killed", p.name, stopTimeout)
	}
}

// Server is a running lwio-server.
type Server struct {
	Addr   string // session channel
	Soft   string // softrdma listener
	Shares map[string]string
	p      *proc
	args   []string
	// spare is the process the next restart execs the server in,
	// started while the test held no files on its mounts (restart_test.go).
	spare *spare
}

// ServerConfig is what a test asks of a server. A share path ending in
// ":ro" is exported read-only.
type ServerConfig struct {
	Shares map[string]string
	Args   []string // extra flags
	// Cred, when set, runs the server as that user instead of the
	// test's (root).
	Cred *syscall.Credential
	// Env is added to the server's environment.
	Env []string
}

// startServer runs lwio-server until the test ends; the cleanup checks it
// exits 0 on SIGTERM.
func startServer(t testing.TB, cfg ServerConfig) *Server {
	t.Helper()
	needLWIO(t)
	if cfg.Shares == nil {
		cfg.Shares = map[string]string{"share": t.TempDir()}
	}
	var lastOut string
	for attempt := 0; attempt < 3; attempt++ {
		s := &Server{Addr: freeAddr(t), Soft: freeAddr(t), Shares: cfg.Shares}
		// The test user has no Unix account: it acts as root (which the
		// tests run as) on shares that allow it. identity_test.go tests
		// users acting as their own accounts. A state directory of its own
		// (kept across crashAndRestart: the same arguments), not the
		// host's /var/lib/lwio.
		stateParent := t.TempDir()
		if cfg.Cred != nil { // the server's account makes it
			if err := os.Chown(stateParent, int(cfg.Cred.Uid), int(cfg.Cred.Gid)); err != nil {
				t.Fatal(err)
			}
		}
		args := []string{"-listen", s.Addr, "-soft", s.Soft, "-user", testUser, "-account", "root", "-allow-root",
			"-state-dir", filepath.Join(stateParent, "state")}
		for name, path := range cfg.Shares {
			args = append(args, "-share", name+"="+path)
		}
		args = append(args, cfg.Args...)
		s.args = args
		s.p = startProcAs(t, "lwio-server", cfg.Cred, append([]string{"LWIO_PASSWORD=" + testPassword}, cfg.Env...), binaries.server, args...)
		if waitListening(s.Addr, s.p) {
			s.spare = startSpare(t, s.args)
			t.Cleanup(func() {
				if err := s.p.stop(); err != nil {
					t.Errorf("lwio-server on SIGTERM: %v (want exit 0)\n%s", err, s.p.out)
				}
				if t.Failed() {
					t.Logf("lwio-server output:\n%s", s.p.out)
				}
			})
			return s
		}
		_ = s.p.stop()
		lastOut = s.p.out.String()
		if !strings.Contains(lastOut, "address already in use") {
			break
		}
	}
	t.Fatalf("lwio-server did not start listening within %v:\n%s", readyTimeout, lastOut)
	return nil
}

func waitListening(addr string, p *proc) bool {
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		if p.exited() {
			return false
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// crashAndRestart kills the server with SIGKILL (no goodbye to anyone) and
// starts a new one with the same shares on the same addresses.
func (s *Server) crashAndRestart(t testing.TB) {
	t.Helper()
	_ = s.p.cmd.Process.Kill()
	<-s.p.done
	s.restart(t)
}

// restart starts the server again, with the same arguments, after it died:
// in the spare, not in a process forked now (restart_test.go says why).
func (s *Server) restart(t testing.TB) {
	t.Helper()
	s.p = s.spare.exec(t)
	if !waitListening(s.Addr, s.p) {
		t.Fatalf("the restarted lwio-server is not listening on %s:\n%s", s.Addr, s.p.out)
	}
	// The next restart's spare. Forked now, it may close the test's
	// files on a mount as it execs sh — with the server up, that returns.
	s.spare = startSpare(t, s.args)
}

// kill ends the mount's process with SIGKILL — its session dies with no
// goodbye — and detaches the dead mount.
func (m *Mount) kill(t testing.TB) {
	t.Helper()
	m.killed = true
	_ = m.p.cmd.Process.Kill()
	<-m.p.done
	forceUnmount(m.Dir)
}

// URL is the //host:port/share argument of lwio-mount.
func (s *Server) URL(share string) string { return "//" + s.Addr + "/" + share }

// Mount is a FUSE mount made by lwio-mount or nullfs.
type Mount struct {
	Dir     string // the mountpoint
	Backing string // the same directory on local disk
	p       *proc
	killed  bool // kill made its process die; the cleanup only unmounts
}

// MountConfig is what a test asks of lwio-mount.
type MountConfig struct {
	Share      string // default "share"
	Completion string // interrupt or polling; default interrupt
	Options    []string
	User       string // default testUser
	Password   string // default testPassword
}

// mountShare runs lwio-mount in the foreground until the test ends.
func mountShare(t testing.TB, s *Server, cfg MountConfig) *Mount {
	t.Helper()
	if cfg.Share == "" {
		cfg.Share = "share"
	}
	if cfg.Completion == "" {
		cfg.Completion = "interrupt"
	}
	if cfg.Password == "" {
		cfg.Password = testPassword
	}
	if cfg.User == "" {
		cfg.User = testUser
	}
	mnt := t.TempDir()
	opts := append([]string{"username=" + cfg.User, "completion=" + cfg.Completion}, cfg.Options...)
	p := startProc(t, "lwio-mount", []string{"LWIO_PASSWORD=" + cfg.Password}, binaries.mount,
		s.URL(cfg.Share), mnt, "-o", strings.Join(opts, ","))
	backing := strings.TrimSuffix(s.Shares[cfg.Share], ":ro")
	m := waitMounted(t, p, mnt, backing)
	checkDataPath(t, p)
	return m
}

// checkDataPath fails the test when lwio-mount says file data does not go
// over LWIO (a silent fallback to the session channel would pass every
// POSIX check while testing none of the RDMA data path). It reads the
// data_path= field of the start-up log; without one it only notes that.
func checkDataPath(t testing.TB, p *proc) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		out := p.out.String()
		if i := strings.Index(out, "data_path="); i >= 0 {
			path := strings.Fields(out[i+len("data_path="):])[0]
			if !strings.HasPrefix(path, "lwio") {
				t.Errorf("lwio-mount moves file data over %q, not LWIO:\n%s", path, out)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Logf("note: lwio-mount logged no data_path= field; cannot tell which data path it uses")
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mountNullFS mounts bench/nullfs over dir.
func mountNullFS(t testing.TB, dir string) *Mount {
	t.Helper()
	needNullFS(t)
	mnt := t.TempDir()
	p := startProc(t, "nullfs", nil, binaries.nullfs, dir, mnt)
	return waitMounted(t, p, mnt, dir)
}

func waitMounted(t testing.TB, p *proc, mnt, backing string) *Mount {
	t.Helper()
	m := &Mount{Dir: mnt, Backing: backing, p: p}
	// Registered before waiting so that a mount that appears late is still
	// taken down. Cleanups run last-in first-out: this one runs before
	// t.TempDir's removal of mnt and before the server stops.
	t.Cleanup(func() { m.unmount(t) })
	deadline := time.Now().Add(readyTimeout)
	for {
		if fuseMounted(mnt) {
			return m
		}
		if p.exited() {
			t.Fatalf("%s exited before mounting %s: %v\n%s", p.name, mnt, p.err, p.out)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not mount %s within %v:\n%s", p.name, mnt, readyTimeout, p.out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unmount stops the mount process with SIGTERM (a clean unmount, exit 0),
// and falls back to a lazy unmount so that no test leaves a mount behind.
func (m *Mount) unmount(t testing.TB) {
	err := m.p.stop()
	if m.killed {
		err = nil
	}
	if err != nil {
		t.Errorf("%s on SIGTERM: %v (want a clean unmount and exit 0)\n%s", m.p.name, err, m.p.out)
	} else if t.Failed() {
		t.Logf("%s output:\n%s", m.p.name, m.p.out)
	}
	if fuseMounted(m.Dir) {
		t.Errorf("%s exited but %s is still mounted; unmounting lazily", m.p.name, m.Dir)
		forceUnmount(m.Dir)
	}
}

func forceUnmount(dir string) {
	if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
		_ = exec.Command("fusermount3", "-uz", dir).Run()
	}
}

// mountEntry returns the /proc/self/mountinfo fields of the mount at dir:
// the filesystem type and the source; ok is false when nothing is mounted
// there.
func mountEntry(dir string) (fstype, source string, ok bool) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || unescapeMountinfo(fields[4]) != dir {
			continue
		}
		for i := 5; i < len(fields)-2; i++ {
			if fields[i] == "-" {
				fstype, source, ok = fields[i+1], fields[i+2], true
			}
		}
	}
	return fstype, source, ok
}

func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(byte(c))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func fuseMounted(dir string) bool {
	fstype, _, ok := mountEntry(dir)
	return ok && (fstype == "fuse" || strings.HasPrefix(fstype, "fuse."))
}

// runCmd runs a tool to completion in dir and fails the test with its
// output if it fails.
func runCmd(t testing.TB, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, tail(out.String(), 8<<10))
		}
	case <-time.After(5 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s %s: still running after 5 minutes; killed\n%s", name, strings.Join(args, " "), tail(out.String(), 8<<10))
	}
	return out.String()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "[...]" + s[len(s)-n:]
}

// copyFile is cp for the tests that need a file elsewhere.
func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
