package soft

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// TestWaitEndsWithItsContext: a waiter reading the socket itself must
// leave CQ.Wait when its context ends even if it ends between two reads
// (here: while the waiter places an RDMA WRITE, which makes no completion)
// and the link then goes quiet. A polling requester waits exactly so: its
// status block lands by RDMA WRITE, and its wait must end to look at it.
// The first version of readside.go missed an end between reads, and the
// waiter stayed blocked in read(2) until the next frame — never, on a
// quiet link (issue 16's hang).
func TestWaitEndsWithItsContext(t *testing.T) {
	cli, srv := pair(t, New(Options{}), New(Options{}), transport.Config{})
	cc := cli.(*conn)
	dst := mustAlloc(t, cli, 64, transport.AccessLocal|transport.AccessRemoteWrite)
	rbuf := mustAlloc(t, cli, 64, transport.AccessLocal)
	src := mustAlloc(t, srv, 64, transport.AccessLocal)
	go func() { // the server reaps its own completions until cleanup closes it
		var buf [8]transport.Completion
		for {
			if _, err := srv.CQ().Wait(context.Background(), buf[:]); err != nil {
				return
			}
		}
	}()
	turns := 0
	for round := 0; round < 100; round++ {
		// A SEND the waiter receives while asleep in Wait: the reader
		// goroutine then leaves the socket to it.
		if err := cli.PostRecv(transport.RecvWR{ID: uint64(round), Buf: transport.Whole(rbuf)}); err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(200*time.Microsecond, func() {
			_ = srv.Post(transport.SendWR{Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}})
		})
		if c := waitOne(t, cli, 10*time.Second); c.Op != transport.OpRecv || c.Status != transport.StatusSuccess {
			t.Fatalf("round %d: %+v", round, c)
		}
		// Now a plain RDMA WRITE, placed while the waiter's context
		// ends (the hook holds the turn until then), and nothing after.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
		held := false
		cc.hooks.Store(&testHooks{afterStep: func() {
			held = true
			<-ctx.Done()
		}})
		time.AfterFunc(100*time.Microsecond, func() {
			_ = srv.Post(transport.SendWR{Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(src)},
				RemoteAddr: dst.Addr(), RKey: dst.Handle()})
		})
		returned := make(chan error, 1)
		go func() {
			var buf [4]transport.Completion
			_, err := cli.CQ().Wait(ctx, buf[:])
			returned <- err
		}()
		select {
		case err := <-returned:
			if err == nil {
				t.Fatalf("round %d: a completion, but nothing was to complete", round)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: CQ.Wait still blocked 5 s after its 2 ms context ended (%d turns held the socket)", round, turns)
		}
		cancel()
		cc.hooks.Store(nil)
		if held {
			turns++
		}
	}
	t.Logf("%d of 100 waits read the socket themselves", turns)
	if turns == 0 {
		t.Error("no wait read the socket itself: the case was not exercised")
	}
}

// TestWaitSeesWhatTheReaderPushed: a completion the reader goroutine
// delivers after a waiter found the CQ empty, but before the waiter takes
// the socket, must end the wait; the waiter must not go on to block in
// read(2) with it queued. (Under load the reader goroutine can be
// preempted between releasing the socket and taking it again; a healthy
// connection in test/load then waited 30 s for an answer that sat in its
// CQ.)
func TestWaitSeesWhatTheReaderPushed(t *testing.T) {
	cli, srv := pair(t, New(Options{}), New(Options{}), transport.Config{})
	cc := cli.(*conn)
	rbuf := mustAlloc(t, cli, 64, transport.AccessLocal)
	src := mustAlloc(t, srv, 64, transport.AccessLocal)
	if err := cli.PostRecv(transport.RecvWR{ID: 1, Buf: transport.Whole(rbuf)}); err != nil {
		t.Fatal(err)
	}
	pushed := make(chan struct{})
	var once sync.Once
	cc.hooks.Store(&testHooks{
		// The waiter found nothing; it takes the socket only once the
		// reader goroutine has delivered the SEND and let go of it.
		beforeTurn: func() { <-pushed },
		// The reader goroutine, having delivered it, stays away a while,
		// as a preempted goroutine would.
		afterUnlock: func() {
			if cc.own.ready() {
				once.Do(func() { close(pushed) })
				time.Sleep(50 * time.Millisecond)
			}
		},
	})
	t.Cleanup(func() { once.Do(func() { close(pushed) }) })
	time.AfterFunc(20*time.Millisecond, func() {
		_ = srv.Post(transport.SendWR{Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	var buf [4]transport.Completion
	n, err := cli.CQ().Wait(ctx, buf[:])
	if err != nil || n != 1 || buf[0].ID != 1 {
		t.Fatalf("Wait = %d, %v (%+v)", n, err, buf[:n])
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Wait returned the queued completion after %v: it went to read the socket with it queued", d)
	}
}
