package client

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/server"
)

// busy keeps depth reads in flight on f until stop closes.
func busy(t *testing.T, f *File, depth int, stop chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := 0; w < depth; w++ {
		wg.Go(func() {
			p := make([]byte, 4096)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := f.ReadAt(context.Background(), p, int64(i%64)*4096); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	return &wg
}

// An idle connection gives its credits back down to the minimal grant
// (issue 20), and the receive buffers beyond a few spares are freed.
func TestIdleConnectionGivesCreditsBack(t *testing.T) {
	e := newEnv(t, server.Config{Credits: 8, MaxCredits: 32, MinCredits: 2})
	s := e.session()
	cl := s.oneConnClient(t, Interrupt, 8, 32)
	f := s.newFile(t, cl, "f", testutil.RandBytes(1<<20))
	stop := make(chan struct{})
	wg := busy(t, f, 48, stop)
	testutil.Eventually(t, "32 credits under load", 10*time.Second, func() bool { return cl.Conns()[0].Credits == 32 })
	close(stop)
	wg.Wait()
	peak := e.srv.Budget()
	// Idle now: the balancer takes everything above MinCredits back.
	testutil.Eventually(t, "2 credits on both ends when idle", 10*time.Second, func() bool { return cl.Conns()[0].Credits == 2 && e.srv.Conns()[0].Credits == 2 })
	after := e.srv.Budget()
	if after.Granted != 2 || after.RecvBuffers > 1+2+2 || after.RecvBytes >= peak.RecvBytes/4 {
		t.Fatalf("idle: %+v; busy it was %+v; want 2 credits granted, at most the AUTH buffer, 2 posted and 2 spare receive buffers", after, peak)
	}
	// It still works, and grows again under load.
	stop = make(chan struct{})
	wg = busy(t, f, 48, stop)
	testutil.Eventually(t, "more than 8 credits under load again", 10*time.Second, func() bool { return cl.Conns()[0].Credits > 8 })
	close(stop)
	wg.Wait()
}

// A new client gets a grant when the budget is spent, and the busy client
// holding it gives back what is above its fair share: the budget is
// shared, not first come, first served (issue 20).
func TestBudgetRebalances(t *testing.T) {
	e := newEnv(t, server.Config{CreditBudget: 16, Credits: 8, MaxCredits: 16, MinCredits: 2})
	sa, sb := e.session(), e.session()
	a := sa.oneConnClient(t, Interrupt, 8, 16)
	fa := sa.newFile(t, a, "a", testutil.RandBytes(1<<20))
	stop := make(chan struct{})
	wga := busy(t, fa, 32, stop)
	var wgb *sync.WaitGroup
	defer func() {
		close(stop)
		wga.Wait()
		if wgb != nil {
			wgb.Wait()
		}
	}()
	testutil.Eventually(t, "A at the whole budget of 16", 10*time.Second, func() bool { return a.Conns()[0].Credits == 16 })

	b := sb.oneConnClient(t, Interrupt, 8, 16)
	if g := b.Conns()[0].Credits; g != 2 {
		t.Fatalf("a new client with the budget spent got %d credits, want the minimal 2", g)
	}
	fb := sb.newFile(t, b, "b", testutil.RandBytes(1<<20))
	wgb = busy(t, fb, 32, stop)
	// A, still busy, comes down to its fair share (16 over 2); B grows
	// into what A gave back, and A does not take it back while B wants it.
	testutil.Eventually(t, "A and B at 8 credits each", 10*time.Second, func() bool { return a.Conns()[0].Credits == 8 && b.Conns()[0].Credits == 8 })
	for i := 0; i < 20; i++ {
		time.Sleep(50 * time.Millisecond)
		ga, gb := a.Conns()[0].Credits, b.Conns()[0].Credits
		if ga > 8 || gb < 4 {
			t.Fatalf("both busy, a budget of 16: A holds %d credits, B %d; want 8 each", ga, gb)
		}
	}
	if bi := e.srv.Budget(); bi.Granted > 16 {
		t.Fatalf("granted %d credits of a budget of 16: %+v", bi.Granted, bi)
	}
}

// More than 16 clients, each with two connections, all get their LWIO
// connections from a server with the default memory budget (32 MiB, 248
// credits of 32 asked per connection): the ones past the budget get
// the minimal grant, the balancer takes the overdraft back from the
// others, and every client's I/O works (issue 20: before, a first come,
// first served budget refused every AUTH past the 16th mount).
func TestManyClientsGetLWIO(t *testing.T) {
	const clients = 24
	e := newEnv(t, server.Config{})
	budget := e.srv.Budget().Credits
	var files []*File
	for i := 0; i < clients; i++ {
		s := e.session()
		cfg := s.config(Interrupt)
		cfg.Connections = 2
		cl := s.client(t, cfg)
		for j, ci := range cl.Conns() {
			if ci.Credits < server.DefaultMinCredits {
				t.Fatalf("client %d connection %d: %d credits, want at least %d", i, j, ci.Credits, server.DefaultMinCredits)
			}
		}
		files = append(files, s.newFile(t, cl, fmt.Sprintf("f%d", i), testutil.RandBytes(64<<10)))
	}
	if bi := e.srv.Budget(); bi.Connections != 2*clients {
		t.Fatalf("%d LWIO connections, want %d: %+v", bi.Connections, 2*clients, bi)
	}
	// The overdraft is paid back: the budget holds again.
	testutil.Eventually(t, "the grants within the budget", 10*time.Second, func() bool { return e.srv.Budget().Granted <= budget })
	// The memory too: a receive buffer per credit at most (spares kept
	// while the overdraft lasted go), besides each connection's small AUTH
	// buffer.
	testutil.Eventually(t, "a receive buffer per credit at most", 10*time.Second, func() bool { bi := e.srv.Budget(); return bi.RecvBuffers <= bi.Credits+bi.Connections })
	p := make([]byte, 4096)
	for i, f := range files {
		if _, err := f.ReadAt(context.Background(), p, 0); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	t.Logf("%d clients × 2 connections on a budget of %d credits: %+v", clients, budget, e.srv.Budget())
}
