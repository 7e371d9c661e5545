package soft

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
)

// testRNR keeps the receiver-not-ready cases quick.
const testRNR = 200 * time.Millisecond

// twoProviders is the suite's environment with each end in a provider of
// its own, as a client and a server on two hosts.
func twoProviders() conformance.Env {
	opts := Options{RNRTimeout: testRNR}
	return conformance.Env{Client: New(opts), Server: New(opts), RNRTimeout: testRNR}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, twoProviders())
}

// TestConformanceOneProvider runs the suite with both ends in one
// provider, hence one protection domain, as a server talking to itself.
func TestConformanceOneProvider(t *testing.T) {
	if testing.Short() {
		t.Skip("the two-provider run covers -short")
	}
	p := New(Options{RNRTimeout: testRNR})
	conformance.Run(t, conformance.Env{Client: p, Server: p, RNRTimeout: testRNR})
}

// pair connects two providers over loopback.
func pair(t testing.TB, cp, sp *Provider, cfg transport.Config) (cli, srv transport.Conn) {
	t.Helper()
	return pairVia(t, cp, sp, cfg, func(addr string) string { return addr })
}

// pairVia is pair with the client dialling via(the listener's address): a
// proxy in between.
func pairVia(t testing.TB, cp, sp *Provider, cfg transport.Config, via func(string) string) (cli, srv transport.Conn) {
	t.Helper()
	ln, err := sp.Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return conformance.Connect(t, cp, ln, via(ln.Addr()), cfg, 10*time.Second)
}

func mustAlloc(t testing.TB, c transport.Conn, n int, acc transport.Access) transport.Region {
	t.Helper()
	r, err := c.Domain().Alloc(n, acc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Deregister() })
	return r
}

func waitOne(t testing.TB, c transport.Conn, d time.Duration) transport.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var buf [1]transport.Completion
	if _, err := c.CQ().Wait(ctx, buf[:]); err != nil {
		t.Fatalf("CQ.Wait: %v", err)
	}
	return buf[0]
}

func TestDomainIsPerProvider(t *testing.T) {
	p := New(Options{})
	cli, srv := pair(t, New(Options{}), p, transport.Config{})
	if srv.Domain() != p.Domain() {
		t.Error("an accepted connection's Domain is not the provider's")
	}
	if cli.Domain() == srv.Domain() {
		t.Error("two providers share a domain")
	}
	// Memory of another domain is refused at Post.
	foreign := mustAlloc(t, srv, 64, transport.AccessLocal)
	if err := cli.Post(transport.SendWR{Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(foreign)}}); err == nil {
		t.Error("Post with another domain's memory succeeded")
	}
	if err := cli.PostRecv(transport.RecvWR{Buf: transport.Whole(foreign)}); err == nil {
		t.Error("PostRecv with another domain's memory succeeded")
	}
	local := mustAlloc(t, cli, 64, transport.AccessLocal)
	if err := cli.Post(transport.SendWR{Op: transport.OpSend, SGL: []transport.Segment{{Region: local, Offset: 60, Length: 8}}}); err == nil {
		t.Error("Post with a segment past its region succeeded")
	}
	if err := cli.Post(transport.SendWR{Op: transport.OpRecv}); err == nil {
		t.Error("Post of OpRecv succeeded")
	}
}

// TestRNRTimeoutIsTheInitiators: the wait a SEND gets at the peer is the
// sender's RNRTimeout, learnt in the hello, whatever the receiver's is.
func TestRNRTimeoutIsTheInitiators(t *testing.T) {
	cli, _ := pair(t, New(Options{RNRTimeout: 50 * time.Millisecond}), New(Options{RNRTimeout: time.Hour}), transport.Config{})
	src := mustAlloc(t, cli, 8, transport.AccessLocal)
	start := time.Now()
	if err := cli.Post(transport.SendWR{ID: 1, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}); err != nil {
		t.Fatal(err)
	}
	c := waitOne(t, cli, 10*time.Second)
	if c.Status != transport.StatusRNRRetryExceeded {
		t.Fatalf("completion %+v", c)
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > 5*time.Second {
		t.Errorf("RNR failure after %v, want about 50ms", d)
	}
}

// TestAckWithoutReply: the ACK for a SEND is deferred to ride on a reply,
// but it must come even if the receiving application never answers, nor
// even looks at its CQ.
func TestAckWithoutReply(t *testing.T) {
	cli, srv := pair(t, New(Options{}), New(Options{}), transport.Config{})
	buf := mustAlloc(t, srv, 64, transport.AccessLocal)
	if err := srv.PostRecv(transport.RecvWR{ID: 1, Buf: transport.Whole(buf)}, transport.RecvWR{ID: 2, Buf: transport.Whole(buf)}); err != nil {
		t.Fatal(err)
	}
	src := mustAlloc(t, cli, 64, transport.AccessLocal)
	for i := uint64(1); i <= 2; i++ {
		start := time.Now()
		if err := cli.Post(transport.SendWR{ID: i, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}); err != nil {
			t.Fatal(err)
		}
		if c := waitOne(t, cli, 5*time.Second); c.ID != i || c.Status != transport.StatusSuccess {
			t.Fatalf("completion %+v", c)
		}
		t.Logf("SEND %d acknowledged after %v with the receiver idle", i, time.Since(start))
	}
	// The receiver's completions are all there when it does look.
	var out [4]transport.Completion
	if n := srv.CQ().Poll(out[:]); n != 2 {
		t.Fatalf("receiver has %d completions, want 2", n)
	}
}

// TestNoGoroutineLeak: closed connections and listeners leave nothing
// running.
func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		cp, sp := New(Options{}), New(Options{})
		ln, err := sp.Listen("127.0.0.1:0", transport.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for i := 0; i < 10; i++ {
			cli, err := cp.Dial(ctx, ln.Addr(), transport.Config{})
			if err != nil {
				t.Fatal(err)
			}
			srv, err := ln.Accept(ctx)
			if err != nil {
				t.Fatal(err)
			}
			src := mustAlloc(t, cli, 8, transport.AccessLocal)
			_ = cli.Post(transport.SendWR{Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}) // RNR-waiting at close
			if i%2 == 0 {
				cli.Close()
			} else {
				srv.Close()
			}
			drain(t, cli)
			drain(t, srv)
		}
		ln.Close()
	}()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines before, %d after:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}
