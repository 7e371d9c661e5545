package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/fileserver"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// slowBatch is a mount's Reconnector whose BATCH (what a Write lease held
// back, alone or with an OPEN) reaches the server only after delay — or,
// when gate is set, once it is closed — and is counted, as are the OPENs
// sent alone; beforeOpen, when set, runs before an OPEN that carries
// held-back changes is sent.
type slowBatch struct {
	*Reconnector
	delay      time.Duration
	gate       atomic.Pointer[chan struct{}] // set: a BATCH alone waits until it is closed
	waiting    atomic.Int64                  // BATCHes alone that reached the gate
	batches    atomic.Int64                  // BATCHes of held-back changes alone
	landed     atomic.Int64                  // of them, answered
	openAfters atomic.Int64                  // BATCHes of held-back changes and an OPEN
	opens      atomic.Int64                  // OPENs alone
	beforeOpen atomic.Pointer[func(path string)]
	failAfter  atomic.Pointer[error] // set: a BATCH with an OPEN fails as a whole, unsent
}

func (s *slowBatch) Batch(ctx context.Context, ops []session.BatchOp) ([]session.BatchResult, error) {
	if g := s.gate.Load(); g != nil {
		s.waiting.Add(1)
		<-*g
	} else {
		time.Sleep(s.delay)
	}
	s.batches.Add(1)
	defer s.landed.Add(1)
	return s.Reconnector.Batch(ctx, ops)
}

// hold makes s's BATCHes wait until the returned function is called.
func (s *slowBatch) hold(t *testing.T) (open func()) {
	g := make(chan struct{})
	s.gate.Store(&g)
	var once sync.Once
	open = func() { once.Do(func() { close(g) }) }
	t.Cleanup(open)
	return open
}

func (s *slowBatch) OpenLeaseAfter(ctx context.Context, ops []session.BatchOp, p string, flags int, mode uint32, want LeaseState) ([]session.BatchResult, session.Handle, session.Attr, LeaseState, bool, error) {
	if f := s.beforeOpen.Load(); f != nil {
		(*f)(p)
	}
	time.Sleep(s.delay)
	s.openAfters.Add(1)
	if err := s.failAfter.Load(); err != nil {
		return nil, 0, session.Attr{}, 0, false, *err
	}
	return s.Reconnector.OpenLeaseAfter(ctx, ops, p, flags, mode, want)
}

func (s *slowBatch) OpenLease(ctx context.Context, p string, flags int, mode uint32, want LeaseState) (session.Handle, session.Attr, LeaseState, error) {
	s.opens.Add(1)
	return s.Reconnector.OpenLease(ctx, p, flags, mode, want)
}

// messages is how many session messages s counted.
func (s *slowBatch) messages() int64 { return s.batches.Load() + s.openAfters.Load() + s.opens.Load() }

// asyncMount mounts the share of the server at addr with BATCHes slowed
// by delay; the logger's entries are recorded by the hook.
func asyncMount(t *testing.T, addr string, delay time.Duration, opts Options) (mnt string, sb *slowBatch, srv *Server, hook *test.Hook) {
	t.Helper()
	r, _ := quietReconnector(t, addr, 10*time.Second)
	sb = &slowBatch{Reconnector: r, delay: delay}
	if !sb.Leases() {
		t.Skip("the server grants no leases on this kernel")
	}
	log := logrus.New()
	log.SetOutput(new(bytes.Buffer))
	log.SetLevel(logrus.WarnLevel)
	hook = test.NewLocal(log)
	mnt = t.TempDir()
	opts.AttrTimeout, opts.EntryTimeout = time.Minute, time.Minute
	opts.Logger = log
	srv, err := mountRoot(mnt, NewRoot(sb, sb, opts), opts)
	mounted(t, srv, err)
	return mnt, sb, srv, hook
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

// twoAsyncMounts serves a fresh directory and mounts it twice: a with
// BATCHes slowed by delay, b with none.
func twoAsyncMounts(t *testing.T, delay time.Duration) (a, b string) {
	t.Helper()
	needFUSE(t)
	dir := t.TempDir()
	srv := serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", nil)
	a, _, _, _ = asyncMount(t, srv.SessionAddr(), delay, Options{})
	b, _, _, _ = asyncMount(t, srv.SessionAddr(), 0, Options{})
	return a, b
}

// writeClose creates p, writes data, chmods it through the descriptor and
// closes it, returning how long close(2) took.
func writeClose(t *testing.T, p string, data []byte, mode os.FileMode) time.Duration {
	t.Helper()
	return writeCloseAfter(t, p, data, mode, nil)
}

// writeCloseAfter is writeClose that calls created, if not nil, once the
// file exists and before anything is written to it.
func writeCloseAfter(t *testing.T, p string, data []byte, mode os.FileMode, created func()) time.Duration {
	t.Helper()
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if created != nil {
		created()
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Chmod(mode); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := f.Close(); err != nil {
		t.Fatalf("close %s: %v", p, err)
	}
	return time.Since(start)
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

// TestAsyncCloseDoesNotWait: close(2) of a file whose writes a Write lease
// held back returns before the BATCH carrying them is on the server — the
// BATCH is held at a gate until close(2) returned — which gets it right
// after; with SyncClose close(2) waits for it, as before.
func TestAsyncCloseDoesNotWait(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	srv := serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", nil)
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("sync_close=%v", sync), func(t *testing.T) {
			mnt, sb, _, _ := asyncMount(t, srv.SessionAddr(), 0, Options{SyncClose: sync})
			open := sb.hold(t)
			name := fmt.Sprintf("f%v", sync)
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				writeClose(t, filepath.Join(mnt, name), []byte("hello"), 0o751)
			}()
			if sync {
				soon(t, "the BATCH at the gate", 10*time.Second, func() bool { return sb.waiting.Load() == 1 })
				select {
				case <-closed:
					t.Fatal("sync_close: close(2) returned before its BATCH was sent")
				case <-time.After(50 * time.Millisecond):
				}
				open()
				<-closed
				if got := content(filepath.Join(dir, name)); got != "hello" || sb.batches.Load() != 1 {
					t.Errorf("sync_close: after close(2) the server has %q (%d BATCHes)", got, sb.batches.Load())
				}
				return
			}
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				open()
				t.Fatal("close(2) waited for the BATCH")
			}
			if n := sb.batches.Load(); n != 0 {
				t.Errorf("%d BATCHes sent before close returned", n)
			}
			open()
			soon(t, "the BATCH after close", 5*time.Second, func() bool {
				return content(filepath.Join(dir, name)) == "hello" && mode(filepath.Join(dir, name)) == 0o751
			})
		})
	}
}

// TestAsyncCloseTwoMounts: what mount a wrote and closed is what mount b
// opens and reads at once, size and bytes, file after file — b's open
// recalls a's Write lease, and the recall waits for the BATCH a's release
// has in flight.
func TestAsyncCloseTwoMounts(t *testing.T) {
	a, b := twoAsyncMounts(t, 5*time.Millisecond)
	for i := range 100 {
		name := fmt.Sprintf("f%03d", i)
		data := bytes.Repeat([]byte{byte('a' + i%26)}, 1+i*97)
		writeClose(t, filepath.Join(a, name), data, 0o640)
		fi, err := os.Stat(filepath.Join(b, name))
		if err != nil || fi.Size() != int64(len(data)) || fi.Mode().Perm() != 0o640 {
			t.Fatalf("%s: b's stat right after a's close: %v, %v (want %d bytes, 0640)", name, fi, err, len(data))
		}
		got, err := os.ReadFile(filepath.Join(b, name))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: b reads %d bytes (%v) right after a's close, want %d", name, len(got), err, len(data))
		}
	}
}

// TestAsyncCloseSameMount: on the mount that closed a file, what comes
// next sees the file as the close left it though the BATCH is slow: a
// chmod by path is not overtaken by the held-back fchmod, and stat (also
// once the kernel forgot the file), a listing's attributes, a reopen and
// read, and a rename see the written file.
func TestAsyncCloseSameMount(t *testing.T) {
	dir, mnt, _, _ := slowMount(t, 100*time.Millisecond)
	data := []byte("the final state")
	for i := range 3 {
		d := filepath.Join(mnt, fmt.Sprintf("d%d", i))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(d, "chmod")
		writeClose(t, p, data, 0o755)
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // a BATCH overtaking the chmod would have landed
		if m := mode(filepath.Join(dir, fmt.Sprintf("d%d", i), "chmod")); m != 0o600 {
			t.Errorf("chmod by path after close: the server's mode is %v", m)
		}

		p = filepath.Join(d, "stat")
		writeClose(t, p, data, 0o755)
		if fi, err := os.Stat(p); err != nil || fi.Size() != int64(len(data)) || fi.Mode().Perm() != 0o755 {
			t.Errorf("stat after close: %v, %v", fi, err)
		}

		p = filepath.Join(d, "listed")
		writeClose(t, p, data, 0o755)
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if fi, err := e.Info(); err != nil || fi.Size() != int64(len(data)) {
				t.Errorf("ls -l after close: %s %v, %v", e.Name(), fi, err)
			}
		}

		p = filepath.Join(d, "reread")
		writeClose(t, p, data, 0o755)
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, data) {
			t.Errorf("reopen and read after close: %q, %v", got, err)
		}

		// The kernel forgets the file (drop_caches here; a directory's
		// lease that goes drops its names) before the BATCH lands: the
		// lookup that follows makes a new node, which holds nothing.
		p = filepath.Join(d, "forgotten")
		writeClose(t, p, data, 0o755)
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the FORGET is handled
		if fi, err := os.Stat(p); err != nil || fi.Size() != int64(len(data)) || fi.Mode().Perm() != 0o755 {
			t.Errorf("stat after close and a forget: %v, %v", fi, err)
		}

		p = filepath.Join(d, "renamed")
		writeClose(t, p, data, 0o755)
		if err := os.Rename(p, p+".new"); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(p + ".new"); err != nil || !bytes.Equal(got, data) || mode(p+".new") != 0o755 {
			t.Errorf("renamed after close: %q, %v, %v", got, err, mode(p+".new"))
		}
	}
}

// TestAsyncCloseFailure: a BATCH that fails after close(2) returned (the
// server's disk is full) is logged with the file's path and kept for the
// file's next fsync; and the next file's close(2) waits for its own BATCH
// and returns its failure.
func TestAsyncCloseFailure(t *testing.T) {
	dir, srv := serveTmpfs(t, "1m")
	mnt, _, _, hook := asyncMount(t, srv.SessionAddr(), 0, Options{})
	fillDisk(t, dir)

	data := bytes.Repeat([]byte("x"), 8192)
	// Pinned: the failure is kept on a's node, which a forget (drop_caches)
	// would take away before the fsync below looks it up again.
	writeClosePinned(t, filepath.Join(mnt, "a"), data, 0o644) // answered at once: nil
	soon(t, "the failure logged", 5*time.Second, func() bool {
		for _, e := range hook.AllEntries() {
			if e.Data["path"] == "a" && e.Data[logrus.ErrorKey] != nil {
				return true
			}
		}
		return false
	})
	failureReported(t, filepath.Join(mnt, "a"), filepath.Join(mnt, "b"), data)
	for _, e := range hook.AllEntries() {
		if p, _ := e.Data["path"].(string); p != "" && !strings.HasPrefix(p, "a") && !strings.HasPrefix(p, "b") {
			t.Errorf("logged for %q", p)
		}
	}
}

// fillDisk fills the file system of dir from the server host.
func fillDisk(t *testing.T, dir string) {
	t.Helper()
	fill, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := fill.Write(make([]byte, 4096)); err != nil {
			break
		}
	}
	fill.Close()
}

// failureReported checks that the failure of failed's held-back changes
// (a full disk) is reported as promised: by failed's next fsync, and
// next's close(2) (written with data) waits for its own BATCH and returns
// its failure.
func failureReported(t *testing.T, failed, next string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(failed, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("fsync of the file whose BATCH failed: %v, want ENOSPC", err)
	}
	f.Close()
	f, err = os.OpenFile(next, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(data)
	if err := f.Close(); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("the next file's close(2): %v, want ENOSPC", err)
	}
}

// TestAsyncCloseUnmount: unmounting right after close(2) loses nothing —
// the mount's end waits for the release in flight (or sends what the
// kernel's dropped RELEASE left held) before its session goes.
func TestAsyncCloseUnmount(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	srv := serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", nil)
	for i := range 3 {
		mnt, sb, fsrv, _ := asyncMount(t, srv.SessionAddr(), 200*time.Millisecond, Options{})
		name := fmt.Sprintf("f%d", i)
		writeClose(t, filepath.Join(mnt, name), []byte("kept"), 0o640)
		if err := fsrv.Unmount(); err != nil {
			t.Fatal(err)
		}
		sb.Reconnector.Close() // as lwio-mount does once unmounted
		if got := content(filepath.Join(dir, name)); got != "kept" || mode(filepath.Join(dir, name)) != 0o640 {
			t.Errorf("after unmount: server has %q, mode %v", got, mode(filepath.Join(dir, name)))
		}
		// Remounted, the file reads back.
		mnt2, _, _, _ := asyncMount(t, srv.SessionAddr(), 0, Options{})
		if got := content(filepath.Join(mnt2, name)); got != "kept" {
			t.Errorf("remounted: %q", got)
		}
	}
}

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
	dir, mnt, sb, _ := slowMount(t, 0)
	open := sb.hold(t)
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
	soon(t, "the RELEASE's BATCH at the gate", 10*time.Second, func() bool { return sb.waiting.Load() == 1 })
	wrote := make(chan error, 1)
	go func() {
		_, err := c.WriteAt([]byte("CCC"), 0)
		if err == nil {
			err = c.Sync()
		}
		wrote <- err
	}()
	time.Sleep(50 * time.Millisecond) // time for the write to overtake the BATCH, if it would
	open()
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	soon(t, "the BATCH answered", 10*time.Second, func() bool { return sb.landed.Load() == 1 })
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
	mnt, sb, _, _ := asyncMount(t, srv.SessionAddr(), 0, Options{})
	open := sb.hold(t)
	data := []byte("written before the restart")
	writeClose(t, filepath.Join(mnt, "f"), data, 0o640)
	soon(t, "the BATCH at the gate", 10*time.Second, func() bool { return sb.waiting.Load() == 1 })
	srv.Close()
	if content(filepath.Join(dir, "f")) == string(data) {
		t.Fatal("the BATCH landed before the restart: the test proves nothing")
	}
	open()
	time.Sleep(300 * time.Millisecond) // it is sent, and waits for the next session (or goes to it)
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
	const delay = 500 * time.Millisecond
	_, mnt, sb, fsrv := slowMount(t, delay)
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
	a, b := twoAsyncMounts(t, 500*time.Millisecond)
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
// The test waits until the mount holds nothing back and has no BATCH in
// flight, not for a count of BATCHes: a writer slower than wbMaxAge (a
// loaded machine) has its file's changes go in two.
func TestAsyncCloseUnlinkRecreate(t *testing.T) {
	dir, mnt, sb, fsrv := slowMount(t, 300*time.Millisecond)
	p := filepath.Join(mnt, "f")
	writeClose(t, p, []byte("the first file, longer"), 0o600)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	writeClose(t, p, []byte("second"), 0o644) // its node holds its changes until they land
	soon(t, "both files' changes on the server", 10*time.Second, func() bool { return fsrv.fs.lease.held.n.Load() == 0 })
	if got, m := content(filepath.Join(dir, "f")), mode(filepath.Join(dir, "f")); got != "second" || m != 0o644 {
		t.Errorf("the server has %q, %v; want the second file's %q, 0644 (BATCHes %d, with an OPEN %d)",
			got, m, "second", sb.landed.Load(), sb.openAfters.Load())
	}
}

// TestAsyncCloseStatfs: df right after close(2) counts the data the
// file's Write lease held back — statfs waits for the BATCH in flight —
// on a disk of its own (a tmpfs), whose use nothing else changes.
func TestAsyncCloseStatfs(t *testing.T) {
	_, srv := serveTmpfs(t, "16m")
	mnt, sb, _, _ := asyncMount(t, srv.SessionAddr(), 300*time.Millisecond, Options{})
	used := func() int64 {
		var s unix.Statfs_t
		if err := unix.Statfs(mnt, &s); err != nil {
			t.Fatal(err)
		}
		return int64(s.Blocks-s.Bfree) * s.Frsize
	}
	before := used()
	data := testutil.RandBytes(64 << 10) // held back whole (leaseHoldMax)
	writeClose(t, filepath.Join(mnt, "f"), data, 0o644)
	if got := used() - before; got < int64(len(data)) {
		t.Errorf("df right after close(2) counts %d bytes more used, want at least %d (BATCHes landed: %d)", got, len(data), sb.batches.Load())
	}
}

// serveTmpfs serves a fresh tmpfs of the given size (a disk of the test's
// own: it fills, and its use is the test's alone).
func serveTmpfs(t *testing.T, size string) (string, *fileserver.Server) {
	t.Helper()
	needFUSE(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir, serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", nil)
}
