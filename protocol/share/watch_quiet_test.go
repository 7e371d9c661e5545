package share

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestWatcherPausesOnWritesNobodyHolds: another process writing, over and
// over, to a file nobody holds in a watched directory (a second server on
// the same export, a local program's log beside a leased file) wakes the
// watcher once per pause, not once per write: a read whose events broke no
// lease is followed by watchQuiet's pause, in which the kernel merges that
// process's writes into one event. A leased file's local change made
// during the pause is still seen, after it.
func TestWatcherPausesOnWritesNobodyHolds(t *testing.T) {
	paused, release, stop := make(chan struct{}), make(chan struct{}), make(chan struct{})
	old := watchPause
	t.Cleanup(func() { watchPause = old }) // after the share's close: the watcher has stopped
	watchPause = func() {
		select {
		case paused <- struct{}{}:
		case <-stop:
			return
		}
		select {
		case <-release:
		case <-stop:
		}
	}
	dir, hs := leaseShare(t, 1)
	t.Cleanup(func() { close(stop) }) // before the share's close, which waits for the watcher
	a := hs[0]
	sh := a.tr.sh
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	os.WriteFile(filepath.Join(dir, "d", "log"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "d", "held"), []byte("x"), 0o644)
	mustLease(t, a.tr, "d", LeaseRead, LeaseRead) // marks d
	held := mustLease(t, a.tr, "d/held", LeaseRead, LeaseRead)

	waitPause := func(why string) {
		t.Helper()
		select {
		case <-paused:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the watcher did not pause", why)
		}
	}
	// One process (one pid, so its events can merge): a first append to
	// the file nobody holds, then, once told, 100 more.
	log := filepath.Join(dir, "d", "log")
	cmd := exec.Command("sh", "-c", `printf x >> "$1"; read _; i=0; while [ $i -lt 100 ]; do printf x >> "$1"; i=$((i+1)); done`, "sh", log)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitPause("after another process's write that broke no lease")
	c0 := sh.leases.changes.Load()
	in.Write([]byte("go\n"))
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	// And a leased file changed locally while the watcher pauses.
	local(t, "echo more >> "+filepath.Join(dir, "d", "held"))
	select {
	case b := <-a.breaks:
		t.Fatalf("break %+v during the pause", b)
	default:
	}
	release <- struct{}{}
	a.wantBreak(t, "local append during the pause", held.Ino, 0)
	// The 100 appends reached the watcher as a few merged events, read
	// at once after the pause, not as 100 wake-ups.
	if n := sh.leases.changes.Load() - c0; n > 10 {
		t.Errorf("100 appends by one process during the pause came as %d events", n)
	}
}
