package fs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// TestAsyncCloseReadOtherHandle: a read through another handle of the
// file on the same mount — one whose data path was attached before, so
// that its read goes straight to the server — sees what a closed handle
// held back, though the BATCH carrying it is slow (and, before the close,
// what the open handle holds back).
func TestAsyncCloseReadOtherHandle(t *testing.T) {
	dir, mnt, _, _ := slowMount(t, 300*time.Millisecond)
	p := oldFile(t, dir, mnt)
	r, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, 16)
	if n, err := r.ReadAt(buf, 0); string(buf[:n]) != "old data" {
		t.Fatalf("first read: %q, %v", buf[:n], err) // attaches r's data path
	}
	readFresh := func(why string) {
		t.Helper()
		// Not from the kernel's pages: from the mount.
		if err := unix.Fadvise(int(r.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
		if n, err := r.ReadAt(buf, 0); string(buf[:n]) != "new data" {
			t.Errorf("%s: the other handle reads %q, %v; want %q", why, buf[:n], err, "new data")
		}
	}
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("new"), 0); err != nil {
		t.Fatal(err)
	}
	readFresh("while the writer is open")
	if _, err := w.WriteAt([]byte("new"), 0); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	readFresh("right after the writer's close")
}

// TestAsyncCloseWriteOtherHandle: a write through another handle of the
// file on the same mount, one that cannot hold back (its data path is
// attached), lands after the BATCH a close sent before it — not under it.
func TestAsyncCloseWriteOtherHandle(t *testing.T) {
	dir, mnt, _, _ := slowMount(t, 300*time.Millisecond)
	p := oldFile(t, dir, mnt)
	c, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ReadAt(make([]byte, 8), 0); err != nil {
		t.Fatal(err) // attaches c's data path
	}
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("AAA"), 0); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the RELEASE's BATCH is in flight
	if _, err := c.WriteAt([]byte("CCC"), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // a BATCH overtaken would land now
	if got := content(filepath.Join(dir, "f")); got != "CCC data" {
		t.Errorf("the server has %q after the later write, want %q", got, "CCC data")
	}
}

// TestAsyncCloseServerRestart: the server restarts while the BATCH of a
// file whose close(2) returned is held or in flight: it is replayed on the
// next session (through the durable handle), so the server ends up with
// what the close left.
func TestAsyncCloseServerRestart(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	srv := serve(t, dir, testutil.LoopbackAddr(t), testutil.LoopbackAddr(t), nil)
	mnt, sb, _, _ := asyncMount(t, srv.SessionAddr(), 300*time.Millisecond, Options{})
	data := []byte("written before the restart")
	writeClose(t, filepath.Join(mnt, "f"), data, 0o640)
	srv.Close() // the BATCH is still in slowBatch's sleep
	if content(filepath.Join(dir, "f")) == string(data) {
		t.Fatal("the BATCH landed before the restart: the test proves nothing")
	}
	time.Sleep(600 * time.Millisecond) // it is sent, and waits for the next session
	serve(t, dir, srv.SessionAddr(), srv.Listeners()[0].Addr, nil)
	soon(t, "the BATCH replayed", 10*time.Second, func() bool { return sb.batches.Load() > 0 })
	soon(t, "the server has the file as close(2) left it", 10*time.Second, func() bool {
		return content(filepath.Join(dir, "f")) == string(data) && mode(filepath.Join(dir, "f")) == 0o640
	})
}

// TestAsyncCloseUnmountWaitBounded: what unmounting sends of the files
// still holding changes back goes at once, not one file after another:
// with the server slow or gone, each waits up to the reconnect timeout,
// and unmounting must not take that many times over.
func TestAsyncCloseUnmountWaitBounded(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	srv := serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", nil)
	const delay = 500 * time.Millisecond
	mnt, sb, fsrv, _ := asyncMount(t, srv.SessionAddr(), delay, Options{})
	const files = 6
	for i := range files {
		f, err := os.Create(filepath.Join(mnt, fmt.Sprintf("f%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write([]byte("held")); err != nil {
			t.Fatal(err)
		}
	}
	// As when the kernel drops the RELEASEs of files open at the end.
	start := time.Now()
	fsrv.fs.settleAll()
	took := time.Since(start)
	if n := sb.batches.Load(); n != files {
		t.Fatalf("%d BATCHes sent, want %d", n, files)
	}
	if took > 3*delay {
		t.Errorf("settling %d held files took %v: one after another (each %v)", files, took, delay)
	}
}

// TestMultiUserHoldsNothingBack: a multiuser mount grants no leases, so
// nothing is held back on it and no user's failed BATCH can be reported
// to another user's close(2): the node's kept error is per file, not per
// user, and would have to become so before MultiUser takes leases.
func TestMultiUserHoldsNothingBack(t *testing.T) {
	if _, ok := any(&MultiUser{}).(SessionLeaser); ok {
		t.Fatal("MultiUser takes leases: a BATCH's failure kept on a node would reach whichever user closes the file next")
	}
	if NewRoot(&MultiUser{}, nil, Options{}).fs.lease != nil {
		t.Fatal("a multiuser mount holds changes back")
	}
}

// TestAsyncCloseForgottenTwoMounts: the kernel forgets a closed file
// (drop_caches here; a directory's lease that goes drops its names) while
// its BATCH is still to come: the mount must not give its Write lease up
// before the BATCH lands, or another mount's open is not recalled and
// reads the file as it was before.
func TestAsyncCloseForgottenTwoMounts(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	srv := serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", nil)
	a, _, _, _ := asyncMount(t, srv.SessionAddr(), 500*time.Millisecond, Options{})
	b, _, _, _ := asyncMount(t, srv.SessionAddr(), 0, Options{})
	data := []byte("what a's close left")
	writeClose(t, filepath.Join(a, "f"), data, 0o640)
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // the FORGET is handled, a lease given up would be by now
	got, err := os.ReadFile(filepath.Join(b, "f"))
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("b reads %q (%v) after a's close and a forget, want %q", got, err, data)
	}
}

// TestAsyncCloseUnlinkRecreate: a file closed, unlinked and made again
// under the same name while the first one's BATCH is slow: that BATCH
// goes by the first file's handle and lands on it, not on the new file.
func TestAsyncCloseUnlinkRecreate(t *testing.T) {
	dir, mnt, _, _ := slowMount(t, 300*time.Millisecond)
	p := filepath.Join(mnt, "f")
	writeClose(t, p, []byte("the first file, longer"), 0o600)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	writeClose(t, p, []byte("second"), 0o644)
	time.Sleep(800 * time.Millisecond) // both BATCHes landed
	if got, m := content(filepath.Join(dir, "f")), mode(filepath.Join(dir, "f")); got != "second" || m != 0o644 {
		t.Errorf("the server has %q, %v; want the second file's %q, 0644", got, m, "second")
	}
}

// slowMount serves a fresh directory and mounts it with BATCHes slowed by
// delay.
func slowMount(t *testing.T, delay time.Duration) (dir, mnt string, sb *slowBatch, fsrv *Server) {
	t.Helper()
	needFUSE(t)
	dir = t.TempDir()
	srv := serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", nil)
	mnt, sb, fsrv, _ = asyncMount(t, srv.SessionAddr(), delay, Options{})
	return dir, mnt, sb, fsrv
}

// oldFile makes file f, "old data", on the server host, and returns its
// path on the mount.
func oldFile(t *testing.T, dir, mnt string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("old data"), 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(mnt, "f")
}
