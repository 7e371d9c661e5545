package fs

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// countingTree is a mount's Reconnector that counts the requests that go
// to the server for names and attributes: what leases should save.
type countingTree struct {
	*Reconnector
	n atomic.Int64
}

func (c *countingTree) GetAttr(ctx context.Context, p string) (session.Attr, error) {
	c.n.Add(1)
	return c.Reconnector.GetAttr(ctx, p)
}

func (c *countingTree) Lease(ctx context.Context, p string, want LeaseState) (session.Attr, LeaseState, error) {
	c.n.Add(1)
	return c.Reconnector.Lease(ctx, p, want)
}

func (c *countingTree) Open(ctx context.Context, p string, flags int, mode uint32) (session.Handle, session.Attr, error) {
	c.n.Add(1)
	return c.Reconnector.Open(ctx, p, flags, mode)
}

func (c *countingTree) OpenLease(ctx context.Context, p string, flags int, mode uint32, want LeaseState) (session.Handle, session.Attr, LeaseState, error) {
	c.n.Add(1)
	return c.Reconnector.OpenLease(ctx, p, flags, mode, want)
}

func (c *countingTree) OpenLeaseAfter(ctx context.Context, ops []session.BatchOp, p string, flags int, mode uint32, want LeaseState) ([]session.BatchResult, session.Handle, session.Attr, LeaseState, bool, error) {
	c.n.Add(1)
	return c.Reconnector.OpenLeaseAfter(ctx, ops, p, flags, mode, want)
}

func (c *countingTree) ReadDir(ctx context.Context, p string) ([]session.DirEntry, error) {
	c.n.Add(1)
	return c.Reconnector.ReadDir(ctx, p)
}

func (c *countingTree) ReadDirLease(ctx context.Context, p string, want, entryWant LeaseState) ([]session.DirEntry, []LeaseState, LeaseState, error) {
	c.n.Add(1)
	return c.Reconnector.ReadDirLease(ctx, p, want, entryWant)
}

// leaseMounts serves a new directory and mounts it twice, as two client
// hosts would, with attribute and entry timeouts of a minute: without
// leases, a change on one mount stays unseen on the other for that long.
func leaseMounts(t *testing.T, opts Options) (dir string, a, b string, ca, cb *countingTree) {
	dir, a, b, ca, cb, _, _ = leaseRoots(t, opts)
	return
}

// quietReconnector is a Reconnector to the session address addr (reconnect
// timeout as given) with a logger that says nothing, closed with the test.
func quietReconnector(t *testing.T, addr string, timeout time.Duration) (*Reconnector, *logrus.Logger) {
	t.Helper()
	log := logrus.New()
	log.SetLevel(logrus.PanicLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := NewReconnector(ctx, dialer(addr, client.Interrupt), timeout, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, log
}

// leaseRoots is leaseMounts with the mounts' root nodes.
func leaseRoots(t *testing.T, opts Options) (dir string, a, b string, ca, cb *countingTree, ra, rb *Node) {
	t.Helper()
	needFUSE(t)
	dir = t.TempDir()
	srv := serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", nil)
	mount := func() (string, *countingTree, *Node) {
		r, log := quietReconnector(t, srv.SessionAddr(), 10*time.Second)
		ct := &countingTree{Reconnector: r}
		if !opts.NoLeases && !ct.Leases() {
			t.Skip("the server grants no leases on this kernel")
		}
		mnt := t.TempDir()
		o := opts
		o.AttrTimeout, o.EntryTimeout = time.Minute, time.Minute
		o.Logger = log
		root := NewRoot(ct, ct, o)
		srv, err := mountRoot(mnt, root, o)
		mounted(t, srv, err)
		return mnt, ct, root
	}
	a, ca, ra = mount()
	b, cb, rb = mount()
	return dir, a, b, ca, cb, ra, rb
}

// soon polls cond for at most d: what leases promise (a break's delivery)
// is well under it; the minute-long timeouts without them are far over.
func soon(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, what, d, cond)
}

// pin holds an O_PATH descriptor on each path until the test ends, so the
// kernel keeps its dentry and inode: unused ones it may drop at any moment
// (memory pressure, or the "echo 3 > /proc/sys/vm/drop_caches" every
// benchmark runs), and a mount then rightly gives up the node's lease and
// kept handle and asks the server again when the name is next used. Tests
// that count requests or wait for a kept handle pin what they count on.
// O_PATH sends no OPEN, so a pin costs no request the tests count.
// unpin lets go earlier (before an unmount: a descriptor keeps the mount
// busy).
func pin(t *testing.T, paths ...string) (unpin func()) {
	t.Helper()
	var fds []int
	unpin = sync.OnceFunc(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	t.Cleanup(unpin)
	for _, p := range paths {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("pin %s: %v", p, err)
		}
		fds = append(fds, fd)
	}
	return unpin
}

func mode(p string) os.FileMode {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Mode().Perm()
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func content(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// TestLeaseTwoMounts: each change made on mount a is seen on mount b,
// which had cached what it changes, within a lease break's delivery — and
// a file's data and attributes before a's call returns. b's caches are a
// minute long: without leases every step fails.
func TestLeaseTwoMounts(t *testing.T) {
	dir, a, b, _, _, _, rb := leaseRoots(t, Options{})
	// leased waits until b holds a Read lease on p: a grant can be
	// refused for a moment (a's handle that wrote is closed in the
	// background), and b's caches are then only its timeouts'.
	leased := func(p string) {
		t.Helper()
		soon(t, "b's lease on "+p, 2*time.Second, func() bool {
			var st syscall.Stat_t
			if syscall.Lstat(p, &st) != nil {
				return false
			}
			lc := rb.fs.lease
			lc.mu.Lock()
			n := lc.nodes[st.Ino]
			lc.mu.Unlock()
			if n == nil || !n.holdsRead() {
				content(p) // an open asks again
				return false
			}
			return true
		})
	}
	const within = 500 * time.Millisecond
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(a, "d"), 0o755))

	// create: b had looked the name up and found nothing.
	if exists(filepath.Join(b, "d", "f")) {
		t.Fatal("b sees a file nobody made")
	}
	must(os.WriteFile(filepath.Join(a, "d", "f"), []byte("one"), 0o644))
	soon(t, "create", within, func() bool { return exists(filepath.Join(b, "d", "f")) })

	// write: b read (and cached) the old data; same size, new bytes.
	if got := content(filepath.Join(b, "d", "f")); got != "one" {
		t.Fatalf("b reads %q", got)
	}
	leased(filepath.Join(b, "d", "f"))
	f, err := os.OpenFile(filepath.Join(a, "d", "f"), os.O_WRONLY, 0)
	must(err)
	_, err = f.WriteAt([]byte("two"), 0)
	must(err)
	must(f.Close())
	if got := content(filepath.Join(b, "d", "f")); got != "two" {
		t.Errorf("b reads %q after a's write returned", got)
	}

	// chmod: b had the attributes.
	if mode(filepath.Join(b, "d", "f")) != 0o644 {
		t.Fatal("b's mode")
	}
	leased(filepath.Join(b, "d", "f"))
	must(os.Chmod(filepath.Join(a, "d", "f"), 0o600))
	if m := mode(filepath.Join(b, "d", "f")); m != 0o600 {
		t.Errorf("b sees mode %o after a's chmod returned", m)
	}

	// rename, then unlink.
	must(os.Rename(filepath.Join(a, "d", "f"), filepath.Join(a, "d", "g")))
	soon(t, "rename", within, func() bool {
		return !exists(filepath.Join(b, "d", "f")) && content(filepath.Join(b, "d", "g")) == "two"
	})
	must(os.Remove(filepath.Join(a, "d", "g")))
	soon(t, "unlink", within, func() bool { return !exists(filepath.Join(b, "d", "g")) })

	// A directory listing b had read.
	ents, err := os.ReadDir(filepath.Join(b, "d"))
	must(err)
	if len(ents) != 0 {
		t.Fatalf("b lists %v", ents)
	}
	must(os.Mkdir(filepath.Join(a, "d", "sub"), 0o700))
	soon(t, "listing", within, func() bool {
		ents, _ := os.ReadDir(filepath.Join(b, "d"))
		return len(ents) == 1 && ents[0].Name() == "sub"
	})

	// A change made on the server host by another process.
	if !exists(filepath.Join(b, "d", "sub")) || exists(filepath.Join(b, "d", "local")) {
		t.Fatal("b's view before the local change")
	}
	if out, err := exec.Command("sh", "-c", "echo local > "+filepath.Join(dir, "d", "local")+"; rmdir "+filepath.Join(dir, "d", "sub")).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	soon(t, "local change", within, func() bool {
		return content(filepath.Join(b, "d", "local")) == "local\n" && !exists(filepath.Join(b, "d", "sub"))
	})
	// And local data changes of a file b has cached.
	if out, err := exec.Command("sh", "-c", "echo again > "+filepath.Join(dir, "d", "local")).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	soon(t, "local write", within, func() bool { return content(filepath.Join(b, "d", "local")) == "again\n" })
}

// TestLeaseSavesRoundTrips: with a lease held, repeated stat, ls, open and
// read, and the lookup of an absent name, ask the server nothing.
func TestLeaseSavesRoundTrips(t *testing.T) {
	for _, leases := range []bool{true, false} {
		name := map[bool]string{true: "leases", false: "no leases"}[leases]
		t.Run(name, func(t *testing.T) {
			dir, _, b, _, cb := leaseMounts(t, Options{NoLeases: !leases})
			os.Mkdir(filepath.Join(dir, "d"), 0o755)
			for _, n := range []string{"x", "y", "z"} {
				os.WriteFile(filepath.Join(dir, "d", n), []byte(n), 0o644)
			}
			work := func() {
				if _, err := os.ReadDir(filepath.Join(b, "d")); err != nil {
					t.Fatal(err)
				}
				for _, n := range []string{"x", "y", "z"} {
					if content(filepath.Join(b, "d", n)) != n {
						t.Fatalf("%s: wrong content", n)
					}
				}
				if exists(filepath.Join(b, "d", "absent")) {
					t.Fatal("absent exists")
				}
			}
			pin(t, filepath.Join(b, "d"), filepath.Join(b, "d", "x"), filepath.Join(b, "d", "y"), filepath.Join(b, "d", "z"))
			work()
			// Releases run in the background: let them finish, as an
			// application's next open would find them done.
			time.Sleep(50 * time.Millisecond)
			before := cb.n.Load()
			for range 5 {
				work()
				time.Sleep(10 * time.Millisecond)
			}
			got := cb.n.Load() - before
			if leases && got != 0 {
				t.Errorf("with leases, 5 more rounds of ls, stat, open, read and a missing name cost %d requests", got)
			}
			if !leases && got == 0 {
				t.Errorf("without leases the rounds cost no request: the test measures nothing")
			}
		})
	}
}

// TestLeaseWriteBehind: a file this mount creates is written, chmod'ed and
// closed in two round trips; what it held back is on the server right
// after close returns (asyncclose.go: the server host's own view may lag
// by the BATCH), and another mount that opens it while it is being
// written sees the data already written (its open recalls the lease).
func TestLeaseWriteBehind(t *testing.T) {
	dir, a, b, ca, _ := leaseMounts(t, Options{})
	before := ca.n.Load()
	f, err := os.OpenFile(filepath.Join(a, "new"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := f.Chmod(0o640); err != nil {
		t.Fatal(err)
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != 5 || fi.Mode().Perm() != 0o640 {
		t.Errorf("fstat while held back: %v, %v", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "new")); len(b) != 0 {
		t.Errorf("the write reached the server before close (%q): not held back", b)
	}
	// b opens it now: a sends what it held first.
	if got := content(filepath.Join(b, "new")); got != "hello" {
		t.Errorf("b reads %q while a holds the file open", got)
	}
	if _, err := f.Write([]byte(" world")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	soon(t, "the server's file after close", 5*time.Second, func() bool {
		return content(filepath.Join(dir, "new")) == "hello world" && mode(filepath.Join(dir, "new")) == 0o640
	})
	if got := ca.n.Load() - before; got > 2 {
		t.Logf("create, write, chmod, fstat, close: %d counted requests", got)
	}

	// A tar-like file: create, write, utimens, chown, chmod, close: what
	// is held back arrives whole at close.
	mt := time.Unix(1600000000, 0)
	p := filepath.Join(a, "tarred")
	f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("data"))
	if err := os.Chtimes(p, mt, mt); err != nil {
		t.Fatal(err)
	}
	f.Chown(os.Getuid(), os.Getgid())
	f.Chmod(0o755)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	soon(t, "the server's tarred file", 5*time.Second, func() bool {
		fi, err := os.Stat(filepath.Join(dir, "tarred"))
		return err == nil && fi.ModTime().Equal(mt) && fi.Mode().Perm() == 0o755 && fi.Size() == 4
	})
	if fi, err := os.Stat(p); err != nil || !fi.ModTime().Equal(mt) {
		t.Errorf("mount: %v, %v", fi, err)
	}
}

// TestLeaseHandleReuse: reopening a file under a Handle lease reuses the
// server handle: no OPEN goes out.
func TestLeaseHandleReuse(t *testing.T) {
	dir, a, _, ca, _, ra, _ := leaseRoots(t, Options{})
	os.WriteFile(filepath.Join(dir, "f"), []byte("cached"), 0o644)
	// The kernel sends RELEASE in the background: wait until the closed
	// handle is kept before the next open.
	kept := func() {
		soon(t, "handle kept", 2*time.Second, func() bool {
			lc := ra.fs.lease
			lc.mu.Lock()
			defer lc.mu.Unlock()
			return len(lc.cached) == 1
		})
	}
	if content(filepath.Join(a, "f")) != "cached" {
		t.Fatal("first read")
	}
	pin(t, filepath.Join(a, "f"))
	kept()
	before := ca.n.Load()
	for range 10 {
		if content(filepath.Join(a, "f")) != "cached" {
			t.Fatal("reread")
		}
		kept()
	}
	if got := ca.n.Load() - before; got != 0 {
		t.Errorf("10 reopens cost %d requests", got)
	}
	// Another client's change ends it: the next open goes to the server.
	if out, err := exec.Command("sh", "-c", "echo changed > "+filepath.Join(dir, "f")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	soon(t, "local rewrite", time.Second, func() bool { return content(filepath.Join(a, "f")) == "changed\n" })
}

// TestLeasePingPong: two mounts take turns rewriting one file with a new
// size and reading the other's version back — each turn a write open that
// ends the reader's lease, a recall of the writer's, and grants refused
// while the other still has the file open.
func TestLeasePingPong(t *testing.T) {
	_, a, b, _, _ := leaseMounts(t, Options{})
	for round := range 5 {
		for i := range 10 {
			w, r := a, b
			if i%2 == 1 {
				w, r = b, a
			}
			data := bytes.Repeat([]byte{byte(20 + i + round)}, 100000+i*4096)
			if err := os.WriteFile(filepath.Join(w, "pingpong"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(r, "pingpong"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("round %d turn %d: read %d bytes, want %d", round, i, len(got), len(data))
			}
		}
	}
}

// TestLeasesEndWithTheSession: what a mount cached under leases is
// dropped when its connection goes (the leases died with the session),
// so a file and a name changed on the server while it was away are seen
// as they are after the reconnect — though the mount's timeouts are a
// minute long.
func TestLeasesEndWithTheSession(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	srv := serve(t, dir, testutil.LoopbackAddr(t), testutil.LoopbackAddr(t), nil) // restarted on the same addresses
	r, log := quietReconnector(t, srv.SessionAddr(), 20*time.Second)
	if !r.Leases() {
		t.Skip("the server grants no leases on this kernel")
	}
	mnt := t.TempDir()
	fsrv, err := Mount(mnt, r, r, Options{AttrTimeout: time.Minute, EntryTimeout: time.Minute, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fsrv.Unmount() })

	os.WriteFile(filepath.Join(dir, "f"), []byte("before"), 0o644)
	if content(filepath.Join(mnt, "f")) != "before" || exists(filepath.Join(mnt, "new")) || mode(filepath.Join(mnt, "f")) != 0o644 {
		t.Fatal("the mount's view before")
	}
	srv.Close()
	// Changed while the server is down (by the server host).
	os.WriteFile(filepath.Join(dir, "f"), []byte("AFTER!"), 0o600)
	os.Chmod(filepath.Join(dir, "f"), 0o600)
	os.WriteFile(filepath.Join(dir, "new"), []byte("new"), 0o644)
	serve(t, dir, srv.SessionAddr(), srv.Listeners()[0].Addr, nil)
	soon(t, "the file changed while the server was away", 10*time.Second, func() bool {
		return content(filepath.Join(mnt, "f")) == "AFTER!" && mode(filepath.Join(mnt, "f")) == 0o600 && exists(filepath.Join(mnt, "new"))
	})
}
