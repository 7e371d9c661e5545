package fs

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestBackgroundWaitExact checks that the releases' wait (what unmounting
// waits for) returns only once every release handed to background ran,
// whether it ran on a new worker or one that waited for it.
func TestBackgroundWaitExact(t *testing.T) {
	fs := &filesystem{idle: make(chan func())}
	var ran atomic.Int64
	release := func() {
		time.Sleep(time.Millisecond)
		ran.Add(1)
	}
	for round := 1; round <= 3; round++ {
		for range 50 {
			fs.background(release)
		}
		fs.releases.Wait()
		if got := ran.Load(); got != int64(50*round) {
			t.Fatalf("round %d: wait returned after %d of %d releases", round, got, 50*round)
		}
	}
	// One at a time: each goes to the worker the previous one left waiting.
	for i := range 20 {
		fs.background(release)
		fs.releases.Wait()
		if got := ran.Load(); got != int64(150+i+1) {
			t.Fatalf("sequential %d: wait returned after %d releases", i, got)
		}
	}
}
