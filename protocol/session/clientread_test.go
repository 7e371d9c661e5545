package session

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestCallersReadTheirOwnAnswers: at queue depth 1 the caller reads its
// answer from the socket itself (no hand-off from the reader goroutine),
// but for the first after an idle spell.
func TestCallersReadTheirOwnAnswers(t *testing.T) {
	e := newEnv(t)
	e.writeFile("f", "x")
	tr := e.tree("data")
	ctx := ctxT(t)
	before := tr.c.ownReads.Load()
	const n = 200
	for range n {
		if _, err := tr.GetAttr(ctx, "f"); err != nil {
			t.Fatal(err)
		}
	}
	// A spell longer than readYield (a descheduled test) gives the socket
	// back to the reader goroutine, whose next answer is handed over.
	if got := tr.c.ownReads.Load() - before; got < n/2 {
		t.Errorf("%d of %d answers read by their caller", got, n)
	}
}

// pipeServer is a client whose session is set up by hand with key, over a
// pipe whose other end the test plays as the server: the ids of the
// requests it reads come on the channel (while it has room).
func pipeServer(t *testing.T, key []byte) (*Client, net.Conn, chan uint64) {
	a, b := net.Pipe()
	t.Cleanup(func() { b.Close() })
	c := newClient(a, ClientConfig{})
	t.Cleanup(func() { c.Close() })
	c.key.Store(&key)
	c.macs.Store(newMACs(key))
	c.signing.Store(true)
	ids := make(chan uint64, 64)
	go func() {
		for {
			f, _, err := ReadFrame(b)
			if err != nil {
				return
			}
			select {
			case ids <- f.MessageID:
			default: // nobody asks: discard, as a server that does not answer
			}
		}
	}()
	return c, b, ids
}

func echoAnswer(id uint64, tree uint32, key []byte) []byte {
	raw := AppendFrame(nil, Header{MessageID: id, Command: CmdEcho, Flags: FlagResponse, TreeID: tree}, nil)
	signFrame(key, raw)
	return raw
}

func inTurnRead(c *Client) bool { return c.intr.Reading() }

// TestTurnCutShortMidFrame: a caller reading the socket whose context ends
// while half of another caller's answer has come leaves that half for the
// next reader: the other caller gets its answer whole, the connection
// stays up (no read deadline left behind), and a LEASE_BREAK the server
// sends afterwards, unasked, is still read.
func TestTurnCutShortMidFrame(t *testing.T) {
	key := []byte("0123456789abcdef")
	c, srv, ids := pipeServer(t, key)
	ctx := ctxT(t)
	echo := func(ctx context.Context) (Header, error) {
		return c.roundTrip(ctx, CmdEcho, 0, &empty{}, &empty{})
	}
	// A first call: the reader goroutine hands its answer over and leaves
	// the socket to the callers that come next.
	done := make(chan error, 1)
	go func() { _, err := echo(ctx); done <- err }()
	srv.Write(echoAnswer(<-ids, 0, key))
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	ctxA, cancelA := context.WithCancel(ctx)
	aDone := make(chan error, 1)
	go func() { _, err := echo(ctxA); aDone <- err }()
	idA := <-ids
	eventually(t, "A reading the socket", func() bool { return inTurnRead(c) })
	type res struct {
		h   Header
		err error
	}
	bDone := make(chan res, 1)
	go func() { h, err := echo(ctx); bDone <- res{h, err} }()
	idB := <-ids
	answerB := echoAnswer(idB, 7, key)
	srv.Write(answerB[:30]) // a pipe's write returns once A has read it
	eventually(t, "A waiting for the rest", func() bool { return inTurnRead(c) })
	cancelA()
	if err := <-aDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("A: %v, want context.Canceled", err)
	}
	srv.Write(answerB[30:])
	r := <-bDone
	if r.err != nil || r.h.MessageID != idB || r.h.TreeID != 7 {
		t.Fatalf("B: %+v, %v", r.h, r.err)
	}
	srv.Write(echoAnswer(idA, 0, key)) // A's late answer: dropped
	go func() { _, err := echo(ctx); done <- err }()
	srv.Write(echoAnswer(<-ids, 0, key))
	if err := <-done; err != nil {
		t.Fatalf("after the cut turn: %v", err)
	}
	got := make(chan LeaseBreak, 1)
	c.mu.Lock()
	c.breakTo = map[uint32]func(LeaseBreak) LeaseState{1: func(b LeaseBreak) LeaseState { got <- b; return 0 }}
	c.mu.Unlock()
	srv.Write(breakFrame(5, key, 8))
	if b := nextBreak(t, got); b.Ino != 8 {
		t.Errorf("break %+v", b)
	}
	if err := c.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestManyCallersBreaksAndDrop: many callers on one session, each asking
// for its own file, while another session's writes break this one's lease
// over and over (the breaks arrive unasked, amid the answers, and are
// acknowledged); then the server side of the connection is cut in the
// middle of it. No answer reaches the wrong caller, and every caller
// returns, failed with the connection, rather than hang.
func TestManyCallersBreaksAndDrop(t *testing.T) {
	e, trees, _ := leaseEnv(t, 2)
	a, b := trees[0], trees[1]
	ctx := ctxT(t)
	const callers = 16
	for i := range callers {
		e.writeFile(fmt.Sprintf("f%d", i), string(make([]byte, i+1)))
	}
	e.writeFile("L", "x")
	var broken atomic.Int64
	a.OnLeaseBreak(func(br LeaseBreak) LeaseState { broken.Add(1); return br.New })
	b.OnLeaseBreak(func(br LeaseBreak) LeaseState { return br.New })

	var stop atomic.Bool
	var calls atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers+1)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				attr, err := a.GetAttr(ctx, fmt.Sprintf("f%d", i))
				if err != nil {
					errs <- err
					return
				}
				if attr.Size != uint64(i+1) {
					errs <- fmt.Errorf("caller %d got the attributes of a file of %d bytes", i, attr.Size)
					return
				}
				calls.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if _, _, err := a.Lease(ctx, "L", LeaseRead|LeaseHandle); err != nil {
				errs <- err
				return
			}
			h, _, _, err := b.OpenLease(ctx, "L", syscall.O_WRONLY, 0, 0)
			if err != nil {
				errs <- fmt.Errorf("writer: %w", err)
				return
			}
			b.CloseHandle(ctx, h)
		}
	}()
	eventually(t, "breaks amid the answers", func() bool { return broken.Load() >= 20 && calls.Load() >= 500 })
	t.Logf("%d breaks, %d calls before the cut", broken.Load(), calls.Load())
	// Cut a's connection on the server side.
	e.srv.mu.Lock()
	for sc := range e.srv.conns {
		if ss := sc.sess.Load(); ss != nil && ss.id == a.c.SessionID() {
			sc.nc.Close()
		}
	}
	e.srv.mu.Unlock()
	stop.Store(true)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("callers hang after the connection was cut")
	}
	close(errs)
	for err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("caller: %v, want a connection error", err)
		}
	}
	if _, err := a.GetAttr(ctx, "f0"); !errors.Is(err, ErrClosed) {
		t.Errorf("after the cut: %v", err)
	}
}

// TestGivenUpCallsMisrouteNothing: callers that give up before their
// answer (its late arrival is dropped) amid callers that wait: no answer
// reaches a call it is not for — the channel of a call given up is never
// used again, while the late answer may still be sent to it.
func TestGivenUpCallsMisrouteNothing(t *testing.T) {
	e := newEnv(t)
	const callers = 8
	for i := range callers {
		e.writeFile(fmt.Sprintf("f%d", i), string(make([]byte, i+1)))
	}
	tr := e.tree("data")
	ctx := ctxT(t)
	var gaveUp, answered atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 2*callers)
	for i := range 2 * callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("f%d", i%callers)
			for n := 0; n < 300; n++ {
				cctx, cancel := ctx, context.CancelFunc(func() {})
				if i >= callers {
					// Give up after a few µs: often before the answer.
					cctx, cancel = context.WithTimeout(ctx, time.Duration(n%20)*time.Microsecond)
				}
				attr, err := tr.GetAttr(cctx, name)
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					gaveUp.Add(1)
				case err != nil:
					errs <- err
					return
				case attr.Size != uint64(i%callers+1):
					errs <- fmt.Errorf("%s: the attributes of a file of %d bytes", name, attr.Size)
					return
				default:
					answered.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d answered, %d given up", answered.Load(), gaveUp.Load())
	if gaveUp.Load() == 0 {
		t.Error("no call gave up: the test did not test it")
	}
}
