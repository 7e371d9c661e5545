package fs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// pacedMount serves a fresh directory and mounts it with releases paced
// for an hour and BATCHes slowed by delay: a release's changes go with
// the next OPEN, or when something else sends them, never through the
// bound.
func pacedMount(t *testing.T, delay time.Duration) (dir, mnt string, sb *slowBatch, fsrv *Server, addr string) {
	t.Helper()
	needFUSE(t)
	dir = t.TempDir()
	srv := serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", nil)
	mnt, sb, fsrv, _ = asyncMount(t, srv.SessionAddr(), delay, Options{releasePace: time.Hour})
	return dir, mnt, sb, fsrv, srv.SessionAddr()
}

// waitPaced waits until the closed file's release waits for the next OPEN.
func waitPaced(t *testing.T, fsrv *Server) {
	t.Helper()
	soon(t, "the release waiting for the next open", 5*time.Second, func() bool {
		return fsrv.fs.pacer.waiting.Load() == 1
	})
}

// writeClosePinned is writeClose with the new file's inode held in the
// kernel's cache (pin: an O_PATH descriptor, which sends no OPEN) until
// unpin or the test's end. A dentry the kernel drops meanwhile (memory
// pressure, drop_caches) FORGETs the node, and a FORGET sends the node's
// held-back changes at once, not with the next OPEN these tests count on.
// Call unpin before unmounting: the descriptor keeps the mount busy.
func writeClosePinned(t *testing.T, p string, data []byte, mode os.FileMode) (unpin func()) {
	t.Helper()
	writeCloseAfter(t, p, data, mode, func() { unpin = pin(t, p) })
	return unpin
}

// TestOpenCarriesRelease: the changes a closed file held back (its
// writes, its chmod) and the next file's CREATE go to the server as one
// message, and are there when the create returns; the release sends
// nothing more after. It fails if the release sends its own BATCH.
func TestOpenCarriesRelease(t *testing.T) {
	dir, mnt, sb, fsrv, _ := pacedMount(t, 0)
	unpin := writeClosePinned(t, filepath.Join(mnt, "a"), []byte("first"), 0o640)
	waitPaced(t, fsrv)
	m0 := sb.messages()
	f, err := os.OpenFile(filepath.Join(mnt, "b"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if n := sb.messages() - m0; n != 1 || sb.openAfters.Load() != 1 {
		t.Errorf("b's create sent %d messages (%d with a's changes), want 1", n, sb.openAfters.Load())
	}
	if got, m := content(filepath.Join(dir, "a")), mode(filepath.Join(dir, "a")); got != "first" || m != 0o640 {
		t.Errorf("right after b's create the server has a as %q, mode %v", got, m)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	unpin()
	if err := fsrv.Unmount(); err != nil {
		t.Fatal(err)
	}
	if n := sb.batches.Load(); n != 0 {
		t.Errorf("%d BATCHes after the create carried a's changes", n)
	}
}

// TestOpenAfterFailedRelease: when a change a release waits to send
// fails (the server's disk is full), the server never runs the OPEN that
// carried it: the OPEN is sent again alone and succeeds, and the failure
// is a's as when its own BATCH fails — logged with its path, returned by
// its next fsync, and the next file's close(2) waits and reports its own.
func TestOpenAfterFailedRelease(t *testing.T) {
	dir, srv := serveTmpfs(t, "1m")
	mnt, sb, fsrv, hook := asyncMount(t, srv.SessionAddr(), 0, Options{releasePace: time.Hour})
	fillDisk(t, dir)
	data := bytes.Repeat([]byte("x"), 8192)
	writeClosePinned(t, filepath.Join(mnt, "a"), data, 0o644) // answered at once: nil
	waitPaced(t, fsrv)
	o0 := sb.opens.Load()
	f, err := os.OpenFile(filepath.Join(mnt, "b"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatalf("the create that carried a's failing changes: %v", err)
	}
	f.Close()
	if a, o := sb.openAfters.Load(), sb.opens.Load()-o0; a != 1 || o != 1 {
		t.Errorf("%d OPENs with a's changes, %d alone; want 1 and 1", a, o)
	}
	if _, err := os.Stat(filepath.Join(dir, "b")); err != nil {
		t.Errorf("b on the server: %v", err)
	}
	logged := false
	for _, e := range hook.AllEntries() {
		logged = logged || e.Data["path"] == "a" && e.Data[logrus.ErrorKey] != nil
	}
	if !logged {
		t.Error("a's failure was not logged with its path")
	}
	failureReported(t, filepath.Join(mnt, "a"), filepath.Join(mnt, "c"), data)
}

// TestOpenAfterRecall: another mount's open of a file whose changes are
// on their way inside this mount's next OPEN recalls the Write lease, and
// the recall waits for that OPEN's BATCH: the other mount reads what the
// close left, and nothing is sent twice. It fails if the recall can find
// the changes neither held nor marked in flight.
func TestOpenAfterRecall(t *testing.T) {
	_, a, sb, _, addr := pacedMount(t, 300*time.Millisecond)
	b, _, _, _ := asyncMount(t, addr, 0, Options{})
	data := []byte("written on a")
	writeClosePinned(t, filepath.Join(a, "f"), data, 0o640)
	inFlight := make(chan struct{}, 1)
	hook := func(string) { inFlight <- struct{}{} }
	sb.beforeOpen.Store(&hook)
	created := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(filepath.Join(a, "g"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
		if err == nil {
			err = f.Close()
		}
		created <- err
	}()
	select {
	case <-inFlight: // f's changes are in g's OPEN, which the server gets in 300 ms
	case <-time.After(5 * time.Second):
		t.Fatal("g's create carried no changes")
	}
	if got := content(filepath.Join(b, "f")); got != string(data) {
		t.Errorf("b reads %q while a's OPEN carried f's changes, want %q", got, data)
	}
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if n := sb.batches.Load(); n != 0 {
		t.Errorf("%d BATCHes: f's changes were sent again", n)
	}
}

// TestPaceRecall: another mount's open of a file whose release waits for
// the next OPEN recalls the Write lease, and the recall sends the changes
// at once; the release then has nothing left to send.
func TestPaceRecall(t *testing.T) {
	_, a, sb, fsrv, addr := pacedMount(t, 0)
	b, _, _, _ := asyncMount(t, addr, 0, Options{})
	data := []byte("written on a")
	unpin := writeClosePinned(t, filepath.Join(a, "f"), data, 0o640)
	waitPaced(t, fsrv)
	if got := content(filepath.Join(b, "f")); got != string(data) {
		t.Fatalf("b reads %q right after a's close, want %q", got, data)
	}
	if w, n := fsrv.fs.pacer.waiting.Load(), sb.batches.Load(); w != 1 || n != 1 {
		t.Fatalf("after b's open: %d releases waiting, %d BATCHes; want the recall's BATCH and the release still waiting", w, n)
	}
	unpin()
	if err := fsrv.Unmount(); err != nil {
		t.Fatal(err)
	}
	if n, m := sb.batches.Load(), sb.openAfters.Load(); n != 1 || m != 0 {
		t.Errorf("%d BATCHes, %d with an OPEN: the paced release sent the recalled changes again", n, m)
	}
}

// TestPaceUnmount: unmounting right after close(2) — before the release
// came, and while it waits for the next OPEN — sends what was held back
// and does not wait for the pacing's bound (an hour here).
func TestPaceUnmount(t *testing.T) {
	for _, waited := range []bool{false, true} {
		dir, mnt, _, fsrv, _ := pacedMount(t, 0)
		unpin := writeClosePinned(t, filepath.Join(mnt, "f"), []byte("kept"), 0o640)
		if waited {
			waitPaced(t, fsrv)
		}
		unpin()
		if err := fsrv.Unmount(); err != nil {
			t.Fatal(err)
		}
		if got := content(filepath.Join(dir, "f")); got != "kept" || mode(filepath.Join(dir, "f")) != 0o640 {
			t.Errorf("waited %v: after unmount the server has %q, mode %v", waited, got, mode(filepath.Join(dir, "f")))
		}
	}
}

// TestOpenAfterExclExisting: an O_EXCL create that carries a closed
// file's changes, of a name another client made between the kernel's
// lookup and the create, still fails with EEXIST and leaves that file
// alone; the changes before it are done.
func TestOpenAfterExclExisting(t *testing.T) {
	dir, mnt, sb, fsrv, _ := pacedMount(t, 0)
	hook := func(p string) {
		if filepath.Base(p) == "c" {
			os.WriteFile(filepath.Join(dir, "c"), []byte("made on the server"), 0o644)
		}
	}
	sb.beforeOpen.Store(&hook)
	unpin := writeClosePinned(t, filepath.Join(mnt, "a"), []byte("first"), 0o640)
	waitPaced(t, fsrv)
	f, err := os.OpenFile(filepath.Join(mnt, "c"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err == nil {
		f.Close()
	}
	if !errors.Is(err, syscall.EEXIST) {
		t.Errorf("O_EXCL create of a name made meanwhile: %v, want EEXIST", err)
	}
	if sb.openAfters.Load() != 1 {
		t.Errorf("%d OPENs carried a's changes, want 1", sb.openAfters.Load())
	}
	if got := content(filepath.Join(dir, "c")); got != "made on the server" {
		t.Errorf("c on the server: %q", got)
	}
	if got, m := content(filepath.Join(dir, "a")), mode(filepath.Join(dir, "a")); got != "first" || m != 0o640 {
		t.Errorf("a on the server: %q, mode %v", got, m)
	}
	unpin()
	if err := fsrv.Unmount(); err != nil {
		t.Fatal(err)
	}
	if n := sb.batches.Load(); n != 0 {
		t.Errorf("%d BATCHes after the create carried a's changes", n)
	}
}

// TestOpenAfterServerRestart: the server restarts just before an OPEN
// carrying a closed file's changes goes out: it waits for the next
// session and goes there, the closed file's changes through its handle
// reclaimed on it (its durable handle), so the create succeeds and the
// server has the first file as close(2) left it. It fails if the
// changes go with the lost session's handle numbers.
func TestOpenAfterServerRestart(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	srv := serve(t, dir, testutil.LoopbackAddr(t), testutil.LoopbackAddr(t), nil)
	mnt, sb, fsrv, _ := asyncMount(t, srv.SessionAddr(), 300*time.Millisecond, Options{releasePace: time.Hour})
	data := []byte("written before the restart")
	writeClosePinned(t, filepath.Join(mnt, "a"), data, 0o640)
	waitPaced(t, fsrv)
	hook := func(string) { srv.Close() } // the OPEN waits in slowBatch's sleep
	sb.beforeOpen.Store(&hook)
	created := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(filepath.Join(mnt, "b"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
		if err == nil {
			_, err = f.Write([]byte("b"))
			if e := f.Close(); err == nil {
				err = e
			}
		}
		created <- err
	}()
	time.Sleep(600 * time.Millisecond) // sent, and waiting for the next session
	sb.beforeOpen.Store(nil)
	serve(t, dir, srv.SessionAddr(), srv.Listeners()[0].Addr, nil)
	select {
	case err := <-created:
		if err != nil {
			t.Fatalf("the create across the restart: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the create did not return after the restart")
	}
	if got, m := content(filepath.Join(dir, "a")), mode(filepath.Join(dir, "a")); got != string(data) || m != 0o640 {
		t.Errorf("after the restart the server has a as %q, mode %v", got, m)
	}
	soon(t, "b on the server", 10*time.Second, func() bool { return content(filepath.Join(dir, "b")) == "b" })
}
