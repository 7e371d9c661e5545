// Package conformance is the one test suite every transport provider must
// pass: the NIC semantics the protocol layer relies on (registration and
// handles, ordering, placement, protection, receiver-not-ready, length
// errors, flushes, queue depths, concurrency, completion queues).
//
// A provider's tests call Run with a pair of providers:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Env{
//			Client: soft.New(soft.Options{RNRTimeout: 200 * time.Millisecond}),
//			Server: soft.New(soft.Options{RNRTimeout: 200 * time.Millisecond}),
//			RNRTimeout: 200 * time.Millisecond,
//		})
//	}
package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// Env is what the suite runs against. Its zero durations pick defaults
// that suit a loopback TCP provider; a slow environment (a TCG guest
// running verbs, ~1 ms per round trip) raises Timeout.
type Env struct {
	// Client dials, Server listens. They may be the same provider, but
	// then their regions share one protection domain.
	Client, Server transport.Provider
	// Addr is where Server listens; "" means "127.0.0.1:0".
	Addr string
	// Config shapes both ends of every connection; the zero value is the
	// providers' defaults. Cases that need more (256 outstanding work
	// requests, a 4 MiB message) read the connection's Limits.
	Config transport.Config
	// RNRTimeout is how long the Client's SENDs wait for a receive at the
	// Server before failing with StatusRNRRetryExceeded, as configured in
	// the providers. Zero means 2 s (the software provider's default).
	RNRTimeout time.Duration
	// Timeout bounds every event the suite waits for beyond RNRTimeout
	// (a completion, a connection, a flush). Zero means 10 s.
	Timeout time.Duration
	// Skip names cases this provider legitimately differs on, with the
	// reason, which is printed. A name that is not a case fails the run.
	Skip map[string]string
	// Connected, when set, runs on every pair as it is connected, before
	// any work is posted: a sealed run keys both ends here
	// (transport.Seal with Lead on both, which is allowed before any frame
	// has crossed).
	Connected func(t *testing.T, cli, srv transport.Conn)
	// Reverse swaps the ends' roles in the cases: the connection the
	// Server accepted plays the client (it initiates the WRITEs and
	// SENDs), the Client's dialled one the server (its memory is the
	// target). For a provider whose dialling end shares its memory with
	// the listener (softrdma's same-host shared memory), this runs the
	// suite over that path.
	Reverse bool
}

// Case is one named check of the suite.
type Case struct {
	Name string
	// Doc says what the case proves, for the report and for readers.
	Doc string
	Run func(t *testing.T, e *Env)
}

// Cases returns the suite in the order Run runs it.
func Cases() []Case { return cases }

// Run runs every case as a subtest of t.
func Run(t *testing.T, env Env) {
	t.Helper()
	if env.Client == nil || env.Server == nil {
		t.Fatal("conformance: Env needs a Client and a Server provider")
	}
	if env.Addr == "" {
		env.Addr = "127.0.0.1:0"
	}
	if env.RNRTimeout == 0 {
		env.RNRTimeout = 2 * time.Second
	}
	if env.Timeout == 0 {
		env.Timeout = 10 * time.Second
	}
	known := map[string]bool{}
	for _, c := range cases {
		known[c.Name] = true
	}
	var unknown []string
	for name := range env.Skip {
		if !known[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		t.Errorf("conformance: Skip names unknown cases %q", unknown)
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			if why, ok := env.Skip[c.Name]; ok {
				t.Skipf("skipped for %s/%s: %s", env.Client.Name(), env.Server.Name(), why)
			}
			e := env
			c.Run(t, &e)
		})
	}
}

// pair connects a client to a fresh listener; both are closed at cleanup.
func (e *Env) pair(t *testing.T) (cli, srv transport.Conn) {
	t.Helper()
	ln, err := e.Server.Listen(e.Addr, e.Config)
	if err != nil {
		t.Fatalf("Listen(%s): %v", e.Addr, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	cli, srv = e.connect(t, ln)
	return cli, srv
}

func (e *Env) connect(t *testing.T, ln transport.Listener) (cli, srv transport.Conn) {
	t.Helper()
	cli, srv = Connect(t, e.Client, ln, ln.Addr(), e.Config, e.Timeout)
	if e.Reverse {
		cli, srv = srv, cli
	}
	if e.Connected != nil {
		e.Connected(t, cli, srv)
	}
	return cli, srv
}

// Connect dials addr through client while ln accepts, within timeout, and
// returns both ends, closed when the test ends; the test fails if either
// side fails. addr is ln's address, or a proxy's in front of it.
func Connect(tb testing.TB, client transport.Provider, ln transport.Listener, addr string, cfg transport.Config, timeout time.Duration) (cli, srv transport.Conn) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	type accepted struct {
		c   transport.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept(ctx)
		ch <- accepted{c, err}
	}()
	cli, err := client.Dial(ctx, addr, cfg)
	if err != nil {
		tb.Fatalf("Dial(%s): %v", addr, err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	a := <-ch
	if a.err != nil {
		tb.Fatalf("Accept: %v", a.err)
	}
	tb.Cleanup(func() { _ = a.c.Close() })
	return cli, a.c
}

// alloc registers n bytes in c's domain, filled with fill, deregistered at
// cleanup.
func alloc(t *testing.T, c transport.Conn, n int, access transport.Access, fill byte) transport.Region {
	t.Helper()
	r, err := c.Domain().Alloc(n, access)
	if err != nil {
		t.Fatalf("Alloc(%d, %v): %v", n, access, err)
	}
	if len(r.Bytes()) != n {
		t.Fatalf("Alloc(%d): Bytes has %d", n, len(r.Bytes()))
	}
	b := r.Bytes()
	for i := range b {
		b[i] = fill
	}
	t.Cleanup(func() { _ = r.Deregister() })
	return r
}

// collect waits for exactly n completions on c's CQ.
func (e *Env) collect(t *testing.T, c transport.Conn, n int) []transport.Completion {
	t.Helper()
	return e.collectWithin(t, c, n, e.Timeout)
}

func (e *Env) collectWithin(t *testing.T, c transport.Conn, n int, d time.Duration) []transport.Completion {
	t.Helper()
	got, err := e.tryCollect(c, n, d)
	if err != nil {
		t.Fatalf("%v (got %d of %d completions: %v)", err, len(got), n, got)
	}
	return got
}

func (e *Env) tryCollect(c transport.Conn, n int, d time.Duration) ([]transport.Completion, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	got := make([]transport.Completion, 0, n)
	buf := make([]transport.Completion, 16)
	for len(got) < n {
		k, err := c.CQ().Wait(ctx, buf[:min(len(buf), n-len(got))])
		got = append(got, buf[:k]...)
		if err != nil {
			return got, fmt.Errorf("CQ.Wait: %w", err)
		}
	}
	return got, nil
}

// wantNoMore checks that nothing else completes soon.
func wantNoMore(t *testing.T, c transport.Conn) {
	t.Helper()
	var buf [4]transport.Completion
	if n := c.CQ().Poll(buf[:]); n > 0 {
		t.Errorf("unexpected completions: %v", buf[:n])
	}
}

func want(t *testing.T, what string, got transport.Completion, id uint64, op transport.Op, st transport.Status) {
	t.Helper()
	if got.ID != id || got.Op != op || got.Status != st {
		t.Errorf("%s: completion {ID %d, %v, %v}, want {ID %d, %v, %v}", what, got.ID, got.Op, got.Status, id, op, st)
	}
}

// wantClosedAfterError checks that c is in error: what was posted before
// is done (the caller has collected it), nothing new can succeed, and
// after Close the CQ ends with ErrClosed.
func (e *Env) wantClosedAfterError(t *testing.T, c transport.Conn, side string, probe transport.Region) {
	t.Helper()
	err := c.PostRecv(transport.RecvWR{ID: 999, Buf: transport.Whole(probe)})
	if err == nil {
		got := e.collect(t, c, 1)
		want(t, side+" receive posted after the error", got[0], 999, transport.OpRecv, transport.StatusFlushed)
	}
	_ = c.Close()
	e.wantCQClosed(t, c, side)
}

func (e *Env) wantCQClosed(t *testing.T, c transport.Conn, side string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.Timeout)
	defer cancel()
	var buf [8]transport.Completion
	for {
		n, err := c.CQ().Wait(ctx, buf[:])
		if errors.Is(err, transport.ErrClosed) {
			return
		}
		if err != nil {
			t.Fatalf("%s: CQ.Wait after Close: %v, want ErrClosed", side, err)
		}
		for _, comp := range buf[:n] {
			if comp.Status == transport.StatusSuccess {
				t.Errorf("%s: successful completion after the connection failed: %+v", side, comp)
			}
		}
	}
}

// sendsFirst orders send-queue completions before receive-queue ones,
// keeping each queue's order: the two queues' relative order is free.
func sendsFirst(cs []transport.Completion) []transport.Completion {
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].Op != transport.OpRecv && cs[j].Op == transport.OpRecv })
	return cs
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>8)
	}
	return b
}

// wantBytes checks that b equals want, reporting the first difference.
func wantBytes(t *testing.T, what string, b, want []byte) {
	t.Helper()
	if bytes.Equal(b, want) {
		return
	}
	if len(b) != len(want) {
		t.Errorf("%s: %d bytes, want %d", what, len(b), len(want))
		return
	}
	for i := range b {
		if b[i] != want[i] {
			t.Errorf("%s: first difference at byte %d: %#x, want %#x", what, i, b[i], want[i])
			return
		}
	}
}

// wantFilled checks that every byte of b is fill.
func wantFilled(t *testing.T, what string, b []byte, fill byte) {
	t.Helper()
	for i, x := range b {
		if x != fill {
			t.Errorf("%s: byte %d is %#x, want untouched %#x", what, i, x, fill)
			return
		}
	}
}

// WaitOK waits for completions on c's queue into comps and returns those
// that came; an error from Wait or in any completion fails the test (a
// benchmark's loop, where every work request must succeed).
func WaitOK(ctx context.Context, tb testing.TB, c transport.Conn, comps []transport.Completion) []transport.Completion {
	tb.Helper()
	n, err := c.CQ().Wait(ctx, comps)
	if err != nil {
		tb.Fatal(err)
	}
	for _, wc := range comps[:n] {
		if wc.Status != transport.StatusSuccess {
			tb.Fatal(wc.Err())
		}
	}
	return comps[:n]
}
