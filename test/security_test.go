package test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// mountOptions are the per-mount options of the mount at dir in
// /proc/self/mountinfo (the sixth field: rw, nosuid, nodev, noexec, …).
func mountOptions(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 5 && unescapeMountinfo(fields[4]) == dir {
			return strings.Split(fields[5], ",")
		}
	}
	t.Fatalf("%s is not in /proc/self/mountinfo", dir)
	return nil
}

func hasAll(have []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

// TestMountFlags: a mount is nosuid and nodev whatever mount.fuse3 would
// pass; -o noexec makes it noexec, and a program on it cannot run.
func TestMountFlags(t *testing.T) {
	s := startServer(t, ServerConfig{})
	plain := mountShare(t, s, MountConfig{Options: []string{"suid", "dev"}})
	noexec := mountShare(t, s, MountConfig{Options: []string{"noexec"}})
	if o := mountOptions(t, plain.Dir); !hasAll(o, "nosuid", "nodev") || hasAll(o, "noexec") {
		t.Errorf("default mount: options %v, want nosuid,nodev and not noexec", o)
	}
	if o := mountOptions(t, noexec.Dir); !hasAll(o, "nosuid", "nodev", "noexec") {
		t.Errorf("-o noexec: options %v, want nosuid,nodev,noexec", o)
	}
	script := filepath.Join(plain.Dir, "hello.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho hello\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(script).Output(); err != nil || string(out) != "hello\n" {
		t.Errorf("running a script on the default mount: %q %v", out, err)
	}
	err := exec.Command(filepath.Join(noexec.Dir, "hello.sh")).Run()
	if !errors.Is(err, syscall.EACCES) {
		t.Errorf("running a script on the noexec mount: %v, want EACCES", err)
	}
}

// environOf is the environment a process started with, as
// /proc/PID/environ shows it to anyone who may read it.
func environOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPasswordLeavesEnvironment: a mount given its password in
// LWIO_PASSWORD warns, and the running mount's /proc/PID/environ does not
// hold the password — in the foreground, and in the background child a
// mount helper's bg starts.
func TestPasswordLeavesEnvironment(t *testing.T) {
	s := startServer(t, ServerConfig{})
	m := mountShare(t, s, MountConfig{})
	if env := environOf(t, m.p.cmd.Process.Pid); strings.Contains(env, testPassword) || strings.Contains(env, "LWIO_PASSWORD=") {
		t.Errorf("the mount's /proc/PID/environ holds the password: %q", env)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(m.p.out.String(), "the password came from LWIO_PASSWORD") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning about the password in the environment:\n%s", m.p.out)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// -o bg: the parent returns once mounted; the child serves the mount.
	mnt := t.TempDir()
	logf := filepath.Join(t.TempDir(), "mount.log")
	cmd := exec.Command(binaries.mount, s.URL("share"), mnt, "-o", "bg,log="+logf+",username="+testUser)
	cmd.Env = append(os.Environ(), "LWIO_PASSWORD="+testPassword)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("lwio-mount -o bg: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if fuseMounted(mnt) {
			if err := syscall.Unmount(mnt, 0); err != nil {
				forceUnmount(mnt)
			}
		}
	})
	child := mountProcess(t, mnt)
	if env := environOf(t, child); strings.Contains(env, testPassword) || strings.Contains(env, "LWIO_PASSWORD=") {
		t.Errorf("the background mount's /proc/PID/environ holds the password: %q", env)
	}
	if _, err := os.ReadDir(mnt); err != nil {
		t.Errorf("the background mount does not serve: %v", err)
	}
}

// mountProcess finds the lwio-mount process serving mnt.
func mountProcess(t *testing.T, mnt string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 2 && args[0] == binaries.mount && args[2] == mnt {
			return pid
		}
	}
	t.Fatalf("no lwio-mount process for %s", mnt)
	return 0
}

// TestFIFOThroughMount: a FIFO on the share is stat-able through the
// mount and, as on NFS, a local object of the client: the client's kernel
// opens it as a pipe of its own (a reader and a writer on this host meet
// in it), never the server's FIFO, whose open the server refuses anyway
// (share's and test/hostile's tests); the server goes on serving.
func TestFIFOThroughMount(t *testing.T) {
	s := startServer(t, ServerConfig{})
	m := mountShare(t, s, MountConfig{})
	if err := unix.Mkfifo(filepath.Join(m.Backing, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(m.Dir, "fifo")
	st, err := os.Lstat(p)
	if err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("stat of the FIFO through the mount: %v %v", st, err)
	}
	r, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatalf("open of the FIFO for reading, not blocking: %v", err)
	}
	defer r.Close()
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("open of the FIFO for writing, with a reader: %v", err)
	}
	w.Write([]byte("local"))
	w.Close()
	buf := make([]byte, 16)
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "local" {
		t.Errorf("through the client's own pipe: %q %v", buf[:n], err)
	}
	if _, err := os.ReadDir(m.Dir); err != nil {
		t.Errorf("the mount after the FIFO: %v", err)
	}
}

// stallNode is a directory whose lookups block until release is closed, or
// the calling thread is being killed: a disk that does not answer, waiting
// as a hard-mounted NFS share does (TASK_KILLABLE), which a killed process
// may leave but no other signal ends. The kernel sends a FUSE_INTERRUPT
// for any signal the blocked thread takes — a SIGTERM to the server lands
// on the thread when it is the main thread, which takes a process's
// signals first — and answering it would end the request the test means
// to be stuck. A killed thread's lookup is answered: the kernel waits out
// a request the filesystem has read, and the process would never go.
type stallNode struct {
	gofs.Inode
	entered     chan struct{}
	once        sync.Once
	release     chan struct{}
	tid         atomic.Int32 // the thread of the first lookup
	interrupted atomic.Int32 // interrupts not from a fatal signal, sat out
}

var _ = (gofs.NodeLookuper)((*stallNode)(nil))

func (n *stallNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	caller, ok := fuse.FromContext(ctx)
	n.once.Do(func() {
		if ok {
			n.tid.Store(int32(caller.Pid))
		}
		close(n.entered)
	})
	select {
	case <-n.release:
		return nil, syscall.ENOENT
	case <-ctx.Done(): // FUSE_INTERRUPT
	}
	if !ok || caller.Pid == 0 {
		return nil, syscall.EINTR // a thread it cannot watch: let it go
	}
	tid := int(caller.Pid)
	if !beingKilled(tid) {
		n.interrupted.Add(1)
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !beingKilled(tid) {
		select {
		case <-n.release:
			return nil, syscall.ENOENT
		case <-tick.C:
		}
	}
	return nil, syscall.EINTR
}

// beingKilled reports whether thread tid has a SIGKILL pending (its process
// exits or was killed), or is gone.
func beingKilled(tid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return true
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		if k != "SigPnd" && k != "ShdPnd" {
			continue
		}
		if m, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && m&(1<<(unix.SIGKILL-1)) != 0 {
			return true
		}
	}
	return false
}

// free lets every stalled lookup go.
func (n *stallNode) free() {
	n.once.Do(func() { close(n.entered) })
	select {
	case <-n.release:
	default:
		close(n.release)
	}
}

// mountStall mounts a stalling filesystem, in this process, until the test
// ends.
func mountStall(t *testing.T) (dir string, n *stallNode) {
	t.Helper()
	needFUSE(t)
	dir = t.TempDir()
	n = &stallNode{entered: make(chan struct{}), release: make(chan struct{})}
	srv, err := gofs.Mount(dir, n, &gofs.Options{MountOptions: fuse.MountOptions{
		FsName: "stall", Name: "stall", DirectMount: true, AllowOther: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.free()
		if err := srv.Unmount(); err != nil {
			forceUnmount(dir)
		}
	})
	return dir, n
}

// TestSIGTERMWithStuckDisk: SIGTERM stops the server within its shutdown
// bound while a client's request is stuck in a disk that does not answer
// and other connections sit there without logging on; the server says it
// left the request behind, and exits 0.
func TestSIGTERMWithStuckDisk(t *testing.T) {
	stall, node := mountStall(t)
	s := startServer(t, ServerConfig{Shares: map[string]string{"share": t.TempDir(), "stall": stall}})
	t.Cleanup(node.free) // before the server's cleanup waits for it
	m := mountShare(t, s, MountConfig{Share: "stall", Options: []string{"reconnect_timeout=1"}})
	go os.Stat(filepath.Join(m.Dir, "stuck")) // blocks in the server's lstat
	select {
	case <-node.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the server's lookup never reached the stalling filesystem")
	}
	for range 5 {
		c, err := net.Dial("tcp", s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	if int(node.tid.Load()) == s.p.cmd.Process.Pid {
		t.Error("the request stuck in the disk blocks the server's main thread, which the kernel gives the process's SIGTERM")
	}
	start := time.Now()
	s.p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.p.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("lwio-server still runs 15 s after SIGTERM:\n%s", s.p.out)
	}
	took := time.Since(start)
	t.Logf("lwio-server exited %v after SIGTERM with a request stuck in the disk", took.Round(time.Millisecond))
	if k := node.interrupted.Load(); k > 0 {
		t.Logf("the stuck lookup sat out %d interrupt(s) of its thread", k)
	}
	if s.p.err != nil {
		t.Errorf("lwio-server exit: %v, want 0", s.p.err)
	}
	if took > 8*time.Second {
		t.Errorf("lwio-server took %v to stop; its bound is 5 s", took)
	}
	out := s.p.out.String()
	if !strings.Contains(out, "shutdown") || !strings.Contains(out, "still") {
		t.Errorf("the server did not say it left a request behind:\n%s", out)
	}
}
