package readturn

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeConn records the read deadlines set.
type fakeConn struct{ set []time.Time }

func (f *fakeConn) SetReadDeadline(t time.Time) error { f.set = append(f.set, t); return nil }

// past reports whether the deadline last set is in the past (a read now
// would fail).
func (f *fakeConn) past() bool { return len(f.set) > 0 && !f.set[len(f.set)-1].IsZero() }

func TestInterruptRules(t *testing.T) {
	var nc fakeConn
	i := New(&nc)

	// Between reads: remembered, no deadline; the next read is not started.
	n := i.Begin()
	i.Interrupt(n)
	if len(nc.set) != 0 || i.Enter() {
		t.Fatalf("interrupted between reads: deadlines %v, Enter true", nc.set)
	}
	i.End(nil)

	// In a read: the deadline goes into the past once, Leave clears it
	// and reports the end of the turn.
	n = i.Begin()
	if !i.Enter() {
		t.Fatal("a fresh turn cannot read")
	}
	i.Interrupt(n)
	i.Interrupt(n)
	if len(nc.set) != 1 || !nc.past() {
		t.Fatalf("interrupted in a read: deadlines %v", nc.set)
	}
	if !i.Leave() || nc.past() {
		t.Fatalf("Leave: deadline %v left behind", nc.set)
	}
	i.End(nil)

	// A late interruption (of a turn that ended, or an earlier one) is
	// stale: the next turn reads on, no deadline set.
	late := n
	n = i.Begin()
	i.Interrupt(late)
	if !i.Enter() || !i.Reading() {
		t.Fatal("a stale interruption ended the next turn")
	}
	if i.Leave() || len(nc.set) != 2 {
		t.Fatalf("a stale interruption: deadlines %v", nc.set)
	}
	i.End(nil)
	i.Interrupt(n) // after End
	n = i.Begin()
	if !i.Enter() {
		t.Fatal("an interruption after End ended the next turn")
	}
	i.Leave()
	i.End(nil)
}

// TestBeginCtx: a turn begun with a context is interrupted when the
// context ends (here in a read); a context that never ends is not watched.
func TestBeginCtx(t *testing.T) {
	var nc fakeConn
	i := New(&nc)
	if i.BeginCtx(context.Background()) != nil {
		t.Fatal("a context that never ends is watched")
	}
	i.End(nil)

	ctx, cancel := context.WithCancel(context.Background())
	unwatch := i.BeginCtx(ctx)
	if !i.Enter() {
		t.Fatal("a fresh turn cannot read")
	}
	cancel()
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		i.mu.Lock()
		armed := i.armed
		i.mu.Unlock()
		if armed {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("the context's end did not cut the read short")
		}
	}
	if !i.Leave() || nc.past() {
		t.Fatalf("Leave: turn not ended, or deadline %v left behind", nc.set)
	}
	i.End(unwatch)
}

// TestStepAside: the reader steps aside while turns keep being taken, and
// comes back after yield when they stop, at once when woken or done, and
// after yield when the last turn is ahead of a clock stepped back.
func TestStepAside(t *testing.T) {
	const yield = 5 * time.Millisecond
	var last atomic.Int64
	var tm *time.Timer
	wake, done := make(chan struct{}, 1), make(chan struct{})

	// Turns taken every millisecond for 30 ms: the reader stays aside at
	// least that long — unless the turn taker was held up for a yield
	// (descheduled on a loaded machine: under -race beside CPU hogs, a
	// gap of 24 ms came), when coming back is right. Each turn is noted
	// as StepAside sees it, by the wall clock of last.
	var mu sync.Mutex
	var turns []int64
	stop := time.Now().Add(30 * time.Millisecond)
	go func() {
		for time.Now().Before(stop) {
			now := time.Now().UnixNano()
			last.Store(now)
			mu.Lock()
			turns = append(turns, now)
			mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()
	start := time.Now()
	ok := StepAside(&tm, yield, &last, wake, done)
	back := time.Now()
	if !ok {
		t.Fatal("done reported, not done")
	}
	if took := back.Sub(start); took < 30*time.Millisecond {
		// Back early: right only after a yield with no turn (between
		// two turns, before the first, or after the last).
		mu.Lock()
		gap, prev := time.Duration(0), start.UnixNano()
		for _, at := range append(append([]int64{}, turns...), back.UnixNano()) {
			if at > back.UnixNano() {
				break
			}
			gap, prev = max(gap, time.Duration(at-prev)), at
		}
		mu.Unlock()
		if gap < yield {
			t.Fatalf("came back after %v while turns were taken (the longest gap between them %v, yield %v)", took, gap, yield)
		}
		t.Logf("came back after %v: the turn taker was held up %v (yield %v)", took, gap, yield)
	}

	// A last turn an hour ahead (the clock stepped back): back after yield.
	last.Store(time.Now().Add(time.Hour).UnixNano())
	returned := make(chan bool, 1)
	go func() { returned <- StepAside(&tm, yield, &last, wake, done) }()
	select {
	case ok := <-returned:
		if !ok {
			t.Fatal("done reported, not done")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a last turn ahead of the clock held the reader aside")
	}

	// Woken, and done.
	last.Store(time.Now().Add(time.Hour).UnixNano())
	wake <- struct{}{}
	if !StepAside(&tm, time.Hour, &last, wake, done) {
		t.Fatal("woken: done reported")
	}
	close(done)
	if StepAside(&tm, time.Hour, &last, wake, done) {
		t.Fatal("done: not reported")
	}
}
