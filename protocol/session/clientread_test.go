package session

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestCallersReadTheirOwnAnswers: at queue depth 1 the caller reads its
// answer from the socket itself (no hand-off from the reader goroutine),
// but for the first after an idle spell. The reader goroutine steps aside
// for an hour, not readYield: a round trip longer than the real
// millisecond (the test descheduled on a busy machine) would give it the
// socket back and its next answer would be handed over, so only the first
// answer may be.
func TestCallersReadTheirOwnAnswers(t *testing.T) {
	e := newEnv(t)
	e.writeFile("f", "x")
	tr := e.tree("data")
	longYield(tr.c)
	ctx := ctxT(t)
	before := tr.c.ownReads.Load()
	const n = 200
	for range n {
		if _, err := tr.GetAttr(ctx, "f"); err != nil {
			t.Fatal(err)
		}
	}
	if got := tr.c.ownReads.Load() - before; got < n-1 {
		t.Errorf("%d of %d answers read by their caller, want at least %d", got, n, n-1)
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
// sends afterwards, unasked, is still read (by the next caller's turn).
func TestTurnCutShortMidFrame(t *testing.T) {
	key := []byte("0123456789abcdef")
	c, srv, ids := pipeServer(t, key)
	// The reader goroutine steps aside for good after the first call (not
	// for the real millisecond, which a descheduled test outlasts, and the
	// reader takes the socket back before A can take a turn).
	longYield(c)
	readerHolds(t, c) // else the first caller may read its own answer, and the reader hold on
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
	got := make(chan LeaseBreak, 1)
	onBreaks(c, func(b LeaseBreak) LeaseState { got <- b; return 0 })
	// The next caller's turn (the reader goroutine is still stepping
	// aside) reads A's late answer, dropped, and a LEASE_BREAK, unasked,
	// before its own answer.
	go func() { _, err := echo(ctx); done <- err }()
	id := <-ids
	srv.Write(echoAnswer(idA, 0, key))
	srv.Write(breakFrame(5, key, 8))
	srv.Write(echoAnswer(id, 0, key))
	if err := <-done; err != nil {
		t.Fatalf("after the cut turn: %v", err)
	}
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

// longYield makes the reader goroutine's step aside after waking a caller
// last an hour, so that a test hangs where a caller's answer waits for the
// yield to end (rather than for a millisecond nobody can measure).
func longYield(c *Client) { c.yield.Store(int64(time.Hour)) }

// readerHolds waits until the reader goroutine holds the read token (no
// caller does: the test has none yet).
func readerHolds(t *testing.T, c *Client) {
	eventually(t, "the reader goroutine reading", func() bool {
		if c.rdMu.TryLock() {
			c.rdMu.Unlock()
			return false
		}
		return true
	})
}

// onBreaks routes the LEASE_BREAKs of tree 1 to fn.
func onBreaks(c *Client, fn func(LeaseBreak) LeaseState) {
	c.mu.Lock()
	c.breakTo = map[uint32]func(LeaseBreak) LeaseState{1: fn}
	c.mu.Unlock()
}

// handedOver makes one ECHO round trip whose answer the test (the server)
// writes once the request has come: with the reader goroutine holding the
// socket, it reads the answer, hands it over and steps aside.
func handedOver(t *testing.T, c *Client, srv net.Conn, ids chan uint64, key []byte) {
	t.Helper()
	first := make(chan error, 1)
	go func() { _, err := c.roundTrip(ctxT(t), CmdEcho, 0, &empty{}, &empty{}); first <- err }()
	srv.Write(echoAnswer(<-ids, 0, key))
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// within returns what comes on ch, failing t when nothing has within 5 s:
// then what hangs.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("%s hangs", what)
		panic("unreachable")
	}
}

// TestReaderWakesOneOfTwoWaiting: two callers wait while the reader
// goroutine holds the socket; the answer it reads wakes one, and it steps
// aside. The other caller's answer, which comes next, must not wait for
// the reader's step aside to end: the socket is handed to the caller still
// waiting.
func TestReaderWakesOneOfTwoWaiting(t *testing.T) {
	key := []byte("0123456789abcdef")
	c, srv, ids := pipeServer(t, key)
	longYield(c)
	ctx := ctxT(t)
	readerHolds(t, c)
	type res struct {
		h   Header
		err error
	}
	done := make(chan res, 2)
	for range 2 {
		go func() {
			h, err := c.roundTrip(ctx, CmdEcho, 0, &empty{}, &empty{})
			done <- res{h, err}
		}()
	}
	id1, id2 := <-ids, <-ids
	eventually(t, "both callers waiting", func() bool { return c.waiting.Load() == 2 })
	srv.Write(echoAnswer(id1, 0, key))
	if r := <-done; r.err != nil || r.h.MessageID != id1 {
		t.Fatalf("first answer: %+v, %v", r.h, r.err)
	}
	go srv.Write(echoAnswer(id2, 0, key))
	// It sat unread while the reader goroutine stepped aside.
	if r := within(t, done, "the second caller"); r.err != nil || r.h.MessageID != id2 {
		t.Fatalf("second answer: %+v, %v", r.h, r.err)
	}
}

// TestYieldEndsAfterClockStep: the wall clock stepped back (an NTP
// correction) since the last turn: the reader goroutine's step aside still
// ends after readYield, and a LEASE_BREAK the server sends unasked while no
// caller reads is read.
func TestYieldEndsAfterClockStep(t *testing.T) {
	key := []byte("0123456789abcdef")
	c, srv, ids := pipeServer(t, key)
	ctx := ctxT(t)
	got := make(chan LeaseBreak, 1)
	onBreaks(c, func(b LeaseBreak) LeaseState { got <- b; return 0 })
	readerHolds(t, c)
	done := make(chan error, 1)
	go func() { _, err := c.roundTrip(ctx, CmdEcho, 0, &empty{}, &empty{}); done <- err }()
	id := <-ids
	eventually(t, "the caller waiting", func() bool { return c.waiting.Load() == 1 })
	// The last turn ended an hour ahead of what the clock now reads.
	c.lastTurn.Store(time.Now().Add(time.Hour).UnixNano())
	srv.Write(echoAnswer(id, 0, key)) // read by the reader goroutine, which steps aside
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	go srv.Write(breakFrame(5, key, 8))
	// Unread while the reader goroutine still steps aside.
	if b := within(t, got, "reading a LEASE_BREAK"); b.Ino != 8 {
		t.Errorf("break %+v", b)
	}
}

// TestBreakHandlerCallsDuringTurn: a LEASE_BREAK read by a caller on its
// turn, whose handler itself sends a request and waits for its answer
// (and the break wants an ack): the handler's call, the ack and the
// caller's own answer all complete — the handler does not run on the
// caller's turn.
func TestBreakHandlerCallsDuringTurn(t *testing.T) {
	key := []byte("0123456789abcdef")
	c, srv, ids := pipeServer(t, key)
	ctx := ctxT(t)
	handedOver(t, c, srv, ids, key) // the next caller reads
	handled := make(chan error, 1)
	onBreaks(c, func(b LeaseBreak) LeaseState {
		_, err := c.roundTrip(ctx, CmdEcho, 0, &empty{}, &empty{})
		handled <- err
		return 0
	})
	aDone := make(chan error, 1)
	go func() { _, err := c.roundTrip(ctx, CmdEcho, 0, &empty{}, &empty{}); aDone <- err }()
	idA := <-ids
	raw := breakFrame(5, key, 8)
	// Ask for the ack.
	f, _ := DecodeFrame(raw)
	var m leaseBreakMsg
	if err := unmarshal(f.Body, &m); err != nil {
		t.Fatal(err)
	}
	m.Flags |= leaseBreakAckRequired
	raw = AppendFrame(nil, f.Header, marshal(&m))
	signFrame(key, raw)
	srv.Write(raw)
	idH := <-ids // the handler's ECHO
	srv.Write(echoAnswer(idH, 0, key))
	if err := within(t, handled, "the break handler's call"); err != nil {
		t.Fatal(err)
	}
	<-ids // the LEASE_ACK
	srv.Write(echoAnswer(idA, 0, key))
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
}

// TestCloseLeavesNoGoroutines: callers in every state — reading the socket
// on their turn, waiting for another's read, with and without a deadline,
// one given up — and then Close: every goroutine of the client ends.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	key := []byte("0123456789abcdef")
	before := runtime.NumGoroutine()
	c, srv, ids := pipeServer(t, key)
	ctx := ctxT(t)
	errs := make(chan error, 8)
	for i := range 6 {
		go func() {
			cctx := ctx
			switch i {
			case 0:
				cctx = context.Background()
			case 1:
				var cancel context.CancelFunc
				cctx, cancel = context.WithTimeout(ctx, 10*time.Millisecond)
				defer cancel()
			}
			_, err := c.roundTrip(cctx, CmdEcho, 0, &empty{}, &empty{})
			errs <- err
		}()
	}
	for range 6 {
		<-ids
	}
	eventually(t, "one caller given up", func() bool { return len(errs) == 1 })
	c.Close()
	for range 6 {
		within(t, errs, "a caller after Close")
	}
	srv.Close()
	eventually(t, "the client's goroutines ended", func() bool { return runtime.NumGoroutine() <= before })
}

// TestHostileFrameOnATurn: what a hostile server sends is judged the same
// whoever reads it — here a caller on its turn, with another caller
// waiting: a response to no request in flight (a replay), a request frame,
// a bad signature, an unsigned frame on a signed session, a sealed frame
// on a session without sealing keys and a Length beyond MaxFrameSize each
// end the connection, and both callers get the connection's error.
func TestHostileFrameOnATurn(t *testing.T) {
	key := []byte("0123456789abcdef")
	signed := func(h Header, k []byte) []byte {
		raw := AppendFrame(nil, h, nil)
		signFrame(k, raw)
		return raw
	}
	huge := AppendFrame(nil, Header{Flags: FlagResponse}, nil)
	binary.LittleEndian.PutUint32(huge, MaxFrameSize+1)
	for _, tc := range []struct {
		name  string
		frame func(idA uint64) []byte
		want  error
	}{
		{"replay", func(uint64) []byte { return echoAnswer(1000, 0, key) }, ErrReplay},
		{"request", func(id uint64) []byte { return signed(Header{MessageID: id, Command: CmdEcho}, key) }, nil},
		{"forged", func(id uint64) []byte {
			return signed(Header{MessageID: id, Command: CmdEcho, Flags: FlagResponse}, []byte("another key....."))
		}, ErrBadSignature},
		{"unsigned", func(id uint64) []byte {
			return AppendFrame(nil, Header{MessageID: id, Command: CmdEcho, Flags: FlagResponse}, nil)
		}, ErrUnsigned},
		{"sealed", func(id uint64) []byte {
			return AppendFrame(nil, Header{MessageID: id, Command: CmdEcho, Flags: FlagResponse | FlagSealed}, make([]byte, 40))
		}, ErrBadSeal},
		{"huge", func(uint64) []byte { return huge }, ErrFrameTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, srv, ids := pipeServer(t, key)
			longYield(c)
			readerHolds(t, c)
			ctx := ctxT(t)
			echo := func() error { _, err := c.roundTrip(ctx, CmdEcho, 0, &empty{}, &empty{}); return err }
			handedOver(t, c, srv, ids, key)
			done := make(chan error, 2)
			go func() { done <- echo() }()
			idA := <-ids
			eventually(t, "A reading the socket", func() bool { return inTurnRead(c) })
			go func() { done <- echo() }()
			<-ids
			eventually(t, "B waiting", func() bool { return c.waiting.Load() == 1 })
			go srv.Write(tc.frame(idA))
			for range 2 {
				if err := within(t, done, "a caller after a hostile frame"); !errors.Is(err, ErrClosed) {
					t.Errorf("caller: %v, want a connection error", err)
				}
			}
			if err := c.Err(); err == nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("Err = %v, want %v", err, tc.want)
			}
		})
	}
}
