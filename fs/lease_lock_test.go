package fs

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Where leases meet locks, appends and durable handles (docs/usage.md,
// "Caching and consistency" and "Appends and locks"): each test uses two
// mounts of one share, as two client hosts would.

// TestLeaseKeptHandleNeverKeepsLocks: a read-only handle kept open on the
// server under a Handle lease must not keep the flock taken through it
// (the lock goes with the open file's last close, RELEASE): once the
// descriptor is closed, another mount gets the lock. The other mount opens
// read-only, so the first keeps its lease.
func TestLeaseKeptHandleNeverKeepsLocks(t *testing.T) {
	dir, a, b, _, _, ra, _ := leaseRoots(t, Options{})
	os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o644)
	// A read and close that the mount keeps (the control: handles are
	// kept here at all).
	if content(filepath.Join(a, "f")) != "data" {
		t.Fatal("first read")
	}
	pin(t, filepath.Join(a, "f"))
	soon(t, "a read handle kept", 2*time.Second, func() bool {
		ra.fs.lease.mu.Lock()
		defer ra.fs.lease.mu.Unlock()
		return len(ra.fs.lease.cached) == 1
	})
	fa, err := os.Open(filepath.Join(a, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(fa.Fd()), unix.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	fb, err := os.Open(filepath.Join(b, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	if err := unix.Flock(int(fb.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != syscall.EWOULDBLOCK {
		t.Fatalf("B's flock while A holds it: %v, want EWOULDBLOCK", err)
	}
	fa.Close()
	soon(t, "B's flock after A's close", 3*time.Second, func() bool {
		return unix.Flock(int(fb.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil
	})
}

// TestLeaseUnlockSendsHeldBack: what a Write lease held back reaches the
// server before an unlock returns, so the next holder of the lock —
// another client, or a process on the server host — reads it.
func TestLeaseUnlockSendsHeldBack(t *testing.T) {
	dir, a, _, _, _, ra, _ := leaseRoots(t, Options{})
	f, err := os.OpenFile(filepath.Join(a, "db"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := ofd(f, unix.F_WRLCK, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("under the lock"), 0); err != nil {
		t.Fatal(err)
	}
	// The control: the write is held back (the file was just created
	// here, so the mount holds Write).
	if n := leasedNode(t, ra, filepath.Join(dir, "db")); n == nil || !n.holding() {
		t.Fatal("the write was not held back: nothing to test")
	}
	if err := ofd(f, unix.F_UNLCK, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "db")); string(got) != "under the lock" {
		t.Errorf("the server's file right after the unlock: %q", got)
	}
}

// TestLeaseLockedElsewhereNotCached: a file this mount created (Write:
// writes held back) and another mount then opens and writes under a lock
// is read, under this mount's lock, as the other mount left it — the other
// open recalled Write (sending what was held back, which the other mount
// reads first) and the other's write ended Read.
func TestLeaseLockedElsewhereNotCached(t *testing.T) {
	_, a, b, _, _ := leaseMounts(t, Options{})
	fa, err := os.OpenFile(filepath.Join(a, "db"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	v1 := bytes.Repeat([]byte("1"), 4096)
	if _, err := fa.WriteAt(v1, 0); err != nil {
		t.Fatal(err)
	}
	fb := openRW(t, filepath.Join(b, "db"))
	if err := ofd(fb, unix.F_WRLCK, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(v1))
	if _, err := fb.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, v1) {
		t.Fatalf("B's read of A's held-back write: %q… %v", buf[:4], err)
	}
	v2 := bytes.Repeat([]byte("2"), len(v1))
	if _, err := fb.WriteAt(v2, 0); err != nil {
		t.Fatal(err)
	}
	if err := ofd(fb, unix.F_UNLCK, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := ofd(fa, unix.F_RDLCK, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := fa.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, v2) {
		t.Errorf("A's read under its lock after B's: %q…, want %q…", buf[:4], v2[:4])
	}
}

// TestLeaseAppendBreaksRead: mount b caches a file under a Read lease (and
// a minute's timeouts); appends on mount a — through an O_APPEND open,
// placed by the server — are seen by b's next read within 0.5 s.
func TestLeaseAppendBreaksRead(t *testing.T) {
	dir, a, b, _, _ := leaseMounts(t, Options{})
	os.WriteFile(filepath.Join(dir, "log"), []byte("one\n"), 0o644)
	if content(filepath.Join(b, "log")) != "one\n" {
		t.Fatal("b's first read")
	}
	f, err := os.OpenFile(filepath.Join(a, "log"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, line := range []string{"two\n", "three\n"} {
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
	}
	soon(t, "a's appends on b", 500*time.Millisecond, func() bool { return content(filepath.Join(b, "log")) == "one\ntwo\nthree\n" })
}

// TestLeaseKeptHandleClosedAfterReconnect: a read handle mount a kept
// under a Handle lease is a durable open on the server; when a's
// connection is cut the lease dies with it, and the handle is closed on
// the server right after the reconnect — not kept for the durable
// timeout (a minute), which would count it as an open for that long.
func TestLeaseKeptHandleClosedAfterReconnect(t *testing.T) {
	share, a, _, _, cut := twoMounts(t)
	p := filepath.Join(share, "f")
	os.WriteFile(p, []byte("data"), 0o644)
	if content(filepath.Join(a, "f")) != "data" {
		t.Fatal("first read")
	}
	// The control: the server holds the kept handle open.
	soon(t, "the server holding a's kept handle", 2*time.Second, func() bool { return openHere(p) > 0 })
	cut()
	soon(t, "the kept handle closed after the reconnect", 10*time.Second, func() bool { return openHere(p) == 0 })
	if content(filepath.Join(a, "f")) != "data" {
		t.Error("read after the reconnect")
	}
}

// leasedNode is the node of mount root's lease table for the server file
// p, or nil.
func leasedNode(t *testing.T, root *Node, p string) *Node {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	lc := root.fs.lease
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.nodes[st.Ino]
}

// openHere counts this process's descriptors open on the file p (the test
// runs the server in-process).
func openHere(p string) int {
	ents, _ := os.ReadDir("/proc/self/fd")
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.TrimSuffix(l, " (deleted)") == p {
			n++
		}
	}
	return n
}
