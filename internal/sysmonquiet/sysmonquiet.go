// Package sysmonquiet keeps the Go runtime's monitor thread (sysmon) from
// costing a busy server a thread wake-up on every request.
//
// What sysmon does (go1.26, runtime/proc.go: sysmon, retake,
// entersyscallWakeSysmon), and what it costs a process that serves small
// requests:
//
//   - When every P is idle, sysmon deep-sleeps on a note. The first system
//     call after each idle spell wakes it (a futex wake on that request's
//     path) and resets its tick to 20 µs.
//   - It then sleeps 20 µs per tick, and backs off (doubling up to 10 ms)
//     only after 50 ticks in a row in which retake took no P.
//   - retake takes a P from a goroutine in a system call once the call has
//     lasted one tick, if its run queue has work or no P is idle and no
//     thread spins; and always after 10 ms.
//
// lwio-server goes idle and busy at least twice per file of a tar -x, so
// its sysmon never backed off: 12.5 nanosleeps per file, a fifth of the
// server's CPU (docs/bench.md). Two things keep it from deep sleep and
// from retaking, so that it backs off to 10 ms ticks:
//
//   - a Keeper: while the process is busy, one goroutine naps in a blocking
//     nanosleep(2) (a system call, entered as x/sys/unix enters them, so its
//     P stays held: not every P is idle), waking every few milliseconds,
//     below retake's 10 ms;
//   - AddProcs: Ps beyond those that goroutines in system calls hold, so
//     that a P stays idle and retake leaves those calls alone (the Keeper's
//     nap; go-fuse's readers, blocked in read(2) on /dev/fuse).
//
// Neither spins: the Keeper sleeps in the kernel, and goes back to Go's
// timers (no system call, Ps idle, sysmon's deep sleep) once the process
// has been quiet for a second.
package sysmonquiet

import (
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/defaults"
)

// AddProcs raises GOMAXPROCS by n and returns the new value. A GOMAXPROCS
// set in the environment is the user's and is left as it is (as is a
// non-positive n). Setting it stops the runtime's own updates of
// GOMAXPROCS to a changed CPU limit (go1.25+).
func AddProcs(n int) int {
	cur := runtime.GOMAXPROCS(0)
	if n <= 0 || os.Getenv("GOMAXPROCS") != "" {
		return cur
	}
	runtime.GOMAXPROCS(cur + n)
	return cur + n
}

// Defaults of a Keeper's zero fields.
const (
	// DefaultNap is half of retake's 10 ms, so that a nap ends before
	// sysmon would take its P whatever the phase of sysmon's ticks.
	DefaultNap = 5 * time.Millisecond
	// DefaultWindow is how often the Keeper looks at the process's
	// activity while busy.
	DefaultWindow = 100 * time.Millisecond
	// DefaultIdleAfter quiet windows (1 s) end the naps.
	DefaultIdleAfter = 10
	// DefaultIdlePoll is how often a quiet Keeper looks for activity: the
	// longest a new burst of requests runs with sysmon waking per request.
	DefaultIdlePoll = 250 * time.Millisecond
	// DefaultBusy is the activity per window that counts as busy: 20 of
	// the runtime's sampled goroutine runs (it samples one in 8,
	// /sched/latencies:seconds), ≈ 1,600 goroutine runs a second. The
	// Keeper's own naps add ≈ 3 per window.
	DefaultBusy = 20
)

// A Keeper holds one P in a system call while the process is busy and has
// another P (never its only one: spareP). Its zero value is ready to
// Start, with the defaults above.
type Keeper struct {
	// Nap is the length of one blocking nanosleep; keep it below 10 ms.
	// Zero means DefaultNap.
	Nap time.Duration
	// Window is how often activity is measured while busy. Zero means
	// DefaultWindow.
	Window time.Duration
	// IdleAfter is how many windows in a row below Busy end the naps. Zero
	// means DefaultIdleAfter.
	IdleAfter int
	// IdlePoll is how often activity is measured while quiet (in
	// time.Sleep, no system call). Zero means DefaultIdlePoll.
	IdlePoll time.Duration
	// Busy is the activity per Window (per IdlePoll while quiet, scaled)
	// that counts as busy. Zero means DefaultBusy.
	Busy int
	// Activity returns a count that grows with the process's work. Nil
	// means goroutine runs (sampled; runtime/metrics).
	Activity func() uint64

	napping atomic.Bool
	mu      sync.Mutex // guards stop and done
	stop    chan struct{}
	done    chan struct{}
}

// Start starts the keeper's goroutine; Stop ends it. Start after AddProcs(1),
// so that the P the naps hold is one more than the process had.
func (k *Keeper) Start() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stop != nil {
		return
	}
	k.stop, k.done = make(chan struct{}), make(chan struct{})
	go k.run(k.stop, k.done)
}

// Stop ends the keeper's goroutine and waits for it.
func (k *Keeper) Stop() {
	k.mu.Lock()
	stop, done := k.stop, k.done
	k.stop = nil
	k.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}

// Napping reports whether the keeper is in its busy mode (napping in
// system calls) rather than quiet.
func (k *Keeper) Napping() bool { return k.napping.Load() }

func (k *Keeper) run(stop, done chan struct{}) {
	defer close(done)
	defer k.napping.Store(false)
	nap, window, poll, idleAfter, busy := k.Nap, k.Window, k.IdlePoll, k.IdleAfter, k.Busy
	defaults.Set(&nap, DefaultNap)
	defaults.Set(&window, DefaultWindow)
	defaults.Set(&poll, DefaultIdlePoll)
	defaults.Set(&idleAfter, DefaultIdleAfter)
	defaults.Set(&busy, DefaultBusy)
	activity := k.Activity
	if activity == nil {
		activity = newGoroutineRuns().count
	}
	// Activity needed per quiet poll to wake up: Busy per Window, scaled
	// to the poll (at least 1).
	pollBusy := max(uint64(busy)*uint64(poll)/uint64(window), 1)
	napsPerWindow := max(int(window/nap), 1)
	ts := unix.NsecToTimespec(int64(nap))
	last := activity()
	for {
		// Quiet: Go's own timer, no system call; every P may go idle
		// and sysmon deep-sleep, as in any Go program.
		select {
		case <-stop:
			return
		case <-time.After(poll):
		}
		if c := activity(); c-last < pollBusy || !spareP() {
			last = c
			continue
		}
		// Busy: nap in the kernel holding a P, yield between naps (a new
		// schedtick, or sysmon would take the P after 10 ms of one
		// goroutine), and measure per window.
		k.napping.Store(true)
		last = activity()
		for quiet := 0; quiet < idleAfter && spareP(); {
			for range napsPerWindow {
				_ = unix.Nanosleep(&ts, nil)
				runtime.Gosched()
			}
			select {
			case <-stop:
				return
			default:
			}
			c := activity()
			if c-last < uint64(busy) {
				quiet++
			} else {
				quiet = 0
			}
			last = c
		}
		k.napping.Store(false)
	}
}

// spareP reports whether the process has a P besides the one a nap would
// hold. With one P (GOMAXPROCS=1 in the environment, which AddProcs
// keeps) no P is idle and none spins while the nap holds it, so retake
// takes it back at sysmon's next tick, every nap: sysmon woke more often
// with the keeper than without it, and the process's goroutines waited
// for each retake.
func spareP() bool { return runtime.GOMAXPROCS(0) > 1 }

// goroutineRuns counts the runtime's sampled goroutine runs.
type goroutineRuns struct {
	s []metrics.Sample
}

func newGoroutineRuns() *goroutineRuns {
	return &goroutineRuns{s: []metrics.Sample{{Name: "/sched/latencies:seconds"}}}
}

func (g *goroutineRuns) count() uint64 {
	metrics.Read(g.s)
	if g.s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0
	}
	var n uint64
	for _, c := range g.s[0].Value.Float64Histogram().Counts {
		n += c
	}
	return n
}
