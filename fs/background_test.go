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

// TestBackgroundBlockedRelease: a release that does not return (its
// server gone, a reconnect pending) holds up no other release, and the
// releases' wait waits for it too. It fails if a release can be queued
// behind a busy worker.
func TestBackgroundBlockedRelease(t *testing.T) {
	fs := &filesystem{idle: make(chan func())}
	unblock := make(chan struct{})
	var blockedRan atomic.Bool
	fs.background(func() {
		<-unblock
		blockedRan.Store(true)
	})
	// One release while the stuck one is the only worker, with no other
	// close after it to carry it along.
	done := make(chan struct{}, 100)
	fs.background(func() { done <- struct{}{} })
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a release did not run while another blocked")
	}
	// Some workers wait for releases now, one is stuck: none of these
	// may land on the stuck one.
	for range 100 {
		fs.background(func() { done <- struct{}{} })
		time.Sleep(100 * time.Microsecond)
	}
	for i := range 100 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of 100 releases ran while one blocked", i)
		}
	}
	waited := make(chan struct{})
	go func() {
		fs.releases.Wait()
		close(waited)
	}()
	select {
	case <-waited:
		t.Fatal("the releases' wait returned with a release still running")
	case <-time.After(50 * time.Millisecond):
	}
	close(unblock)
	<-waited
	if !blockedRan.Load() {
		t.Fatal("the releases' wait returned before the blocked release ended")
	}
}

// TestBackgroundPaced: a paced release waits for the next OPEN (its taker
// hands it on) or, once the mount is going, runs at once; the next ones
// wait for nothing.
func TestBackgroundPaced(t *testing.T) {
	fs := &filesystem{idle: make(chan func()), opts: Options{releasePace: time.Hour}}
	var ran atomic.Int64
	release := func() { ran.Add(1) }
	fs.paced(nil, release)
	fs.paced(nil, release)
	time.Sleep(10 * time.Millisecond)
	if ran.Load() != 0 || fs.pacer.waiting.Load() != 2 {
		t.Fatalf("%d paced releases ran, %d wait, before an OPEN", ran.Load(), fs.pacer.waiting.Load())
	}
	for _, r := range fs.takePaced() {
		fs.dispatch(r.run)
	}
	fs.releases.Wait()
	fs.paced(nil, release)
	fs.stopPacing()
	fs.releases.Wait()
	fs.paced(nil, release)
	fs.releases.Wait()
	if got := ran.Load(); got != 4 {
		t.Fatalf("%d of 4 releases ran", got)
	}
}

// TestBackgroundPaceBound: a paced release that no OPEN takes runs when
// releasePace has passed.
func TestBackgroundPaceBound(t *testing.T) {
	fs := &filesystem{idle: make(chan func()), opts: Options{releasePace: 20 * time.Millisecond}}
	done := make(chan struct{})
	fs.paced(nil, func() { close(done) })
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the paced release did not run after its bound")
	}
	fs.releases.Wait()
}
