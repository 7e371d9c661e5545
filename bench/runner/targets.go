package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// target is one way of reaching the exported directory.
type target struct {
	Name string
	Dir  string // where fio and meta.sh work
	// DataPath is how an lwiofs mount moves file data, from its log.
	DataPath string
	// client and server are the roots of the process trees whose CPU time
	// is charged to this target (nil: none, e.g. the directory itself).
	client, server *daemon
	// ports are the server's listening ports: the bytes on the sockets
	// bound to them are the target's wire bytes (none: nothing counted).
	ports []int
	// lwioStat is, for an lwiofs mount, the lwio command whose `stat
	// -json` gives the bytes of the RDMA connections ss cannot see
	// (sampleWire). Without it (or with one that cannot answer) the
	// target's wire is not counted: ss alone would miss those bytes.
	lwioStat string
}

func (t *target) alive() error {
	for _, d := range []*daemon{t.client, t.server} {
		if d != nil && d.exited() {
			return fmt.Errorf("%s exited during the run: %v\n%s", d.name, d.err, d.logTail())
		}
	}
	return nil
}

// daemon is a process the bench started and must stop.
type daemon struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func startDaemon(name, logPath string, env []string, bin string, args ...string) (*daemon, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	d := &daemon{name: name, log: logPath, done: make(chan struct{})}
	d.cmd = exec.Command(bin, args...)
	d.cmd.Env = append(os.Environ(), env...)
	d.cmd.Stdout, d.cmd.Stderr = lf, lf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %v", name, err)
	}
	go func() {
		d.err = d.cmd.Wait()
		lf.Close()
		close(d.done)
	}()
	return d, nil
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

func (d *daemon) logTail() string {
	b, _ := os.ReadFile(d.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// stop sends SIGTERM, waits, then kills; it also kills, by PID, whatever
// descendants the daemon left behind.
func (d *daemon) stop() {
	if d.exited() {
		return
	}
	kids := descendants(d.pid())
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		logf("%s did not exit on SIGTERM; killing it", d.name)
		_ = d.cmd.Process.Kill()
		<-d.done
	}
	for _, k := range kids {
		if p, err := os.FindProcess(k); err == nil && procStart(k) != "" {
			_ = p.Signal(syscall.SIGTERM)
		}
	}
}

// setupEnv is one export's: one sshd, and one lwio-server per set of
// binaries and server flags, serve every mount that needs them.
type setupEnv struct {
	work, export, nullfs string
	lwio                 map[string]lwioSpec // by target name
	servers              map[string]*lwioServer
}

// setupTarget mounts one target; the cleanup, when not nil, must run even
// when err is not nil.
func (env *setupEnv) setupTarget(ctx context.Context, name string) (*target, func(), error) {
	work, export, nullfs := env.work, env.export, env.nullfs
	switch name {
	case "dir":
		return &target{Name: name, Dir: export}, nil, nil
	case "nullfs":
		mnt := filepath.Join(work, "mnt-nullfs")
		if err := os.Mkdir(mnt, 0o755); err != nil {
			return nil, nil, err
		}
		d, err := startDaemon("nullfs", filepath.Join(work, "nullfs.log"), nil, nullfs, export, mnt)
		if err != nil {
			return nil, nil, err
		}
		cleanup := func() { unmount(d, mnt) }
		return &target{Name: name, Dir: mnt, client: d}, cleanup, waitMounted(d, mnt)
	case "sshfs":
		return env.setupSSHFS(ctx)
	}
	if spec, ok := env.lwio[name]; ok {
		return env.setupLWIO(spec)
	}
	return nil, nil, fmt.Errorf("unknown target %q (dir, nullfs, sshfs, lwio-MODE or one defined by -lwio)", name)
}

func unmount(d *daemon, mnt string) {
	d.stop()
	if mounted(mnt) {
		logf("%s still mounted after %s exited; lazy unmount", mnt, d.name)
		if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
			_ = exec.Command("fusermount3", "-uz", mnt).Run()
		}
	}
}

func waitMounted(d *daemon, mnt string) error {
	deadline := time.Now().Add(20 * time.Second)
	for !mounted(mnt) {
		if d.exited() {
			return fmt.Errorf("%s exited before mounting: %v: %s", d.name, d.err, d.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not mount %s in 20s: %s", d.name, mnt, d.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func mounted(dir string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && fields[4] == dir {
			return true
		}
	}
	return false
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func waitListening(d *daemon, addr string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if d.exited() {
			return fmt.Errorf("%s exited: %v: %s", d.name, d.err, d.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is not listening on %s after 20s: %s", d.name, addr, d.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// setupSSHFS starts a throwaway sshd on a loopback port, with generated
// host and user keys, and mounts the export over it with sshfs.
func (env *setupEnv) setupSSHFS(ctx context.Context) (*target, func(), error) {
	for _, b := range []string{"/usr/sbin/sshd", "sshfs", "ssh-keygen"} {
		if _, err := exec.LookPath(b); err != nil {
			return nil, nil, fmt.Errorf("%s is not installed (scripts/deps.sh bench): %v", b, err)
		}
	}
	dir := filepath.Join(env.work, "ssh")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, nil, err
	}
	hostKey, userKey := filepath.Join(dir, "host_ed25519"), filepath.Join(dir, "user_ed25519")
	for _, k := range []string{hostKey, userKey} {
		if out, err := exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", k).CombinedOutput(); err != nil {
			return nil, nil, fmt.Errorf("ssh-keygen: %v: %s", err, out)
		}
	}
	pub, err := os.ReadFile(userKey + ".pub")
	if err != nil {
		return nil, nil, err
	}
	authKeys := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(authKeys, pub, 0o600); err != nil {
		return nil, nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	user := "root"
	if u := os.Getenv("USER"); u != "" && os.Geteuid() != 0 {
		user = u
	}
	conf := filepath.Join(dir, "sshd_config")
	cfg := fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
HostKey %s
AuthorizedKeysFile %s
PidFile %s
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
AllowTcpForwarding no
Subsystem sftp internal-sftp
`, port, hostKey, authKeys, filepath.Join(dir, "sshd.pid"))
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		return nil, nil, err
	}
	_ = os.MkdirAll("/run/sshd", 0o755) // privilege separation directory
	sshd, err := startDaemon("sshd", filepath.Join(env.work, "sshd.log"), nil, "/usr/sbin/sshd", "-D", "-e", "-f", conf)
	if err != nil {
		return nil, nil, err
	}
	cleanups := []func(){sshd.stop}
	cleanup := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	if err := waitListening(sshd, fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		return nil, cleanup, err
	}
	mnt := filepath.Join(env.work, "mnt-sshfs")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return nil, cleanup, err
	}
	// sshfs's own defaults otherwise; -f keeps it in the foreground so its
	// PID (and its ssh child) is the client whose CPU is charged.
	d, err := startDaemon("sshfs", filepath.Join(env.work, "sshfs.log"), nil, "sshfs", "-f",
		fmt.Sprintf("%s@127.0.0.1:%s", user, env.export), mnt,
		"-p", strconv.Itoa(port),
		"-o", "IdentityFile="+userKey+",StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes,LogLevel=ERROR")
	if err != nil {
		return nil, cleanup, err
	}
	cleanups = append(cleanups, func() { unmount(d, mnt) })
	return &target{Name: "sshfs", Dir: mnt, client: d, server: sshd, ports: []int{port}}, cleanup, waitMounted(d, mnt)
}
