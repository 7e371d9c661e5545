package fs

import (
	"sync/atomic"
	"testing"
	"time"
)

// timerLate is how late the tests here let a Go timer fire: never early,
// but on a loaded two-CPU machine under -race a tick due in 20 ms came
// after more than 100 ms, and two in a row after 260 ms.
const timerLate = 2 * time.Second

// TestWatchListTicks pins what a tick does, tick by tick and with no
// clock in it (the ticks are the test's; the list's timer is one that
// never runs tick): a request is watched at the second tick after it
// registered, never the first, and once; one gone before that is never
// watched; a tick that leaves nothing registered disarms the timer, and
// the next request arms it.
func TestWatchListTicks(t *testing.T) {
	w := watchList{armed: true, timer: time.AfterFunc(time.Hour, func() {})}
	defer w.timer.Stop()
	watched := map[string]int{}
	req := func(name string) *watchReq { return &watchReq{watch: func() { watched[name]++ }} }
	want := func(when string, w map[string]int) {
		t.Helper()
		for _, name := range []string{"slow", "quick", "late"} {
			if watched[name] != w[name] {
				t.Errorf("%s: %s watched %d times, want %d", when, name, watched[name], w[name])
			}
		}
	}

	slow, quick := req("slow"), req("quick")
	w.add(slow)
	w.add(quick)
	w.tick()
	want("first tick", nil)
	w.remove(quick) // gone within its second period
	late := req("late")
	w.add(late)
	w.tick()
	want("second tick", map[string]int{"slow": 1})
	if n, armed := w.pending(); n != 1 || !armed {
		t.Errorf("one request due at the next tick: %d registered, armed %v; want 1, true", n, armed)
	}
	w.tick()
	want("third tick", map[string]int{"slow": 1, "late": 1})
	// Watched, they leave the list (their watch is their own now).
	if n, armed := w.pending(); n != 0 || armed {
		t.Errorf("a tick that left nothing registered: %d registered, armed %v; want 0, false", n, armed)
	}
	w.remove(slow)
	w.remove(late)
	w.tick()
	want("a tick after they ended", map[string]int{"slow": 1, "late": 1})
	w.add(quick)
	if _, armed := w.pending(); !armed {
		t.Error("a request after an idle tick did not arm the timer")
	}
}

// TestWatchList: with the list's own timer, a request's watch starts once
// it has outlived a whole tick period, never for one that ended first;
// many requests share one timer, which is disarmed once none is left, and
// armed again by the next. (Which tick watches what: TestWatchListTicks.)
func TestWatchList(t *testing.T) {
	var w watchList
	var slow atomic.Int32
	// Many quick requests: a watch for one that lived less than a
	// period is a bug; one the test's thread was descheduled under for
	// a period (a loaded machine) is rightly watched.
	type quickReq struct {
		watched atomic.Bool
		lived   time.Duration // from before add to after remove
	}
	quick := make([]*quickReq, 1000)
	for i := range quick {
		q := &quickReq{}
		r := &watchReq{watch: func() { q.watched.Store(true) }}
		start := time.Now()
		w.add(r)
		if i == 0 {
			if _, armed := w.pending(); !armed {
				t.Fatal("the first request did not arm the timer")
			}
		}
		w.remove(r)
		q.lived = time.Since(start)
		quick[i] = q
	}
	if n, _ := w.pending(); n != 0 {
		t.Fatalf("after quick requests: %d registered; want 0", n)
	}
	// A slow one: watched no sooner than a period after it began.
	r := &watchReq{watch: func() { slow.Add(1) }}
	start := time.Now()
	w.add(r)
	for slow.Load() == 0 && time.Since(start) < timerLate {
		time.Sleep(time.Millisecond)
	}
	took := time.Since(start)
	time.Sleep(3 * interruptWatch) // a second watch would come by now
	w.remove(r)
	if slow.Load() != 1 || took < interruptWatch {
		t.Errorf("slow request watched %d times after %v; want once, after %v to %v (timers run late on a busy machine, up to %v here)",
			slow.Load(), took, interruptWatch, 2*interruptWatch, timerLate)
	}
	early, late := 0, 0
	for _, q := range quick {
		switch {
		case q.watched.Load() && q.lived < interruptWatch:
			early++
		case q.lived >= interruptWatch:
			late++
		}
	}
	if early != 0 {
		t.Errorf("%d quick requests were watched though registered less than %v; want none", early, interruptWatch)
	}
	if late != 0 {
		t.Logf("%d quick requests outlived a period (the test descheduled)", late)
	}
	// Idle: the timer disarms within two periods and stays so.
	deadline := time.Now().Add(timerLate)
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
	deadline = time.Now().Add(timerLate)
	for again.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if again.Load() != 1 {
		t.Errorf("request after an idle spell watched %d times; want 1", again.Load())
	}
}
