package client

import (
	"context"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol/server"
)

// deepWrites writes 1 MiB blocks at queue depth 16 on f, each of the 16
// writers `per` blocks, and returns the first error.
func deepWrites(f *File, per int) error {
	const depth, block = 16, 1 << 20
	var wg sync.WaitGroup
	errs := make(chan error, depth)
	p := randBytes(block)
	for w := 0; w < depth; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				off := int64((w*per+i)%16) * block
				n, err := f.WriteAt(context.Background(), p, off)
				if err == nil && n != block {
					err = fmt.Errorf("wrote %d of %d bytes", n, block)
				}
				if err != nil {
					errs <- fmt.Errorf("writer %d, block %d: %w", w, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// watchdog fails the test, with every goroutine's stack, when done does
// not close within limit: a stalled turn fails instead of hanging the run.
// The limit is no timing claim, only a bound far past any healthy turn.
func watchdog(t *testing.T, what string, limit time.Duration, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(limit):
		var b strings.Builder
		pprof.Lookup("goroutine").WriteTo(&b, 2)
		t.Fatalf("%s stalled for %v (credits stuck?); goroutines:\n%s", what, limit, b.String())
	}
}

// Turns of queue-depth-16 1 MiB writes (8-fragment writes, 8 credits each)
// on one connection keep going while the server's budget takes credits
// back and grants them again: a second client arriving halves the first's
// share (a negative delta while its writes wait for 8 credits), and
// leaving gives it back. This is the make bench hang of 40f0bd7: a writer
// waiting for more credits than the retirement left was never woken, and
// every request behind it waited for good.
func TestTurnsOfDeepWritesKeepGoing(t *testing.T) {
	const turns, per = 6, 4
	e := newEnv(t, server.Config{CreditBudget: 12, Credits: 12, MaxCredits: 24, MinCredits: 2})
	sa := e.session()
	cfg := sa.config(Interrupt)
	cfg.Connections, cfg.Credits, cfg.MaxCredits = 1, 12, 24
	a := sa.client(t, cfg)
	keyA, _ := sa.file(t, "a", make([]byte, 16<<20))
	fa := sa.register(t, a, keyA, 0)
	for turn := 0; turn < turns; turn++ {
		done := make(chan struct{})
		var errA, errB error
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			errA = deepWrites(fa, per)
		}()
		if turn%2 == 1 {
			// A second client arrives while A's writes are queued: the
			// budget is spent, so it gets the minimal grant and the
			// balancer retires A's credits down to the fair share.
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb := e.session()
				cfgB := sb.config(Interrupt)
				cfgB.Connections, cfgB.Credits, cfgB.MaxCredits = 1, 12, 24
				b, err := New(context.Background(), cfgB)
				if err != nil {
					errB = err
					return
				}
				defer b.Close() // leaving: A may grow back
				keyB, _ := sb.file(t, fmt.Sprintf("b%d", turn), make([]byte, 16<<20))
				fb, err := b.Register(context.Background(), keyB, 0)
				if err != nil {
					errB = err
					return
				}
				errB = deepWrites(fb, per)
			}()
		}
		go func() {
			wg.Wait()
			close(done)
		}()
		watchdog(t, fmt.Sprintf("turn %d", turn), time.Minute, done)
		if errA != nil || errB != nil {
			t.Fatalf("turn %d: client A: %v; client B: %v", turn, errA, errB)
		}
		t.Logf("turn %d: A holds %d credits", turn, a.Conns()[0].Credits)
	}
	// Credits went and came back by delta-credit handshakes, none of
	// which failed: the NOTIFY_CREDIT completing a retiring CREDIT is
	// its success (FIG. 11C), not an error.
	cr := a.Stats().Ops["CREDIT"]
	t.Logf("after %d turns: A %+v; CREDIT %+v; budget %+v", turns, a.Conns(), cr, e.srv.Budget())
	if cr.Count == 0 || cr.Errors != 0 {
		t.Fatalf("CREDIT requests: %d, %d failed; want some, none failed", cr.Count, cr.Errors)
	}
}
