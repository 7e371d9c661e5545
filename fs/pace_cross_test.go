package fs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// rewriteClose opens the existing file p for writing, writes data over its
// start and closes it.
func rewriteClose(t *testing.T, p string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOpenAfterCrossRecall: two mounts each closed a file whose changes
// wait for that mount's next OPEN, and each then opens the file the other
// closed, both OPENs on their way at once. Each OPEN recalls the other
// mount's Write lease; a recall must not wait for the OPEN of the other
// mount that waits for this one's recall — or both wait for the server's
// lease-break timeout (5 s). It fails if either open takes that long.
func TestOpenAfterCrossRecall(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	srv := serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", nil)
	a, sa, fa, _ := asyncMount(t, srv.SessionAddr(), 0, Options{releasePace: time.Hour})
	b, sb, fb, _ := asyncMount(t, srv.SessionAddr(), 0, Options{releasePace: time.Hour})
	for _, name := range []string{"fa", "fb"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("old data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Both kernels know both names: the opens below need no lookup.
	for _, m := range []string{a, b} {
		for _, name := range []string{"fa", "fb"} {
			if _, err := os.Stat(filepath.Join(m, name)); err != nil {
				t.Fatal(err)
			}
			pin(t, filepath.Join(m, name)) // no FORGET flushes a release early
		}
	}
	rewriteClose(t, filepath.Join(a, "fa"), []byte("A"))
	rewriteClose(t, filepath.Join(b, "fb"), []byte("B"))
	for _, f := range []*Server{fa, fb} {
		soon(t, "the release waiting for the next open", 5*time.Second, func() bool {
			return f.fs.pacer.waiting.Load() == 1
		})
	}
	// An OPEN with its mount's changes goes once the other is ready (or 3 s
	// passed).
	ready := make(chan struct{}, 2)
	meet := func(string) {
		ready <- struct{}{}
		for end := time.Now().Add(3 * time.Second); len(ready) < 2 && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
	}
	sa.beforeOpen.Store(&meet)
	sb.beforeOpen.Store(&meet)
	type res struct {
		took time.Duration
		err  error
	}
	done := make(chan res, 2)
	open := func(p string) {
		start := time.Now()
		f, err := os.Open(p)
		if err == nil {
			f.Close()
		}
		done <- res{time.Since(start), err}
	}
	go open(filepath.Join(a, "fb"))
	go open(filepath.Join(b, "fa"))
	for range 2 {
		r := <-done
		if r.err != nil {
			t.Error(r.err)
		} else if r.took > 2500*time.Millisecond {
			t.Errorf("an open took %v: the recalls waited for each other's OPEN", r.took)
		}
	}
	if got := content(filepath.Join(a, "fb")); got != "Bld data" {
		t.Errorf("a reads fb as %q", got)
	}
	if got := content(filepath.Join(b, "fa")); got != "Ald data" {
		t.Errorf("b reads fa as %q", got)
	}
}

// TestOpenAfterWholeFailure: when the BATCH carrying two closed files'
// changes fails as a whole before the server ran anything (one file's
// handle could not be reclaimed after a reconnect, say), neither file's
// changes are lost nor charged with a failure that may be another's:
// they go back to their nodes and each release sends its own BATCH. It
// fails if the changes are dropped with the compound's failure.
func TestOpenAfterWholeFailure(t *testing.T) {
	dir, mnt, sb, fsrv, _ := pacedMount(t, 0)
	// Both created before either is closed: neither create carries the other.
	var fs []*os.File
	for _, name := range []string{"a1", "a2"} {
		f, err := os.OpenFile(filepath.Join(mnt, name), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
		pin(t, filepath.Join(mnt, name)) // no FORGET flushes a release early (writeClosePinned)
	}
	for i, data := range []string{"first", "second"} {
		if _, err := fs[i].Write([]byte(data)); err != nil {
			t.Fatal(err)
		}
		if err := fs[i].Close(); err != nil {
			t.Fatal(err)
		}
	}
	soon(t, "both releases waiting for the next open", 5*time.Second, func() bool {
		return fsrv.fs.pacer.waiting.Load() == 2
	})
	var stale error = syscall.ESTALE
	sb.failAfter.Store(&stale)
	f, err := os.OpenFile(filepath.Join(mnt, "b"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatalf("the create after its compound failed: %v", err)
	}
	f.Close()
	if n := sb.openAfters.Load(); n != 1 {
		t.Fatalf("%d compounds, want 1", n)
	}
	for name, want := range map[string]string{"a1": "first", "a2": "second"} {
		soon(t, name+" on the server", 5*time.Second, func() bool { return content(filepath.Join(dir, name)) == want })
		g, err := os.OpenFile(filepath.Join(mnt, name), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Sync(); err != nil {
			t.Errorf("%s's fsync reports %v: a failure that was not its own", name, err)
		}
		g.Close()
	}
}

// TestPaceReopenSame: a file closed and opened again at once — while its
// release waits for the next create — reads what the close left, and an
// O_TRUNC reopen's write is what the server keeps: the held changes land
// before the reopen, never after it, and nothing waits for the bound (an
// hour here).
func TestPaceReopenSame(t *testing.T) {
	dir, mnt, _, fsrv, _ := pacedMount(t, 0)
	p := filepath.Join(mnt, "f")
	unpin := writeClosePinned(t, p, []byte("the first content"), 0o640)
	waitPaced(t, fsrv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if got := content(p); got != "the first content" {
			t.Errorf("the reopen reads %q", got)
		}
		if got := content(filepath.Join(dir, "f")); got != "the first content" {
			t.Errorf("after the reopen the server has %q", got)
		}
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Error(err)
			return
		}
		f.Write([]byte("second"))
		if err := f.Close(); err != nil {
			t.Error(err)
		}
		unpin()
		if err := fsrv.Unmount(); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the reopens hang")
	}
	if got, m := content(filepath.Join(dir, "f")), mode(filepath.Join(dir, "f")); got != "second" || m != 0o640 {
		t.Errorf("the server has %q, mode %v; want %q, 0640", got, m, "second")
	}
}
