package verbs

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
)

// waitN waits until c's completion queue has given n completions and
// returns them; an error from Wait fails the test.
func waitN(ctx context.Context, t testing.TB, c transport.Conn, n int) []transport.Completion {
	t.Helper()
	var got []transport.Completion
	buf := make([]transport.Completion, n)
	for len(got) < n {
		k, err := c.CQ().Wait(ctx, buf[:n-len(got)])
		if err != nil {
			t.Fatalf("Wait: %v (have %v)", err, got)
		}
		got = append(got, buf[:k]...)
	}
	return got
}

// TestSmoke is the provider's own end-to-end check, independent of the
// conformance suite: connect, SEND/receive, RDMA WRITE WITH IMMEDIATE,
// a plain WRITE ordered before a SEND, a wrong rkey, and the flush on Close.
func TestSmoke(t *testing.T) {
	addr := usable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srvP, cliP := New(Options{}), New(Options{})
	ln, err := srvP.Listen(addr, transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Logf("listening on %s", ln.Addr())
	type res struct {
		c   transport.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(ctx); ch <- res{c, err} }()
	t0 := time.Now()
	cli, err := cliP.Dial(ctx, ln.Addr(), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	srv := r.c
	defer srv.Close()
	t.Logf("connected %s -> %s in %v", cli.LocalAddr(), cli.RemoteAddr(), time.Since(t0))

	sbuf, err := cli.Domain().Alloc(4096, transport.AccessLocal)
	if err != nil {
		t.Fatal(err)
	}
	rbuf, err := srv.Domain().Alloc(4096, transport.AccessLocal)
	if err != nil {
		t.Fatal(err)
	}
	target, err := srv.Domain().Alloc(65536, transport.AccessLocal|transport.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	wait := func(c transport.Conn, n int) []transport.Completion { return waitN(ctx, t, c, n) }

	// SEND into a posted receive.
	if err := srv.PostRecv(
		transport.RecvWR{ID: 10, Buf: transport.Segment{Region: rbuf, Offset: 0, Length: 1024}},
		transport.RecvWR{ID: 11, Buf: transport.Segment{Region: rbuf, Offset: 1024, Length: 1024}},
		transport.RecvWR{ID: 12, Buf: transport.Segment{Region: rbuf, Offset: 2048, Length: 1024}},
	); err != nil {
		t.Fatal(err)
	}
	copy(sbuf.Bytes(), "hello, verbs")
	t1 := time.Now()
	if err := cli.Post(transport.SendWR{ID: 1, Op: transport.OpSend, SGL: []transport.Segment{{Region: sbuf, Length: 12}}}); err != nil {
		t.Fatal(err)
	}
	if c := wait(cli, 1)[0]; c.ID != 1 || c.Op != transport.OpSend || c.Err() != nil {
		t.Fatalf("send completion %+v", c)
	}
	c := wait(srv, 1)[0]
	if c.ID != 10 || c.Op != transport.OpRecv || c.Err() != nil || c.Len != 12 || string(rbuf.Bytes()[:12]) != "hello, verbs" {
		t.Fatalf("recv completion %+v, data %q", c, rbuf.Bytes()[:12])
	}
	t.Logf("SEND round: %v", time.Since(t1))

	// RDMA WRITE WITH IMMEDIATE.
	for i := range sbuf.Bytes() {
		sbuf.Bytes()[i] = byte(i)
	}
	if err := cli.Post(transport.SendWR{ID: 2, Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(sbuf)},
		RemoteAddr: target.Addr() + 100, RKey: target.Handle(), Imm: 0xdeadbeef, HasImm: true}); err != nil {
		t.Fatal(err)
	}
	if c := wait(cli, 1)[0]; c.ID != 2 || c.Op != transport.OpWrite || c.Err() != nil {
		t.Fatalf("write completion %+v", c)
	}
	c = wait(srv, 1)[0]
	if c.ID != 11 || c.Op != transport.OpRecv || c.Err() != nil || !c.HasImm || c.Imm != 0xdeadbeef {
		t.Fatalf("write-imm recv completion %+v", c)
	}
	for i := 0; i < 4096; i++ {
		if target.Bytes()[100+i] != byte(i) {
			t.Fatalf("written byte %d = %d", i, target.Bytes()[100+i])
		}
	}
	if target.Bytes()[99] != 0 || target.Bytes()[100+4096] != 0 {
		t.Fatal("write spilled outside its range")
	}

	// A plain WRITE then a SEND in one chain: the SEND's arrival proves the
	// WRITE landed first.
	copy(sbuf.Bytes(), "ordered!")
	if err := cli.Post(
		transport.SendWR{ID: 3, Op: transport.OpWrite, SGL: []transport.Segment{{Region: sbuf, Length: 8}},
			RemoteAddr: target.Addr(), RKey: target.Handle()},
		transport.SendWR{ID: 4, Op: transport.OpSend, SGL: []transport.Segment{{Region: sbuf, Length: 8}}},
	); err != nil {
		t.Fatal(err)
	}
	cs := wait(cli, 2)
	if cs[0].ID != 3 || cs[1].ID != 4 || cs[0].Err() != nil || cs[1].Err() != nil {
		t.Fatalf("chain completions %+v", cs)
	}
	if c := wait(srv, 1)[0]; c.ID != 12 || c.Err() != nil || string(target.Bytes()[:8]) != "ordered!" {
		t.Fatalf("chain recv %+v, target %q", c, target.Bytes()[:8])
	}

	// A wrong rkey fails with a remote access error.
	if err := cli.Post(transport.SendWR{ID: 5, Op: transport.OpWrite, SGL: []transport.Segment{{Region: sbuf, Length: 8}},
		RemoteAddr: target.Addr(), RKey: target.Handle() ^ 0x10101}); err != nil {
		t.Fatal(err)
	}
	if c := wait(cli, 1)[0]; c.ID != 5 || c.Status != transport.StatusRemoteAccess {
		t.Fatalf("bad-rkey completion %+v, want remote access error", c)
	}

	// Close flushes what the server still has posted, then ErrClosed.
	if err := srv.PostRecv(transport.RecvWR{ID: 20, Buf: transport.Segment{Region: rbuf, Length: 64}}); err != nil &&
		!errors.Is(err, transport.ErrClosed) {
		t.Fatal(err)
	}
	srv.Close()
	got := conformance.Drain(t, srv, 30*time.Second)
	for _, c := range got {
		if c.Status != transport.StatusFlushed {
			t.Errorf("after Close: %+v, want flushed", c)
		}
	}
	t.Logf("after Close: %d flushed completions, then ErrClosed", len(got))
}

// TestDialNotRDMA: an address no RDMA device carries fails promptly with an
// error naming the address and rdma_cm's reason.
func TestDialNotRDMA(t *testing.T) {
	usable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	c, err := New(Options{}).Dial(ctx, "127.0.0.1:9", transport.Config{})
	if err == nil {
		c.Close()
		t.Fatal("Dial to 127.0.0.1 (no RDMA device) succeeded")
	}
	t.Logf("Dial 127.0.0.1:9 after %v: %v", time.Since(t0), err)
	if !strings.Contains(err.Error(), "127.0.0.1:9") {
		t.Errorf("error %q does not name the address", err)
	}
}

// TestListenAny: a listener on the unspecified address accepts on the
// device that carries the dialled address.
func TestListenAny(t *testing.T) {
	addr := usable(t)
	ip, _, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ln, err := New(Options{}).Listen("0.0.0.0:0", transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr())
	ch := make(chan error, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err == nil {
			defer c.Close()
			if c.LocalAddr() != net.JoinHostPort(ip, port) {
				err = errors.New("accepted conn's LocalAddr is " + c.LocalAddr())
			}
		}
		ch <- err
	}()
	c, err := New(Options{}).Dial(ctx, net.JoinHostPort(ip, port), transport.Config{})
	if err != nil {
		t.Fatalf("Dial %s:%s to a listener on %s: %v", ip, port, ln.Addr(), err)
	}
	defer c.Close()
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
	t.Logf("listener %s accepted %s -> %s", ln.Addr(), c.LocalAddr(), c.RemoteAddr())
}
