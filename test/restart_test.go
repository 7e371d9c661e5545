package test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// Why a restarted server is exec'ed in a spare process, not forked by the
// test when it restarts.
//
// A test that holds a file open on a mount, with a write to it in flight
// when the server is killed (TestFsyncSurvivesKill), cannot fork the new
// server itself. The child gets a copy of the test's descriptor table, and
// execve closes the close-on-exec descriptors — every one Go opens — each
// close a FUSE flush for a file on a mount: fuse_flush writes the inode back
// and takes its lock, which the test's write holds while it waits for
// lwio-mount, which waits for a server: the one stuck in that execve. Nothing
// moved until lwio-mount gave the write up (reconnect_timeout, 30 s,
// ENOTCONN), once per request queued behind it: restarts took 31, 91, 121 s,
// the new server's process in D state inside execve all along (its /proc
// entries blocking: the exec holds its exec_update_lock), the killed server
// long gone; and the writer always got ENOTCONN, never carried on.
//
// So every server has a spare: /bin/sh, started with the server (before the
// test opens files on its mounts; and whatever it inherited, its own execve
// closed while the server was up), waiting on its stdin. restart writes it a
// line and it execs lwio-server with the server's arguments; its process is
// the server's from then on. It holds no file, so the exec waits for no
// mount. An unused spare exits when its stdin closes at the test's end.

// spare is a process waiting to exec a restarted lwio-server.
type spare struct {
	p *proc
	w *os.File // its stdin: a line execs the server, EOF ends it
}

func startSpare(t testing.TB, args []string) *spare {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p := startProcIn(t, "lwio-server (restarted)", nil, r, []string{"LWIO_PASSWORD=" + testPassword},
		"/bin/sh", append([]string{"-c", `read -r go && exec "$@"`, "sh", binaries.server}, args...)...)
	r.Close()
	sp := &spare{p: p, w: w}
	t.Cleanup(func() {
		if sp.w.Close() != nil { // exec'ed: the server's cleanup stops it
			return
		}
		select {
		case <-p.done:
		case <-time.After(stopTimeout):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return sp
}

// exec turns the spare into the server: its process is the server's.
func (sp *spare) exec(t testing.TB) *proc {
	t.Helper()
	// Until its shell waits at `read -r go`, the spare may still be
	// starting: the dynamic loader holds libc open for a moment (seen
	// under a drop_caches loop). The files it holds then are the ones its
	// execve would close.
	pid := sp.p.cmd.Process.Pid
	testutil.Eventually(t, "the spare waiting on its stdin", 10*time.Second, func() bool { return sp.p.exited() || readingStdin(pid) })
	if held := heldFiles(t, pid); len(held) > 0 {
		t.Fatalf("the spare that execs the restarted server holds files, whose close its execve may wait for: %q", held)
	}
	_, err := sp.w.Write([]byte("go\n"))
	sp.w.Close()
	if err != nil {
		t.Fatalf("telling the spare to exec lwio-server: %v\n%s", err, sp.p.out)
	}
	return sp.p
}

// readingStdin reports whether pid is blocked in a read(2) of its
// descriptor 0 (/proc/PID/syscall: the call's number, then its arguments).
func readingStdin(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "syscall"))
	f := strings.Fields(string(b))
	return err == nil && len(f) > 1 && f[0] == strconv.Itoa(unix.SYS_READ) && f[1] == "0x0"
}

// heldFiles is what pid's descriptors name, pipes, sockets, anonymous
// inodes and /dev/null left out: the files an execve by pid would close.
func heldFiles(t testing.TB, pid int) []string {
	t.Helper()
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if l == "/dev/null" || strings.HasPrefix(l, "pipe:") || strings.HasPrefix(l, "socket:") || strings.HasPrefix(l, "anon_inode:") {
			continue
		}
		held = append(held, l)
	}
	return held
}

// TestRestartExecsHoldingNoMountFile: the process a restart execs the
// server in holds no file of the mount the test has a file open on (the
// test's own process does: the check sees one), so its execve has no FUSE
// flush to wait for. A restart forked by the test, as before, failed it:
// the restart then waited for the mount's reconnect timeout, per write in
// flight.
func TestRestartExecsHoldingNoMountFile(t *testing.T) {
	s := startServer(t, ServerConfig{})
	m := mountShare(t, s, MountConfig{})
	f, err := os.Create(filepath.Join(m.Dir, "open"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	under := func(held []string) (n int) {
		for _, h := range held {
			if strings.HasPrefix(h, m.Dir+"/") {
				n++
			}
		}
		return n
	}
	if under(heldFiles(t, os.Getpid())) == 0 {
		t.Fatalf("heldFiles does not see the test's own file on the mount: %q", heldFiles(t, os.Getpid()))
	}
	for round := 0; round < 2; round++ {
		if held := heldFiles(t, s.spare.p.cmd.Process.Pid); under(held) > 0 {
			t.Fatalf("round %d: the process the restart will exec lwio-server in holds files of the mount: %q", round, held)
		}
		s.crashAndRestart(t)
	}
}
