package load

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/test/hostile/rig"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// faultOutcome is what one faulted client saw.
type faultOutcome struct {
	ok, failedAfter int
	slowest         time.Duration
	toDone          time.Duration // first failure to Client.Done
}

// untilDead runs 4 KiB writes and reads on c until every connection of
// the client is gone (Client.Done), then 50 more calls, every one of
// which must fail with a connection error. No call may take longer than
// limit. Safe to run from any goroutine.
func untilDead(t *testing.T, c *loadClient, until time.Time, limit time.Duration) faultOutcome {
	var o faultOutcome
	buf := make([]byte, 4096)
	var firstFail time.Time
	dead := false
	for i := 0; time.Now().Before(until); i++ {
		if !dead {
			select {
			case <-c.cl.Done():
				dead = true
				if !firstFail.IsZero() {
					o.toDone = time.Since(firstFail)
				}
			default:
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		var err error
		if i%2 == 0 {
			_, err = c.f.WriteAt(ctx, buf, int64(i%64)*4096)
		} else {
			_, err = c.f.ReadAt(ctx, buf, int64(i%64)*4096)
		}
		cancel()
		d := time.Since(start)
		o.slowest = max(o.slowest, d)
		if d > limit {
			t.Errorf("client %d: call %d took %v (limit %v): %v", c.idx, i, d, limit, err)
		}
		if err == nil {
			if dead {
				t.Errorf("client %d: call %d succeeded after every connection was lost", c.idx, i)
			}
			o.ok++
			continue
		}
		if !protocol.IsConnectionLost(err) && !errors.Is(err, client.ErrClosed) {
			t.Errorf("client %d: call %d failed with %v, want a connection error", c.idx, i, err)
		}
		if firstFail.IsZero() {
			firstFail = time.Now()
		}
		if dead {
			o.failedAfter++
			if o.failedAfter == 50 {
				return o
			}
		}
	}
	t.Errorf("client %d: still %d of 50 failing calls to go at the deadline (dead %v)", c.idx, 50-o.failedAfter, dead)
	return o
}

// runFaulted starts healthy clients with the verified mixed workload and
// faulted clients whose provider injects f, runs both until the faulted
// ones are dead, and checks that the healthy ones saw no error and the
// server is back to the healthy clients' connections only.
func runFaulted(t *testing.T, name string, f soft.Faults, popts, serverOpts soft.Options, limit time.Duration) {
	healthy, faulted := 4, 4
	if testing.Short() {
		healthy, faulted = 2, 2
	}
	s := rig.Start(t, rig.Options{Engine: engineConfig(healthy + faulted), Soft: serverOpts})
	var hs, fs []*loadClient
	for i := 0; i < healthy; i++ {
		hs = append(hs, newLoadClient(t, s, i, soft.New(soft.Options{}), client.Mode(i%2), 0))
	}
	for i := 0; i < faulted; i++ {
		fo := popts
		ff := f
		// Stagger the faults so the connections do not all die at once.
		if ff.ResetAfterOps > 0 {
			ff.ResetAfterOps += 37 * i
		}
		if ff.DropAfterOps > 0 {
			ff.DropAfterOps += 37 * i
		}
		fo.Faults = &ff
		fs = append(fs, newLoadClient(t, s, healthy+i, soft.New(fo), client.Mode(i%2), 0))
	}
	until := time.Now().Add(30 * time.Second)
	var st stats
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var stopOnce sync.Once
	for _, c := range hs {
		for j := 0; j < 2; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				shadow := make([]byte, regionSize)
				for {
					select {
					case <-stop:
						return
					default:
					}
					job(c, j, time.Now().Add(200*time.Millisecond), &st, shadow)
				}
			}()
		}
	}
	outs := make([]faultOutcome, len(fs))
	var fwg sync.WaitGroup
	start := time.Now()
	for i, c := range fs {
		fwg.Add(1)
		go func() {
			defer fwg.Done()
			outs[i] = untilDead(t, c, until, limit)
		}()
	}
	fwg.Wait()
	faultTime := time.Since(start)
	stopOnce.Do(func() { close(stop) })
	wg.Wait()
	healthyErrs := st.callErrs.Load() + st.verifyErrs.Load()
	if healthyErrs != 0 {
		t.Errorf("healthy clients: %d errors during the faults; first: %v", healthyErrs, st.firstErr.Load())
	}
	want := healthy * connsPerClient
	n := s.WaitConns(want, 10*time.Second)
	if n != want {
		t.Errorf("server holds %d connections after the faulted clients died, want the healthy %d", n, want)
	}
	check := s.Check(t)
	var okCalls, after int
	var slowest, toDone time.Duration
	for _, o := range outs {
		okCalls += o.ok
		after += o.failedAfter
		slowest = max(slowest, o.slowest)
		toDone = max(toDone, o.toDone)
	}
	figures.Add(t, "%s on %d faulted clients (%d healthy alongside): %d calls succeeded before the fault, then every connection lost within %v of the first failure; %d calls after: all failed; slowest call %v (limit %v); healthy clients %d verified ops, %d errors; server back to %d connections; newcomer served in %v; faults over in %v",
		name, faulted, healthy, okCalls, toDone.Round(time.Millisecond), after, slowest.Round(time.Millisecond), limit,
		st.ops.Load(), healthyErrs, n, check.Round(time.Millisecond), faultTime.Round(time.Millisecond))
}

// TestFaultReset resets the faulted clients' connections (TCP RST) after
// N operations (soft.Faults.ResetAfterOps).
func TestFaultReset(t *testing.T) {
	runFaulted(t, "reset_after=100", soft.Faults{ResetAfterOps: 100}, soft.Options{}, soft.Options{}, 5*time.Second)
}

// TestFaultDrop black-holes the faulted clients' connections after N
// operations (soft.Faults.DropAfterOps): calls fail at a transport
// timeout, not never. A request the server acknowledged before the hole
// opened leaves the client nothing unacknowledged, so only the server's
// transport timeout (1 s + its 2 s RNR wait here; 10 s + 2 s by default)
// ends that connection; the limit allows for it.
func TestFaultDrop(t *testing.T) {
	runFaulted(t, "drop_after=100 (transport timeout: client 500ms, server 1s)", soft.Faults{DropAfterOps: 100},
		soft.Options{TransportTimeout: 500 * time.Millisecond, RNRTimeout: 200 * time.Millisecond},
		soft.Options{TransportTimeout: time.Second}, 8*time.Second)
}

// TestFaultDelay delays every completion of a client's connections by
// 500 ms (soft.Faults.DelayCompletions): a call whose context ends first
// returns the context's error at once; calls that wait succeed with the
// right data; the client and the server stay usable.
func TestFaultDelay(t *testing.T) {
	const delay = 500 * time.Millisecond
	s := rig.Start(t, rig.Options{Engine: engineConfig(2)})
	c := newLoadClient(t, s, 0, soft.New(soft.Options{Faults: &soft.Faults{DelayCompletions: delay}}), client.Interrupt, 0)
	want := bytes.Repeat([]byte("delayed!"), 512)
	var slowestShort, fastestLong time.Duration
	fastestLong = time.Hour
	for i := 0; i < 3; i++ {
		// Short deadline: the context wins, promptly.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		start := time.Now()
		_, err := c.f.ReadAt(ctx, make([]byte, 4096), 0)
		d := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("READ with a 20 ms deadline under a %v delay: %v", delay, err)
		}
		if d > delay {
			t.Errorf("READ with a 20 ms deadline returned after %v (delay %v)", d, delay)
		}
		slowestShort = max(slowestShort, d)
		// Long deadline: it waits the delay and succeeds.
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		start = time.Now()
		if n, err := c.f.WriteAt(ctx, want, int64(i)*4096); err != nil || n != len(want) {
			t.Fatalf("WRITE under delay: %d %v", n, err)
		}
		got := make([]byte, len(want))
		if n, err := c.f.ReadAt(ctx, got, int64(i)*4096); err != nil || n != len(got) || !bytes.Equal(got, want) {
			t.Fatalf("READ under delay: %d %v (equal %v)", n, err, bytes.Equal(got, want))
		}
		d = time.Since(start)
		cancel()
		if d < delay {
			t.Errorf("WRITE+READ took %v, less than the injected %v: the fault is not in effect", d, delay)
		}
		fastestLong = min(fastestLong, d)
	}
	if n := s.Engine.NumConns(); n != connsPerClient {
		t.Errorf("server has %d connections, want the client's %d", n, connsPerClient)
	}
	check := s.Check(t)
	figures.Add(t, "delay=%v on one client: 3 READs with a 20 ms deadline returned context.DeadlineExceeded in ≤ %v; 3 WRITE+READ pairs waited (≥ %v each) and verified; server served a newcomer in %v",
		delay, slowestShort.Round(time.Millisecond), fastestLong.Round(time.Millisecond), check.Round(time.Millisecond))
}
