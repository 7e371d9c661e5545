package sysmonquiet

import (
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// restoreProcs puts GOMAXPROCS back after the test.
func restoreProcs(t *testing.T) int {
	n := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(n) })
	return n
}

// TestAddProcs: n more Ps, unless the environment set GOMAXPROCS.
func TestAddProcs(t *testing.T) {
	n := restoreProcs(t)
	t.Setenv("GOMAXPROCS", "")
	if got := AddProcs(2); got != n+2 || runtime.GOMAXPROCS(0) != n+2 {
		t.Fatalf("AddProcs(2) from %d = %d (GOMAXPROCS %d), want %d", n, got, runtime.GOMAXPROCS(0), n+2)
	}
	if got := AddProcs(0); got != n+2 {
		t.Fatalf("AddProcs(0) = %d, want it left at %d", got, n+2)
	}
	t.Setenv("GOMAXPROCS", "7")
	if got := AddProcs(1); got != n+2 || runtime.GOMAXPROCS(0) != n+2 {
		t.Fatalf("AddProcs(1) with $GOMAXPROCS set = %d (GOMAXPROCS %d), want it left at %d", got, runtime.GOMAXPROCS(0), n+2)
	}
}

// inSyscall is how many goroutines are in a system call, as the runtime
// counts them.
func inSyscall() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines/not-in-go:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestKeeperHoldsAPWhileBusy: quiet, the keeper makes no system call (every
// P may go idle, as in any Go program); once the process is busy it holds a
// P in a system call (so that not every P is idle and sysmon never
// deep-sleeps), and lets it go again once the process is quiet. It fails if
// the keeper naps in Go's timers rather than in the kernel, or never
// stops napping.
func TestKeeperHoldsAPWhileBusy(t *testing.T) {
	if n := inSyscall(); n != 0 {
		t.Fatalf("%d goroutines in system calls before the keeper starts", n)
	}
	var busy atomic.Bool
	var work atomic.Uint64
	k := &Keeper{
		Nap: time.Millisecond, Window: 4 * time.Millisecond, IdlePoll: 2 * time.Millisecond, IdleAfter: 3, Busy: 10,
		Activity: func() uint64 {
			if busy.Load() {
				return work.Add(100)
			}
			return work.Load()
		},
	}
	k.Start()
	defer k.Stop()
	if k.Napping() {
		t.Fatal("the keeper naps before any activity")
	}

	busy.Store(true)
	testutil.Eventually(t, "the keeper naps", time.Minute, k.Napping)
	testutil.Eventually(t, "a goroutine holds a P in a system call", time.Minute, func() bool { return inSyscall() >= 1 })

	busy.Store(false)
	testutil.Eventually(t, "the keeper stops napping", time.Minute, func() bool { return !k.Napping() })
	testutil.Eventually(t, "no goroutine is left in a system call", time.Minute, func() bool { return inSyscall() == 0 })

	busy.Store(true)
	testutil.Eventually(t, "the keeper naps again", time.Minute, k.Napping)
	k.Stop()
	if k.Napping() {
		t.Fatal("the keeper naps after Stop")
	}
	testutil.Eventually(t, "no goroutine is left in a system call after Stop", time.Minute, func() bool { return inSyscall() == 0 })
}

// TestGoroutineRuns: the default activity grows as goroutines run (a
// ping-pong of 2,000 runs; the runtime samples one in 8).
func TestGoroutineRuns(t *testing.T) {
	g := newGoroutineRuns()
	before := g.count()
	ping, pong := make(chan struct{}), make(chan struct{})
	go func() {
		for range ping {
			pong <- struct{}{}
		}
	}()
	for range 1000 {
		ping <- struct{}{}
		<-pong
	}
	close(ping)
	if after := g.count(); after <= before {
		t.Fatalf("goroutine runs %d before 2,000 runs, %d after", before, after)
	}
}

// TestKeeperNoNapOnOneP: with one P (GOMAXPROCS=1 in the environment,
// which AddProcs keeps) a nap would hold the process's only P, which
// retake always takes back (no P idle, none spinning): sysmon woke more
// with the keeper than without it, and the process's goroutines waited
// for each retake. The keeper stays quiet however busy the process is,
// and naps once there is a second P. It fails if the keeper naps on one P.
func TestKeeperNoNapOnOneP(t *testing.T) {
	restoreProcs(t)
	runtime.GOMAXPROCS(1)
	var work atomic.Uint64
	k := &Keeper{
		Nap: time.Millisecond, Window: 4 * time.Millisecond, IdlePoll: 2 * time.Millisecond, IdleAfter: 3, Busy: 10,
		Activity: func() uint64 { return work.Add(100) },
	}
	k.Start()
	defer k.Stop()
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if k.Napping() {
			t.Fatal("the keeper naps on the only P")
		}
	}
	runtime.GOMAXPROCS(2)
	testutil.Eventually(t, "the keeper naps with a second P", time.Minute, k.Napping)
	runtime.GOMAXPROCS(1)
	testutil.Eventually(t, "the keeper stops napping when back to one P", time.Minute, func() bool { return !k.Napping() })
}
