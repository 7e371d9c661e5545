package client

import (
	"context"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/server"
)

// deepWrites writes 1 MiB blocks at queue depth 16 on f, each of the 16
// writers `per` blocks, and returns the first error.
func deepWrites(f *File, per int) error {
	const depth, block = 16, 1 << 20
	var wg sync.WaitGroup
	errs := make(chan error, depth)
	p := testutil.RandBytes(block)
	for w := 0; w < depth; w++ {
		wg.Go(func() {
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
		})
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

// oneConnFile is a client of a new session with one connection asking
// for credits (growing to max) in mode, and a registered file of size
// zero bytes.
func oneConnFile(t *testing.T, e *env, mode Mode, credits, max, size int) (*Client, *File) {
	s := e.session()
	cl := s.oneConnClient(t, mode, credits, max)
	return cl, s.newFile(t, cl, "f", make([]byte, size))
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
	a, fa := oneConnFile(t, e, Interrupt, 12, 24, 16<<20)
	for turn := 0; turn < turns; turn++ {
		done := make(chan struct{})
		var errA, errB error
		var wg sync.WaitGroup
		wg.Go(func() {
			errA = deepWrites(fa, per)
		})
		if turn%2 == 1 {
			// A second client arrives while A's writes are queued: the
			// budget is spent, so it gets the minimal grant and the
			// balancer retires A's credits down to the fair share.
			wg.Go(func() {
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
			})
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

// More writes posted by WriteAsync than the connection's credits cover,
// none waited for yet (fs's write-behind keeps 8 in flight per file, 8
// credits each for 1 MiB), in every completion mode: each post must get
// its credits back from the earlier writes' answers. A polling-mode write
// released its credits only when its Wait polled the status block, so the
// fourth post of a 24-credit connection waited for credits only its
// poster's later Waits would free (make bench's buffered 1 MiB write hang
// on the lwio-polling mount at 66b418e).
func TestWriteAsyncBeyondCreditsInEachMode(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, server.Config{Credits: 24, MaxCredits: 24})
			_, f := oneConnFile(t, e, mode, 24, 24, 8<<20)
			postThenWait(t, f, 8, "8 posted 1 MiB writes on 24 credits", time.Minute)
		})
	}
}

// postThenWait posts n 1 MiB writes with WriteAsync, none waited for until
// all are posted (under a watchdog of limit), then waits for each.
func postThenWait(t *testing.T, f *File, n int, what string, limit time.Duration) {
	t.Helper()
	p := testutil.RandBytes(1 << 20)
	var pws []*PendingWrite
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		for i := 0; i < n; i++ {
			var pw *PendingWrite
			if pw, err = f.WriteAsync(context.Background(), p, int64(i)<<20); err != nil {
				return
			}
			pws = append(pws, pw)
		}
	}()
	watchdog(t, what, limit, done)
	if err != nil {
		t.Fatal(err)
	}
	for i, pw := range pws {
		if n, err := pw.Wait(context.Background()); err != nil || n != len(p) {
			t.Fatalf("write %d: %d bytes, %v", i, n, err)
		}
	}
}

// Posted writes that need every credit of the connection, none waited
// for (fs's write-behind waits only once its queue is full): the next post
// gets its credits from the earlier write's answer as it comes, not from
// the background reaper's next idle look at the CQ. With the looks an hour
// apart the posts must still go on (the first buffered 1 MiB writes after
// an idle spell stalled 30–100 ms each waiting for a look, in auto and
// interrupt mode; make bench's seqwrite-qd1-buffered gap of issue 17).
func TestPostedWritesNeedNoIdleLook(t *testing.T) {
	defer func(p, m time.Duration) { idlePoll, idlePollMax = p, m }(idlePoll, idlePollMax)
	idlePoll, idlePollMax = time.Hour, time.Hour
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, server.Config{Credits: 8, MaxCredits: 8})
			_, f := oneConnFile(t, e, mode, 8, 8, 4<<20)
			postThenWait(t, f, 4, "4 posted 1 MiB writes on 8 credits, none waited for", 30*time.Second)
		})
	}
}
