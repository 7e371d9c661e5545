package conformance

import (
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// The error cases: protection, receiver-not-ready, length, flushes.

// badWrite is the target of a WRITE that must be refused.
type badWrite struct {
	addr uint64
	rkey uint32
	n    int
	// gone: the test deregistered the target, its bytes are not to be read.
	gone bool
}

// protection runs one bad RDMA WRITE and checks the verbs outcome:
// StatusRemoteAccess on the initiator, both connections in error with
// their posted receives flushed, the target untouched.
func protection(t *testing.T, e *Env, bad func(t *testing.T, srv transport.Conn, dst transport.Region) badWrite) {
	cli, srv := e.pair(t)
	dst := alloc(t, srv, 8192, transport.AccessLocal|transport.AccessRemoteWrite, 0xEE)
	srecv := alloc(t, srv, 64, transport.AccessLocal, 0)
	crecv := alloc(t, cli, 64, transport.AccessLocal, 0)
	src := alloc(t, cli, 8192, transport.AccessLocal, 0x11)
	postErrorRecvs(t, cli, srv, crecv, srecv)
	// A good write first: it must still succeed, in order.
	if err := cli.Post(transport.SendWR{ID: 10, Op: transport.OpWrite, SGL: []transport.Segment{{Region: src, Length: 8}},
		RemoteAddr: dst.Addr() + 16, RKey: dst.Handle()}); err != nil {
		t.Fatal(err)
	}
	want(t, "good write", e.collect(t, cli, 1)[0], 10, transport.OpWrite, transport.StatusSuccess)
	bw := bad(t, srv, dst)
	if err := cli.Post(transport.SendWR{ID: 11, Op: transport.OpWrite, SGL: []transport.Segment{{Region: src, Length: bw.n}},
		RemoteAddr: bw.addr, RKey: bw.rkey}); err != nil {
		t.Fatalf("Post of the bad write failed at once (%v): the error must come from the remote end", err)
	}
	cs := sendsFirst(e.collect(t, cli, 2))
	want(t, "bad write", cs[0], 11, transport.OpWrite, transport.StatusRemoteAccess)
	want(t, "initiator's posted receive", cs[1], 3, transport.OpRecv, transport.StatusFlushed)
	ss := e.collect(t, srv, 2)
	want(t, "target's posted receive", ss[0], 1, transport.OpRecv, transport.StatusFlushed)
	want(t, "target's posted receive", ss[1], 2, transport.OpRecv, transport.StatusFlushed)
	if !bw.gone {
		b := dst.Bytes()
		wantFilled(t, "target before the good write", b[:16], 0xEE)
		wantFilled(t, "good write", b[16:24], 0x11)
		wantFilled(t, "target after the good write", b[24:], 0xEE)
	}
	e.wantClosedAfterError(t, cli, "initiator", crecv)
	e.wantClosedAfterError(t, srv, "target", srecv)
}

func protWrongHandle(t *testing.T, e *Env) {
	protection(t, e, func(t *testing.T, _ transport.Conn, dst transport.Region) badWrite {
		return badWrite{addr: dst.Addr(), rkey: dst.Handle() ^ 0x5a5a0001, n: 8}
	})
}

func protPastEnd(t *testing.T, e *Env) {
	protection(t, e, func(t *testing.T, _ transport.Conn, dst transport.Region) badWrite {
		return badWrite{addr: dst.Addr() + uint64(len(dst.Bytes())) - 8, rkey: dst.Handle(), n: 16}
	})
}

func protBeforeStart(t *testing.T, e *Env) {
	protection(t, e, func(t *testing.T, _ transport.Conn, dst transport.Region) badWrite {
		return badWrite{addr: dst.Addr() - 8, rkey: dst.Handle(), n: 16}
	})
}

func protDeregistered(t *testing.T, e *Env) {
	protection(t, e, func(t *testing.T, _ transport.Conn, dst transport.Region) badWrite {
		bw := badWrite{addr: dst.Addr() + 100, rkey: dst.Handle(), n: 8, gone: true}
		if err := dst.Deregister(); err != nil {
			t.Fatal(err)
		}
		return bw
	})
}

func protNoRemoteWrite(t *testing.T, e *Env) {
	var local transport.Region
	protection(t, e, func(t *testing.T, srv transport.Conn, _ transport.Region) badWrite {
		local = alloc(t, srv, 4096, transport.AccessLocal, 0x33)
		return badWrite{addr: local.Addr(), rkey: local.Handle(), n: 8}
	})
	wantFilled(t, "local-only region", local.Bytes(), 0x33)
}

func receiverNotReady(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	src := alloc(t, cli, 64, transport.AccessLocal, 1)
	crecv := alloc(t, cli, 64, transport.AccessLocal, 0)
	srecv := alloc(t, srv, 64, transport.AccessLocal, 0)
	if err := cli.PostRecv(transport.RecvWR{ID: 3, Buf: transport.Whole(crecv)}); err != nil {
		t.Fatal(err)
	}
	e.wantRNR(t, cli, transport.SendWR{ID: 1, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}, 3)
	e.wantClosedAfterError(t, cli, "initiator", crecv)
	e.wantClosedAfterError(t, srv, "target", srecv)
}

// wantRNR posts wr, a SEND the peer has no receive for, on cli, which has
// one receive posted (recvID): the SEND fails with RNR retry exceeded after
// about the RNR timeout, and the receive is flushed.
func (e *Env) wantRNR(t *testing.T, cli transport.Conn, wr transport.SendWR, recvID uint64) {
	t.Helper()
	start := time.Now()
	if err := cli.Post(wr); err != nil {
		t.Fatal(err)
	}
	cs := sendsFirst(e.collectWithin(t, cli, 2, e.RNRTimeout+e.Timeout))
	elapsed := time.Since(start)
	want(t, "send with no receive at the peer", cs[0], wr.ID, transport.OpSend, transport.StatusRNRRetryExceeded)
	want(t, "initiator's posted receive", cs[1], recvID, transport.OpRecv, transport.StatusFlushed)
	if elapsed < e.RNRTimeout/2 {
		t.Errorf("RNR failure after %v; the receiver should have had about %v to post a receive", elapsed, e.RNRTimeout)
	}
	t.Logf("RNR retry exceeded after %v (RNRTimeout %v)", elapsed, e.RNRTimeout)
}

// rnrAttempts is how many times a receiver-not-ready recovery is tried
// while the receive cannot be posted in time (a loaded machine).
const rnrAttempts = 5

// postInTime sleeps until a quarter of the RNR time after start, then
// posts; inTime reports whether the post began before half the RNR time,
// so that a SEND waiting since start must find it. A later post proves
// nothing either way: the caller tries again.
func (e *Env) postInTime(start time.Time, post func() error) (inTime bool, err error) {
	time.Sleep(e.RNRTimeout/4 - time.Since(start))
	inTime = time.Since(start) < e.RNRTimeout/2
	return inTime, post()
}

// lateAttempt logs an inconclusive attempt, or fails after the last.
func (e *Env) lateAttempt(t *testing.T, attempt int, start time.Time) {
	t.Helper()
	if attempt == rnrAttempts {
		t.Fatalf("in %d attempts the receive could not be posted within half the RNR time (%v): the machine is too loaded to tell", rnrAttempts, e.RNRTimeout/2)
	}
	t.Logf("attempt %d: the receive was posted %v after the SEND, later than half the RNR time: not conclusive, again", attempt, time.Since(start))
}

func receiverNotReadyRecovers(t *testing.T, e *Env) {
	for attempt := 1; ; attempt++ {
		cli, srv := e.pair(t)
		src := alloc(t, cli, 64, transport.AccessLocal, 1)
		rbuf := alloc(t, srv, 64, transport.AccessLocal, 0)
		start := time.Now()
		if err := cli.Post(transport.SendWR{ID: 1, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}); err != nil {
			t.Fatal(err)
		}
		inTime, err := e.postInTime(start, func() error { return srv.PostRecv(transport.RecvWR{ID: 2, Buf: transport.Whole(rbuf)}) })
		if !inTime {
			e.lateAttempt(t, attempt, start)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		want(t, "send", e.collectWithin(t, cli, 1, e.RNRTimeout+e.Timeout)[0], 1, transport.OpSend, transport.StatusSuccess)
		c := e.collect(t, srv, 1)[0]
		want(t, "receive", c, 2, transport.OpRecv, transport.StatusSuccess)
		if c.Len != 64 {
			t.Errorf("Len %d", c.Len)
		}
		wantFilled(t, "received", rbuf.Bytes(), 1)
		return
	}
}

// postErrorRecvs posts the receives an error case expects flushed: 1 and
// 2 in srecv at the target, 3 in crecv at the initiator.
func postErrorRecvs(t *testing.T, cli, srv transport.Conn, crecv, srecv transport.Region) {
	t.Helper()
	if err := srv.PostRecv(transport.RecvWR{ID: 1, Buf: transport.Whole(srecv)}, transport.RecvWR{ID: 2, Buf: transport.Whole(srecv)}); err != nil {
		t.Fatal(err)
	}
	if err := cli.PostRecv(transport.RecvWR{ID: 3, Buf: transport.Whole(crecv)}); err != nil {
		t.Fatal(err)
	}
}

// StartLengthError is the first half of the case LengthError, for a
// provider's own variant of its checks (verbs on Soft-RoCE, whose short
// receive fails with another status): it posts receives 1 and 2 of 16
// bytes at srv and receive 3 of 64 bytes at cli, then SENDs 32 bytes from
// cli as work request 5. It returns the regions of cli's and srv's
// receives.
func StartLengthError(t *testing.T, cli, srv transport.Conn) (crecv, srecv transport.Region) {
	t.Helper()
	src := alloc(t, cli, 32, transport.AccessLocal, 1)
	crecv = alloc(t, cli, 64, transport.AccessLocal, 0)
	srecv = alloc(t, srv, 16, transport.AccessLocal, 0)
	postErrorRecvs(t, cli, srv, crecv, srecv)
	if err := cli.Post(transport.SendWR{ID: 5, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}); err != nil {
		t.Fatal(err)
	}
	return crecv, srecv
}

func lengthError(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	crecv, srecv := StartLengthError(t, cli, srv)
	ss := e.collect(t, srv, 2)
	want(t, "short receive", ss[0], 1, transport.OpRecv, transport.StatusLocalLength)
	want(t, "next receive", ss[1], 2, transport.OpRecv, transport.StatusFlushed)
	cs := sendsFirst(e.collect(t, cli, 2))
	want(t, "long send", cs[0], 5, transport.OpSend, transport.StatusRemoteInvalidRequest)
	want(t, "initiator's posted receive", cs[1], 3, transport.OpRecv, transport.StatusFlushed)
	e.wantClosedAfterError(t, cli, "initiator", crecv)
	e.wantClosedAfterError(t, srv, "target", srecv)
}

func disconnectFlush(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	rbuf := alloc(t, cli, 8*64, transport.AccessLocal, 0)
	var recvs []transport.RecvWR
	for i := 0; i < 8; i++ {
		recvs = append(recvs, transport.RecvWR{ID: uint64(i), Buf: transport.Segment{Region: rbuf, Offset: i * 64, Length: 64}})
	}
	if err := cli.PostRecv(recvs...); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	for i, c := range e.collect(t, cli, 8) {
		want(t, "posted receive", c, uint64(i), transport.OpRecv, transport.StatusFlushed)
	}
	e.wantClosedAfterError(t, cli, "client", rbuf)
	e.wantCQClosed(t, srv, "server")
}

func closeFlush(t *testing.T, e *Env) {
	cli, srv := e.pair(t)
	src := alloc(t, cli, 64, transport.AccessLocal, 1)
	rbuf := alloc(t, cli, 4*64, transport.AccessLocal, 0)
	var recvs []transport.RecvWR
	for i := 0; i < 4; i++ {
		recvs = append(recvs, transport.RecvWR{ID: uint64(10 + i), Buf: transport.Segment{Region: rbuf, Offset: i * 64, Length: 64}})
	}
	if err := cli.PostRecv(recvs...); err != nil {
		t.Fatal(err)
	}
	// The server posts no receive, so the SEND stays outstanding (RNR).
	if err := cli.Post(transport.SendWR{ID: 1, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]transport.Completion{}
	var recvOrder []uint64
	for _, c := range e.collect(t, cli, 5) {
		got[c.ID] = c
		if c.Op == transport.OpRecv {
			recvOrder = append(recvOrder, c.ID)
		}
	}
	want(t, "outstanding send", got[1], 1, transport.OpSend, transport.StatusFlushed)
	for i, id := range recvOrder {
		want(t, "posted receive", got[id], uint64(10+i), transport.OpRecv, transport.StatusFlushed)
	}
	e.wantCQClosed(t, cli, "client")
	err := cli.Post(transport.SendWR{ID: 2, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}})
	if err == nil {
		t.Error("Post after Close succeeded")
	}
	// The server notices the disconnect (after at most its RNR wait). The
	// SEND that was waiting may or may not be delivered to the first
	// receive; the second one is flushed.
	sbuf := alloc(t, srv, 64, transport.AccessLocal, 0)
	if err := srv.PostRecv(transport.RecvWR{ID: 8, Buf: transport.Whole(sbuf)}, transport.RecvWR{ID: 9, Buf: transport.Whole(sbuf)}); err == nil {
		got, err := e.tryCollect(srv, 2, e.RNRTimeout+e.Timeout)
		if err != nil || got[1].ID != 9 || got[1].Status == transport.StatusSuccess {
			t.Errorf("server after the client closed: %v %v", got, err)
		}
	}
}
