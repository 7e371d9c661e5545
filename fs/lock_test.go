package fs

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/fileserver"
)

// twoMounts serves a new directory once and mounts it twice, each mount
// with its own session through a Reconnector, as two client hosts would.
// The first mount's session channel goes through a proxy the test can cut.
func twoMounts(t *testing.T) (share, a, b string, srv *fileserver.Server, cut func()) {
	t.Helper()
	needFUSE(t)
	share = t.TempDir()
	srv = serve(t, share, "127.0.0.1:0", "127.0.0.1:0", nil)
	p := newProxy(t, srv.SessionAddr())
	mount := func(addr string) string {
		log := logrus.New()
		log.SetLevel(logrus.PanicLevel)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		r, err := NewReconnector(ctx, dialer(addr, client.Interrupt), 20*time.Second, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return mountOn(t, r, r)
	}
	return share, mount(p.addr), mount(srv.SessionAddr()), srv, p.cut
}

// proxy forwards TCP connections to a target; cut resets the ones open.
type proxy struct {
	addr  string
	mu    sync.Mutex
	conns []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	p := &proxy{}
	p.addr = testutil.Relay(t, target, func(c, u net.Conn) {
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		go func() { io.Copy(u, c); u.Close() }()
		go func() { io.Copy(c, u); c.Close() }()
	})
	return p
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func openRW(t *testing.T, p string) *os.File {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// sharedFile writes data to name in the served directory and opens it
// read-write through both mounts: one file two clients lock and change.
func sharedFile(t *testing.T, share, a, b, name string, data []byte) (fa, fb *os.File) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(share, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return openRW(t, filepath.Join(a, name)), openRW(t, filepath.Join(b, name))
}

// ofd sets an OFD lock (F_OFD_SETLK or, waiting, F_OFD_SETLKW).
func ofd(f *os.File, typ int16, start, n int64, wait bool) error {
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	fl := unix.Flock_t{Type: typ, Whence: io.SeekStart, Start: start, Len: n}
	return unix.FcntlFlock(f.Fd(), cmd, &fl)
}

// posix sets a classic process-owned lock (F_SETLK).
func posix(f *os.File, typ int16, start, n int64) error {
	fl := unix.Flock_t{Type: typ, Whence: io.SeekStart, Start: start, Len: n}
	return unix.FcntlFlock(f.Fd(), unix.F_SETLK, &fl)
}

// TestLocksTwoMounts: fcntl (OFD and POSIX) and flock locks taken through
// one mount hold against the other, F_GETLK reports the holder's range and
// type, two descriptors of one process share its POSIX locks, and a close
// of either releases them (FLUSH).
func TestLocksTwoMounts(t *testing.T) {
	share, a, b, _, _ := twoMounts(t)
	fa, fb := sharedFile(t, share, a, b, "db", make([]byte, 100))

	if err := ofd(fa, unix.F_WRLCK, 10, 10, false); err != nil {
		t.Fatalf("A's OFD lock: %v", err)
	}
	if err := ofd(fb, unix.F_RDLCK, 15, 1, false); err != unix.EAGAIN {
		t.Errorf("B against A's lock: %v, want EAGAIN", err)
	}
	fl := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: 0, Len: 0}
	if err := unix.FcntlFlock(fb.Fd(), unix.F_GETLK, &fl); err != nil {
		t.Fatal(err)
	}
	if fl.Type != unix.F_WRLCK || fl.Start != 10 || fl.Len != 10 || fl.Pid != 0 {
		t.Errorf("F_GETLK = type %d %d+%d pid %d, want write 10+10 pid 0 (a remote holder)", fl.Type, fl.Start, fl.Len, fl.Pid)
	}
	if err := ofd(fb, unix.F_WRLCK, 20, 10, false); err != nil {
		t.Errorf("B beside A's lock: %v", err)
	}
	if err := ofd(fa, unix.F_UNLCK, 10, 10, false); err != nil {
		t.Fatal(err)
	}
	if err := ofd(fb, unix.F_WRLCK, 10, 10, false); err != nil {
		t.Errorf("B after A's unlock: %v", err)
	}
	ofd(fb, unix.F_UNLCK, 0, 0, false)

	// One process, two descriptors on mount A: one POSIX owner.
	fa2 := openRW(t, filepath.Join(a, "db"))
	if err := posix(fa, unix.F_WRLCK, 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := posix(fa2, unix.F_WRLCK, 3, 5); err != nil {
		t.Errorf("the same process through a second descriptor: %v (its own lock must not conflict)", err)
	}
	if err := ofd(fb, unix.F_WRLCK, 0, 1, false); err != unix.EAGAIN {
		t.Errorf("B against A's POSIX lock: %v, want EAGAIN", err)
	}
	fa2.Close() // POSIX: any close drops the process's locks on the file
	if err := ofd(fb, unix.F_WRLCK, 0, 8, false); err != nil {
		t.Errorf("B after A closed a descriptor of the file: %v", err)
	}
	ofd(fb, unix.F_UNLCK, 0, 0, false)

	// flock: its own space, whole file.
	if err := unix.Flock(int(fa.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(fb.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != unix.EWOULDBLOCK {
		t.Errorf("B's flock against A's: %v, want EWOULDBLOCK", err)
	}
	// A local process on the server host sees A's flock too.
	local := openRW(t, filepath.Join(share, "db"))
	if err := unix.Flock(int(local.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != unix.EWOULDBLOCK {
		t.Errorf("a local flock against A's: %v, want EWOULDBLOCK", err)
	}
	unix.Flock(int(fa.Fd()), unix.LOCK_UN)
	if err := unix.Flock(int(fb.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		t.Errorf("B's flock after A's unlock: %v", err)
	}

}

// TestLockWaitAndInterrupt: a blocked F_SETLKW on one mount is granted
// when the other releases (or when a local process on the server does),
// and one interrupted by a signal returns EINTR and leaves no waiter on
// the server — nor takes the lock later behind the program's back.
func TestLockWaitAndInterrupt(t *testing.T) {
	share, a, b, srv, _ := twoMounts(t)
	fa, fb := sharedFile(t, share, a, b, "db", make([]byte, 10))
	if err := ofd(fa, unix.F_WRLCK, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	granted := make(chan error, 1)
	go func() { granted <- ofd(fb, unix.F_WRLCK, 0, 1, true) }()
	waitFor(t, "B's wait on the server", func() bool { return srv.Session().LockWaits() == 1 })
	ofd(fa, unix.F_UNLCK, 0, 0, false)
	select {
	case err := <-granted:
		if err != nil {
			t.Fatalf("B's F_OFD_SETLKW: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("B's F_OFD_SETLKW not granted after A's unlock")
	}
	ofd(fb, unix.F_UNLCK, 0, 0, false)

	// A local process on the server host holds it: B waits, then gets it.
	local := openRW(t, filepath.Join(share, "db"))
	if err := ofd(local, unix.F_WRLCK, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	go func() { granted <- ofd(fb, unix.F_RDLCK, 0, 0, true) }()
	waitFor(t, "B's wait on a local lock", func() bool { return srv.Session().LockWaits() == 1 })
	ofd(local, unix.F_UNLCK, 0, 0, false)
	if err := <-granted; err != nil {
		t.Fatalf("B's wait on a local lock: %v", err)
	}
	ofd(fb, unix.F_UNLCK, 0, 0, false)

	// Interrupted: perl installs its handlers without SA_RESTART, so the
	// F_SETLKW returns EINTR to it.
	perl, err := exec.LookPath("perl")
	if err != nil {
		t.Skip("perl is not installed: cannot interrupt a blocked F_SETLKW from a program that sees EINTR")
	}
	if err := ofd(fa, unix.F_WRLCK, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	script := `use Fcntl; open(my $f, "+<", $ARGV[0]) or die "open: $!"; $SIG{ALRM} = sub {}; alarm 2;
		my $fl = pack("s s x4 q q l x4", F_WRLCK, 0, 0, 0, 0);
		if (fcntl($f, F_SETLKW, $fl)) { print "granted\n" } elsif ($!{EINTR}) { print "EINTR\n" } else { print "error: $!\n" }`
	out, err := exec.Command(perl, "-e", script, filepath.Join(b, "db")).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "EINTR" {
		t.Fatalf("interrupted F_SETLKW: %q %v, want EINTR", out, err)
	}
	waitFor(t, "the interrupted wait to leave the server", func() bool { return srv.Session().LockWaits() == 0 })
	ofd(fa, unix.F_UNLCK, 0, 0, false)
	time.Sleep(100 * time.Millisecond)
	if err := ofd(fa, unix.F_WRLCK, 0, 0, false); err != nil {
		t.Errorf("the interrupted wait took the lock after all: %v", err)
	}
}

// TestLockDropsCache: data another client wrote before releasing its lock
// is what a reader sees after taking the lock, though this mount had the
// file's pages cached and its attributes are fresh.
func TestLockDropsCache(t *testing.T) {
	share, a, b, _, _ := twoMounts(t)
	old := bytes.Repeat([]byte("o"), 8192)
	fa, fb := sharedFile(t, share, a, b, "db", old)
	buf := make([]byte, len(old))
	if _, err := fa.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, old) {
		t.Fatal("first read", err)
	}
	// B writes under its lock, same size.
	if err := ofd(fb, unix.F_WRLCK, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	upd := bytes.Repeat([]byte("n"), len(old))
	if _, err := fb.WriteAt(upd, 0); err != nil {
		t.Fatal(err)
	}
	ofd(fb, unix.F_UNLCK, 0, 0, false)
	if err := ofd(fa, unix.F_RDLCK, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := fa.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, upd) {
		t.Errorf("read under the lock after B's write: %q…, want %q…", buf[:8], upd[:8])
	}
}

// TestLockSurvivesConnectionCut: the session connection of the lock
// holder's mount is cut while the server lives: the mount reconnects and
// reclaims its durable open, and the lock is held all along — the other
// mount never gets it — and still the holder's to release.
func TestLockSurvivesConnectionCut(t *testing.T) {
	share, a, b, _, cut := twoMounts(t)
	fa, fb := sharedFile(t, share, a, b, "db", []byte("0123456789"))
	if err := ofd(fa, unix.F_WRLCK, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	cut()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if err := ofd(fb, unix.F_WRLCK, 0, 1, false); err != unix.EAGAIN {
			t.Fatalf("B while A reconnects: %v, want EAGAIN throughout", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A's descriptor works on the new session, and A still owns the lock.
	buf := make([]byte, 10)
	if _, err := fa.ReadAt(buf, 0); err != nil || string(buf) != "0123456789" {
		t.Fatalf("A's read after the reconnect: %q %v", buf, err)
	}
	if err := ofd(fb, unix.F_WRLCK, 0, 1, false); err != unix.EAGAIN {
		t.Errorf("B after A reconnected: %v, want EAGAIN", err)
	}
	if err := ofd(fa, unix.F_UNLCK, 0, 0, false); err != nil {
		t.Fatalf("A's unlock after the reconnect: %v", err)
	}
	if err := ofd(fb, unix.F_WRLCK, 0, 1, false); err != nil {
		t.Errorf("B after A's unlock: %v", err)
	}
}

// waitFor waits for cond as long as any test here may need to.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, what, 10*time.Second, cond)
}
