package share

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLeaseTwoSilentHolders: a change that breaks two holders' leases,
// neither of which acknowledges, waits the break timeout once and goes
// on, both holders suspended — it used to wait for the second forever
// (the one timer's tick was taken by the first).
func TestLeaseTwoSilentHolders(t *testing.T) {
	dir, hs := leaseShare(t, 3)
	a, b, c := hs[0], hs[1], hs[2]
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	at := mustLease(t, a.tr, "f", LeaseRead, LeaseRead)
	mustLease(t, b.tr, "f", LeaseRead, LeaseRead)
	a.mute.Store(true)
	b.mute.Store(true)
	opened := make(chan error, 1)
	start := time.Now()
	go func() {
		w, _, err := c.tr.Open("f", unix.O_WRONLY, 0)
		if err == nil {
			w.Close()
		}
		opened <- err
	}()
	select {
	case err := <-opened:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the write open still waits for two silent holders after 5 s (the timeout is 1 s)")
	}
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Errorf("the open returned after %v, before the timeout", d)
	}
	for _, h := range []*holder{a, b} {
		h.wantBreak(t, "write open", at.Ino, 0)
		h.wantBreak(t, "suspension", 0, 0)
	}
}
