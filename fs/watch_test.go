package fs

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestWatchList: a request's watch starts once it has outlived a whole
// tick period, never for one that ended first; many requests share one
// timer, which is disarmed once none is left, and armed again by the next.
func TestWatchList(t *testing.T) {
	var w watchList
	var quick, slow atomic.Int32
	// Many quick requests: registered and gone well within a period.
	for range 1000 {
		r := &watchReq{watch: func() { quick.Add(1) }}
		w.add(r)
		w.remove(r)
	}
	if n, armed := w.pending(); n != 0 || !armed {
		t.Fatalf("after quick requests: %d registered, armed %v; want 0, true", n, armed)
	}
	// A slow one: watched between one and two periods after it began.
	r := &watchReq{watch: func() { slow.Add(1) }}
	start := time.Now()
	w.add(r)
	for slow.Load() == 0 && time.Since(start) < 10*interruptWatch {
		time.Sleep(time.Millisecond)
	}
	took := time.Since(start)
	w.remove(r)
	if slow.Load() != 1 || took < interruptWatch || took > 5*interruptWatch {
		t.Errorf("slow request watched %d times after %v; want once, after %v to %v", slow.Load(), took, interruptWatch, 2*interruptWatch)
	}
	if quick.Load() != 0 {
		t.Errorf("%d quick requests were watched; want none", quick.Load())
	}
	// Idle: the timer disarms within two periods and stays so.
	deadline := time.Now().Add(10 * interruptWatch)
	for {
		if _, armed := w.pending(); !armed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the timer stays armed with no request in flight")
		}
		time.Sleep(time.Millisecond)
	}
	// The next request arms it again and is watched.
	var again atomic.Int32
	r = &watchReq{watch: func() { again.Add(1) }}
	w.add(r)
	defer w.remove(r)
	if _, armed := w.pending(); !armed {
		t.Fatal("a request after an idle spell did not arm the timer")
	}
	deadline = time.Now().Add(10 * interruptWatch)
	for again.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if again.Load() != 1 {
		t.Errorf("request after an idle spell watched %d times; want 1", again.Load())
	}
}
