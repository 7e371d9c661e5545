package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

var cases = []Case{
	{"ConnInfo", "a connection reports its provider, addresses, domain and limits", connInfo},
	{"Registration", "regions get distinct, unguessable handles and stable, disjoint addresses; deregistration is once", registration},
	{"SendRecvOrder", "SENDs land in posted receives in order, with their lengths and immediates; completions in order", sendRecvOrder},
	{"SendGather", "a SEND gathers several segments of several regions", sendGather},
	{"WritePlacement", "an RDMA WRITE places exactly its bytes at the named address and touches nothing else", writePlacement},
	{"WriteImm", "RDMA WRITE WITH IMMEDIATE places its bytes and consumes a receive that carries the immediate", writeImm},
	{"WriteImmOrder", "SENDs and WRITEs WITH IMMEDIATE consume receives in the order they were posted", writeImmOrder},
	{"LargeWrite", "a 4 MiB RDMA WRITE lands whole", largeWrite},
	{"ProtectionWrongHandle", "a WRITE naming an unknown handle fails with a remote access error, both ends in error", protWrongHandle},
	{"ProtectionOutOfBounds", "a WRITE running past the region's end fails with a remote access error", protPastEnd},
	{"ProtectionBeforeStart", "a WRITE starting before the region fails with a remote access error", protBeforeStart},
	{"ProtectionDeregistered", "a WRITE to a deregistered region fails with a remote access error", protDeregistered},
	{"ProtectionNoRemoteWrite", "a WRITE to a region without remote-write access fails with a remote access error", protNoRemoteWrite},
	{"ReceiverNotReady", "a SEND with no receive posted fails with RNR retry exceeded after the bounded wait", receiverNotReady},
	{"ReceiverNotReadyRecovers", "a SEND waits for a receive posted within the RNR timeout", receiverNotReadyRecovers},
	{"LengthError", "a SEND longer than the posted receive fails: local length at the receiver, remote invalid request at the sender", lengthError},
	{"DisconnectFlush", "when the peer disconnects, every posted receive completes with a flush error, in order", disconnectFlush},
	{"CloseFlush", "Close flushes the local outstanding sends and receives; the CQ then ends with ErrClosed", closeFlush},
	{"Outstanding256", "256 SENDs and 256 WRITEs outstanding at once complete in order", outstanding256},
	{"QueueFull", "posting beyond the queue depths fails at once with ErrQueueFull", queueFull},
	{"ConcurrentConns8", "8 connections carry traffic at the same time without mixing it", concurrent8},
	{"Bidirectional", "both ends send and write to each other at the same time", bidirectional},
	{"CQPoll", "Poll never blocks", cqPoll},
	{"CQWaitCancel", "Wait returns when its context ends", cqWaitCancel},
	{"ListenerClose", "Accept returns on context end and on Close", listenerClose},
	{"DialNobody", "Dial to an address nobody listens on fails", dialNobody},
	{"SharedCQ", "connections share completion queues (one for both queues, or separate send and receive ones); each completion names its connection, in order per connection", sharedCQ},
	{"SRQShared", "a shared receive queue feeds two connections: each SEND takes the next receive posted, its completion naming the connection", srqShared},
	{"SRQReceiverNotReady", "a SEND that finds the shared receive queue empty waits for a receive posted in time, else fails with RNR retry exceeded; the other connection carries on", srqReceiverNotReady},
	{"SRQLimit", "the shared receive queue's limit event fires once when the posted receives fall below it, and again after replenishing and re-arming", srqLimit},
	{"SharedCloseFlush", "closing a connection flushes its work on the shared CQ, naming it, and leaves the SRQ's receives to the others; the queues close only once unused", sharedCloseFlush},
}

func connInfo(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	wc, ws := e.Client.Name(), e.Server.Name()
	if e.Reverse {
		wc, ws = ws, wc
	}
	if cli.Provider() != wc || srv.Provider() != ws {
		t.Errorf("Provider() = %q/%q, want %q/%q", cli.Provider(), srv.Provider(), wc, ws)
	}
	if cli.RemoteAddr() != srv.LocalAddr() {
		t.Errorf("client RemoteAddr %q, server LocalAddr %q", cli.RemoteAddr(), srv.LocalAddr())
	}
	if cli.LocalAddr() == "" || srv.RemoteAddr() == "" {
		t.Errorf("empty addresses: %q %q", cli.LocalAddr(), srv.RemoteAddr())
	}
	if cli.Domain() == nil || srv.Domain() == nil {
		t.Fatal("nil Domain")
	}
	want := e.Config.WithDefaults()
	for side, c := range map[string]transport.Conn{"client": cli, "server": srv} {
		l := c.Limits()
		if l.SendQueueDepth < want.SendQueueDepth || l.RecvQueueDepth < want.RecvQueueDepth || l.MaxSGE < 1 || l.MaxMessageSize < 1 {
			t.Errorf("%s Limits %+v, config asked for %+v", side, l, want)
		}
	}
}

func registration(t *testing.T, e *Env) {
	cli, _ := e.pair(t)
	const n = 64
	var regs []transport.Region
	seen := map[uint32]bool{}
	for i := 0; i < n; i++ {
		acc := transport.AccessLocal
		if i%2 == 0 {
			acc |= transport.AccessRemoteWrite
		}
		size := 4096 + i*100
		r := alloc(t, cli, size, acc, 0)
		if r.Access()&acc != acc {
			t.Errorf("region %d: Access %v, registered with %v", i, r.Access(), acc)
		}
		if r.Handle() == 0 || seen[r.Handle()] {
			t.Errorf("region %d: handle %#x is zero or repeated", i, r.Handle())
		}
		seen[r.Handle()] = true
		if r.Addr() != r.Addr() || r.Handle() != r.Handle() {
			t.Errorf("region %d: address or handle not stable", i)
		}
		regs = append(regs, r)
	}
	// Unguessable: handles are not a counter (a peer that learns one must
	// not be able to name the next).
	deltas := map[uint32]bool{}
	for i := 1; i < n; i++ {
		deltas[regs[i].Handle()-regs[i-1].Handle()] = true
	}
	if len(deltas) < n/2 {
		t.Errorf("handles follow a pattern: only %d distinct steps among %d handles", len(deltas), n)
	}
	// Disjoint: no address names two regions.
	for i := range regs {
		for j := range regs {
			a, b := regs[i], regs[j]
			if i != j && a.Addr() < b.Addr()+uint64(len(b.Bytes())) && b.Addr() < a.Addr()+uint64(len(a.Bytes())) {
				t.Errorf("regions %d and %d overlap: [%#x,+%d) [%#x,+%d)", i, j, a.Addr(), len(a.Bytes()), b.Addr(), len(b.Bytes()))
			}
		}
	}
	for i, r := range regs {
		if err := r.Deregister(); err != nil {
			t.Errorf("Deregister region %d: %v", i, err)
		}
		if err := r.Deregister(); err == nil {
			t.Errorf("second Deregister of region %d succeeded", i)
		}
	}
	if _, err := cli.Domain().Alloc(0, transport.AccessLocal); err == nil {
		t.Error("Alloc(0) succeeded")
	}
}

func sendRecvOrder(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	const n = 64
	rbuf := alloc(t, srv, n*256, transport.AccessLocal, 0xEE)
	sbuf := alloc(t, cli, n*256, transport.AccessLocal, 0)
	var recvs []transport.RecvWR
	for i := 0; i < n; i++ {
		recvs = append(recvs, transport.RecvWR{ID: uint64(1000 + i), Buf: transport.Segment{Region: rbuf, Offset: i * 256, Length: 256}})
	}
	if err := srv.PostRecv(recvs...); err != nil {
		t.Fatal(err)
	}
	var wrs []transport.SendWR
	for i := 0; i < n; i++ {
		l := 1 + i*4 // 1..253 bytes
		copy(sbuf.Bytes()[i*256:], pattern(l, byte(i)))
		wr := transport.SendWR{ID: uint64(i), Op: transport.OpSend, SGL: []transport.Segment{{Region: sbuf, Offset: i * 256, Length: l}}}
		if i%3 == 0 {
			wr.Imm, wr.HasImm = uint32(0xA0000000+i), true
		}
		wrs = append(wrs, wr)
	}
	// Post in chains of varying length.
	for i := 0; i < n; {
		k := min(1+i%5, n-i)
		if err := cli.Post(wrs[i : i+k]...); err != nil {
			t.Fatal(err)
		}
		i += k
	}
	for i, c := range e.collect(t, cli, n) {
		want(t, "send", c, uint64(i), transport.OpSend, transport.StatusSuccess)
		if c.Conn != cli {
			t.Errorf("send %d: Completion.Conn is not the connection", i)
		}
	}
	for i, c := range e.collect(t, srv, n) {
		want(t, "receive", c, uint64(1000+i), transport.OpRecv, transport.StatusSuccess)
		if c.Conn != srv {
			t.Errorf("receive %d: Completion.Conn is not the connection", i)
		}
		l := 1 + i*4
		if c.Len != l {
			t.Errorf("receive %d: Len %d, want %d", i, c.Len, l)
		}
		if c.HasImm != (i%3 == 0) || (c.HasImm && c.Imm != uint32(0xA0000000+i)) {
			t.Errorf("receive %d: HasImm %v Imm %#x", i, c.HasImm, c.Imm)
		}
		slot := rbuf.Bytes()[i*256 : (i+1)*256]
		wantBytes(t, fmt.Sprintf("receive %d", i), slot[:l], pattern(l, byte(i)))
		wantFilled(t, fmt.Sprintf("receive %d beyond its length", i), slot[l:], 0xEE)
	}
	wantNoMore(t, cli)
	wantNoMore(t, srv)
}

func sendGather(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	a := alloc(t, cli, 1000, transport.AccessLocal, 0)
	b := alloc(t, cli, 1000, transport.AccessLocal, 0)
	copy(a.Bytes(), pattern(1000, 1))
	copy(b.Bytes(), pattern(1000, 2))
	rbuf := alloc(t, srv, 4096, transport.AccessLocal, 0xEE)
	if err := srv.PostRecv(transport.RecvWR{ID: 7, Buf: transport.Whole(rbuf)}); err != nil {
		t.Fatal(err)
	}
	sgl := []transport.Segment{{Region: a, Offset: 10, Length: 100}, {Region: b, Offset: 0, Length: 1000}, {Region: a, Offset: 999, Length: 1}}
	if len(sgl) > cli.Limits().MaxSGE {
		t.Skipf("MaxSGE %d", cli.Limits().MaxSGE)
	}
	if err := cli.Post(transport.SendWR{ID: 1, Op: transport.OpSend, SGL: sgl}); err != nil {
		t.Fatal(err)
	}
	want(t, "send", e.collect(t, cli, 1)[0], 1, transport.OpSend, transport.StatusSuccess)
	c := e.collect(t, srv, 1)[0]
	want(t, "receive", c, 7, transport.OpRecv, transport.StatusSuccess)
	var exp []byte
	for _, s := range sgl {
		exp = append(exp, s.Bytes()...)
	}
	if c.Len != len(exp) {
		t.Fatalf("Len %d, want %d", c.Len, len(exp))
	}
	wantBytes(t, "gathered", rbuf.Bytes()[:c.Len], exp)
	wantFilled(t, "beyond", rbuf.Bytes()[c.Len:], 0xEE)
}

// fence sends one byte and waits for it at srv: RC ordering means every
// earlier WRITE has landed when it arrives.
func (e *Env) fence(t *testing.T, cli, srv transport.Conn, src, dst transport.Region) {
	t.Helper()
	if err := srv.PostRecv(transport.RecvWR{ID: 77, Buf: transport.Segment{Region: dst, Length: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := cli.Post(transport.SendWR{ID: 77, Op: transport.OpSend, SGL: []transport.Segment{{Region: src, Length: 1}}}); err != nil {
		t.Fatal(err)
	}
	want(t, "fence send", e.collect(t, cli, 1)[0], 77, transport.OpSend, transport.StatusSuccess)
	want(t, "fence receive", e.collect(t, srv, 1)[0], 77, transport.OpRecv, transport.StatusSuccess)
}

func writePlacement(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	const size = 64 << 10
	dst := alloc(t, srv, size, transport.AccessLocal|transport.AccessRemoteWrite, 0xEE)
	src := alloc(t, cli, size, transport.AccessLocal, 0)
	copy(src.Bytes(), pattern(size, 3))
	small := alloc(t, srv, 1, transport.AccessLocal, 0)
	// Three writes: in the middle at an odd address, at the very end, at
	// the very start.
	writes := []struct{ off, len, srcOff int }{{4097, 1000, 5}, {size - 333, 333, 0}, {0, 17, 100}}
	var wrs []transport.SendWR
	for i, w := range writes {
		wrs = append(wrs, transport.SendWR{ID: uint64(i), Op: transport.OpWrite,
			SGL:        []transport.Segment{{Region: src, Offset: w.srcOff, Length: w.len}},
			RemoteAddr: dst.Addr() + uint64(w.off), RKey: dst.Handle()})
	}
	if err := cli.Post(wrs...); err != nil {
		t.Fatal(err)
	}
	for i, c := range e.collect(t, cli, len(wrs)) {
		want(t, "write", c, uint64(i), transport.OpWrite, transport.StatusSuccess)
	}
	e.fence(t, cli, srv, src, small)
	exp := make([]byte, size)
	for i := range exp {
		exp[i] = 0xEE
	}
	for _, w := range writes {
		copy(exp[w.off:], src.Bytes()[w.srcOff:w.srcOff+w.len])
	}
	wantBytes(t, "target region", dst.Bytes(), exp)
	wantNoMore(t, srv)
}

func writeImm(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	dst := alloc(t, srv, 8192, transport.AccessLocal|transport.AccessRemoteWrite, 0xEE)
	rbuf := alloc(t, srv, 64, transport.AccessLocal, 0xEE)
	src := alloc(t, cli, 8192, transport.AccessLocal, 0)
	copy(src.Bytes(), pattern(8192, 9))
	if err := srv.PostRecv(transport.RecvWR{ID: 50, Buf: transport.Whole(rbuf)}, transport.RecvWR{ID: 51, Buf: transport.Whole(rbuf)}); err != nil {
		t.Fatal(err)
	}
	if err := cli.Post(
		transport.SendWR{ID: 1, Op: transport.OpWrite, SGL: []transport.Segment{{Region: src, Offset: 0, Length: 500}},
			RemoteAddr: dst.Addr() + 100, RKey: dst.Handle(), Imm: 0xdeadbeef, HasImm: true},
		// A zero-length WRITE WITH IMMEDIATE still delivers the immediate.
		transport.SendWR{ID: 2, Op: transport.OpWrite, RemoteAddr: dst.Addr(), RKey: dst.Handle(), Imm: 42, HasImm: true},
	); err != nil {
		t.Fatal(err)
	}
	cs := e.collect(t, cli, 2)
	want(t, "write-imm", cs[0], 1, transport.OpWrite, transport.StatusSuccess)
	want(t, "zero-length write-imm", cs[1], 2, transport.OpWrite, transport.StatusSuccess)
	rs := e.collect(t, srv, 2)
	for i, imm := range []uint32{0xdeadbeef, 42} {
		want(t, "receive", rs[i], uint64(50+i), transport.OpRecv, transport.StatusSuccess)
		if !rs[i].HasImm || rs[i].Imm != imm || rs[i].Len != 0 {
			t.Errorf("receive %d: HasImm %v Imm %#x Len %d, want immediate %#x and Len 0", i, rs[i].HasImm, rs[i].Imm, rs[i].Len, imm)
		}
	}
	// The data is in place when the receive completes.
	exp := make([]byte, 8192)
	for i := range exp {
		exp[i] = 0xEE
	}
	copy(exp[100:], src.Bytes()[:500])
	wantBytes(t, "target region", dst.Bytes(), exp)
	wantFilled(t, "receive buffer (a WRITE WITH IMMEDIATE puts nothing there)", rbuf.Bytes(), 0xEE)
}

func writeImmOrder(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	dst := alloc(t, srv, 4096, transport.AccessLocal|transport.AccessRemoteWrite, 0)
	rbuf := alloc(t, srv, 4096, transport.AccessLocal, 0)
	src := alloc(t, cli, 4096, transport.AccessLocal, 0)
	const n = 30
	var recvs []transport.RecvWR
	var wrs []transport.SendWR
	for i := 0; i < n; i++ {
		recvs = append(recvs, transport.RecvWR{ID: uint64(100 + i), Buf: transport.Segment{Region: rbuf, Offset: i * 100, Length: 100}})
		wr := transport.SendWR{ID: uint64(i), Op: transport.OpSend, SGL: []transport.Segment{{Region: src, Length: 10}}}
		if i%2 == 1 {
			wr = transport.SendWR{ID: uint64(i), Op: transport.OpWrite, SGL: []transport.Segment{{Region: src, Length: 10}},
				RemoteAddr: dst.Addr() + uint64(i*100), RKey: dst.Handle(), Imm: uint32(i), HasImm: true}
		}
		wrs = append(wrs, wr)
	}
	if err := srv.PostRecv(recvs...); err != nil {
		t.Fatal(err)
	}
	if err := cli.Post(wrs...); err != nil {
		t.Fatal(err)
	}
	for i, c := range e.collect(t, cli, n) {
		want(t, "initiator", c, uint64(i), wrs[i].Op, transport.StatusSuccess)
	}
	for i, c := range e.collect(t, srv, n) {
		want(t, "receive", c, uint64(100+i), transport.OpRecv, transport.StatusSuccess)
		if i%2 == 1 && (!c.HasImm || c.Imm != uint32(i) || c.Len != 0) {
			t.Errorf("receive %d: %+v, want the immediate %d", i, c, i)
		}
		if i%2 == 0 && (c.HasImm || c.Len != 10) {
			t.Errorf("receive %d: %+v, want a 10-byte SEND", i, c)
		}
	}
}

func largeWrite(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	const size = 4 << 20
	if cli.Limits().MaxMessageSize < size {
		t.Skipf("MaxMessageSize %d", cli.Limits().MaxMessageSize)
	}
	dst := alloc(t, srv, size+8192, transport.AccessLocal|transport.AccessRemoteWrite, 0xEE)
	src := alloc(t, cli, size, transport.AccessLocal, 0)
	copy(src.Bytes(), pattern(size, 11))
	rbuf := alloc(t, srv, 16, transport.AccessLocal, 0)
	if err := srv.PostRecv(transport.RecvWR{ID: 1, Buf: transport.Whole(rbuf)}); err != nil {
		t.Fatal(err)
	}
	if err := cli.Post(transport.SendWR{ID: 1, Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(src)},
		RemoteAddr: dst.Addr() + 4096, RKey: dst.Handle(), Imm: 5, HasImm: true}); err != nil {
		t.Fatal(err)
	}
	want(t, "write", e.collect(t, cli, 1)[0], 1, transport.OpWrite, transport.StatusSuccess)
	want(t, "receive", e.collect(t, srv, 1)[0], 1, transport.OpRecv, transport.StatusSuccess)
	wantFilled(t, "before", dst.Bytes()[:4096], 0xEE)
	wantBytes(t, "placed", dst.Bytes()[4096:4096+size], src.Bytes())
	wantFilled(t, "after", dst.Bytes()[4096+size:], 0xEE)
}

func outstanding256(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	const n = 256
	if cli.Limits().SendQueueDepth < n || srv.Limits().RecvQueueDepth < n {
		t.Fatalf("limits %+v / %+v: the suite needs queue depths of at least %d (Env.Config)", cli.Limits(), srv.Limits(), n)
	}
	src := alloc(t, cli, n*4096, transport.AccessLocal, 0)
	copy(src.Bytes(), pattern(n*4096, 13))
	rbuf := alloc(t, srv, n*64, transport.AccessLocal, 0)
	dst := alloc(t, srv, n*4096, transport.AccessLocal|transport.AccessRemoteWrite, 0)
	var recvs []transport.RecvWR
	var sends, writes []transport.SendWR
	for i := 0; i < n; i++ {
		recvs = append(recvs, transport.RecvWR{ID: uint64(i), Buf: transport.Segment{Region: rbuf, Offset: i * 64, Length: 64}})
		sends = append(sends, transport.SendWR{ID: uint64(i), Op: transport.OpSend, SGL: []transport.Segment{{Region: src, Offset: i * 4096, Length: 64}}})
		writes = append(writes, transport.SendWR{ID: uint64(n + i), Op: transport.OpWrite, SGL: []transport.Segment{{Region: src, Offset: i * 4096, Length: 4096}},
			RemoteAddr: dst.Addr() + uint64(i*4096), RKey: dst.Handle()})
	}
	if err := srv.PostRecv(recvs...); err != nil {
		t.Fatal(err)
	}
	if err := cli.Post(sends...); err != nil {
		t.Fatal(err)
	}
	for i, c := range e.collect(t, cli, n) {
		want(t, "send", c, uint64(i), transport.OpSend, transport.StatusSuccess)
	}
	for i, c := range e.collect(t, srv, n) {
		want(t, "receive", c, uint64(i), transport.OpRecv, transport.StatusSuccess)
		wantBytes(t, fmt.Sprintf("receive %d", i), rbuf.Bytes()[i*64:(i+1)*64], src.Bytes()[i*4096:i*4096+64])
	}
	// The last write carries an immediate so the target knows all landed.
	writes[n-1].Imm, writes[n-1].HasImm = 1, true
	if err := srv.PostRecv(recvs[0]); err != nil {
		t.Fatal(err)
	}
	if err := cli.Post(writes...); err != nil {
		t.Fatal(err)
	}
	for i, c := range e.collect(t, cli, n) {
		want(t, "write", c, uint64(n+i), transport.OpWrite, transport.StatusSuccess)
	}
	want(t, "write-imm receive", e.collect(t, srv, 1)[0], 0, transport.OpRecv, transport.StatusSuccess)
	wantBytes(t, "target", dst.Bytes(), src.Bytes())
}

func queueFull(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	sq, rq := cli.Limits().SendQueueDepth, srv.Limits().RecvQueueDepth
	src := alloc(t, cli, 64, transport.AccessLocal, 0)
	rbuf := alloc(t, srv, 64, transport.AccessLocal, 0)
	// No receive at the server: the first SEND waits (RNR) and holds
	// every later one outstanding.
	sends := make([]transport.SendWR, sq)
	for i := range sends {
		sends[i] = transport.SendWR{ID: uint64(i), Op: transport.OpSend, SGL: []transport.Segment{{Region: src, Length: 8}}}
	}
	if err := cli.Post(sends...); err != nil {
		t.Fatal(err)
	}
	if err := cli.Post(transport.SendWR{ID: 999, Op: transport.OpSend, SGL: []transport.Segment{{Region: src, Length: 8}}}); !errors.Is(err, transport.ErrQueueFull) {
		t.Errorf("Post beyond SendQueueDepth %d: %v, want ErrQueueFull", sq, err)
	}
	recvs := make([]transport.RecvWR, rq)
	for i := range recvs {
		recvs[i] = transport.RecvWR{ID: uint64(i), Buf: transport.Whole(rbuf)}
	}
	if err := srv.PostRecv(append(recvs, recvs[0])...); !errors.Is(err, transport.ErrQueueFull) {
		t.Errorf("PostRecv beyond RecvQueueDepth %d: %v, want ErrQueueFull", rq, err)
	}
	// Nothing of the failed call was posted: the receives still fit.
	if err := srv.PostRecv(recvs[:min(rq, sq)]...); err != nil {
		t.Fatal(err)
	}
	for i, c := range e.collectWithin(t, cli, min(rq, sq), e.RNRTimeout+e.Timeout) {
		want(t, "send", c, uint64(i), transport.OpSend, transport.StatusSuccess)
	}
}

// pingPong runs rounds of SEND → WRITE WITH IMMEDIATE echo on one pair.
func (e *Env) pingPong(t *testing.T, cli, srv transport.Conn, tag byte, rounds int) error {
	const size = 200
	csrc := alloc(t, cli, size, transport.AccessLocal, 0)
	cdst := alloc(t, cli, size, transport.AccessLocal|transport.AccessRemoteWrite, 0)
	srecv := alloc(t, srv, size, transport.AccessLocal, 0)
	cflag := alloc(t, cli, 1, transport.AccessLocal, 0)
	for i := 0; i < rounds; i++ {
		msg := pattern(size, tag+byte(i))
		copy(csrc.Bytes(), msg)
		if err := srv.PostRecv(transport.RecvWR{ID: uint64(i), Buf: transport.Whole(srecv)}); err != nil {
			return err
		}
		if err := cli.PostRecv(transport.RecvWR{ID: uint64(i), Buf: transport.Whole(cflag)}); err != nil {
			return err
		}
		if err := cli.Post(transport.SendWR{ID: uint64(i), Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(csrc)}}); err != nil {
			return err
		}
		rc, err := e.tryCollect(srv, 1, e.Timeout)
		if err != nil {
			return err
		}
		if rc[0].Status != transport.StatusSuccess || rc[0].Len != size {
			return fmt.Errorf("conn %d round %d: server receive %+v", tag, i, rc[0])
		}
		// Echo it back into the client's region with the round number.
		if err := srv.Post(transport.SendWR{ID: uint64(i), Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(srecv)},
			RemoteAddr: cdst.Addr(), RKey: cdst.Handle(), Imm: uint32(tag)<<16 | uint32(i), HasImm: true}); err != nil {
			return err
		}
		if sc, err := e.tryCollect(srv, 1, e.Timeout); err != nil || sc[0].Status != transport.StatusSuccess {
			return fmt.Errorf("conn %d round %d: server write %v %v", tag, i, sc, err)
		}
		cc, err := e.tryCollect(cli, 2, e.Timeout)
		if err != nil {
			return err
		}
		for _, c := range cc {
			if c.Status != transport.StatusSuccess || c.ID != uint64(i) {
				return fmt.Errorf("conn %d round %d: client completion %+v", tag, i, c)
			}
			if c.Op == transport.OpRecv && c.Imm != uint32(tag)<<16|uint32(i) {
				return fmt.Errorf("conn %d round %d: immediate %#x", tag, i, c.Imm)
			}
		}
		if string(cdst.Bytes()) != string(msg) {
			return fmt.Errorf("conn %d round %d: echoed bytes differ", tag, i)
		}
	}
	return nil
}

func concurrent8(t *testing.T, e *Env) {
	ln, err := e.Server.Listen(e.Addr, e.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	type pair struct{ cli, srv transport.Conn }
	var pairs []pair
	for i := 0; i < 8; i++ {
		cli, srv := e.connect(t, ln)
		pairs = append(pairs, pair{cli, srv})
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(pairs))
	for i, p := range pairs {
		wg.Go(func() {
			if err := e.pingPong(t, p.cli, p.srv, byte(i+1), 50); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func bidirectional(t *testing.T, e *Env) {
	a, b := e.pair(t)
	const n, size = 128, 32 << 10
	run := func(from, to transport.Conn, seed byte) error {
		src := alloc(t, from, n*size, transport.AccessLocal, 0)
		copy(src.Bytes(), pattern(n*size, seed))
		dst := alloc(t, to, n*size, transport.AccessLocal|transport.AccessRemoteWrite, 0)
		var wrs []transport.SendWR
		for i := 0; i < n; i++ {
			wrs = append(wrs, transport.SendWR{ID: uint64(i), Op: transport.OpWrite, SGL: []transport.Segment{{Region: src, Offset: i * size, Length: size}},
				RemoteAddr: dst.Addr() + uint64(i*size), RKey: dst.Handle()})
		}
		if err := from.Post(wrs...); err != nil {
			return err
		}
		cs, err := e.tryCollect(from, n, e.Timeout)
		if err != nil {
			return err
		}
		for i, c := range cs {
			if c.ID != uint64(i) || c.Status != transport.StatusSuccess {
				return fmt.Errorf("write %d: %+v", i, c)
			}
		}
		return nil
	}
	// The two directions share the CQs only through their own send
	// completions: neither side posts receives, so each CQ sees only its
	// own n writes.
	var wg sync.WaitGroup
	var errA, errB error
	wg.Add(2)
	go func() { defer wg.Done(); errA = run(a, b, 1) }()
	go func() { defer wg.Done(); errB = run(b, a, 2) }()
	wg.Wait()
	if errA != nil || errB != nil {
		t.Fatalf("client→server: %v; server→client: %v", errA, errB)
	}
}

func cqPoll(t *testing.T, e *Env) {
	cli, _ := e.pair(t)
	var buf [4]transport.Completion
	start := time.Now()
	for i := 0; i < 1000; i++ {
		if n := cli.CQ().Poll(buf[:]); n != 0 {
			t.Fatalf("Poll on an idle connection: %v", buf[:n])
		}
	}
	if n := cli.CQ().Poll(nil); n != 0 {
		t.Fatalf("Poll(nil) = %d", n)
	}
	if d := time.Since(start); d > e.Timeout {
		t.Errorf("1000 empty Polls took %v", d)
	}
}

func cqWaitCancel(t *testing.T, e *Env) {
	cli, _ := e.pair(t)
	var buf [4]transport.Completion
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := cli.CQ().Wait(ctx, buf[:]); n != 0 || !errors.Is(err, context.Canceled) {
		t.Errorf("Wait with a cancelled context: %d, %v", n, err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if n, err := cli.CQ().Wait(ctx, buf[:]); n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait with a 50ms deadline: %d, %v", n, err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > e.Timeout {
		t.Errorf("Wait with a 50ms deadline returned after %v", d)
	}
}

func listenerClose(t *testing.T, e *Env) {
	ln, err := e.Server.Listen(e.Addr, e.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if c, err := ln.Accept(ctx); err == nil {
		_ = c.Close()
		t.Fatal("Accept with nobody dialling returned a connection")
	}
	done := make(chan error, 1)
	go func() {
		_, err := ln.Accept(context.Background())
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Error("Accept after Close returned no error")
		}
	case <-time.After(e.Timeout):
		t.Fatal("Accept did not return after Close")
	}
}

func dialNobody(t *testing.T, e *Env) {
	ln, err := e.Server.Listen(e.Addr, e.Config)
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr()
	_ = ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), e.Timeout)
	defer cancel()
	if c, err := e.Client.Dial(ctx, addr, e.Config); err == nil {
		_ = c.Close()
		t.Fatalf("Dial(%s) after the listener closed succeeded", addr)
	}
}
