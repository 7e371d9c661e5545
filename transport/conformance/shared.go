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

// The shared-queue cases: completion queues several connections share
// (ibv_create_cq), shared receive queues (ibv_create_srq), their limit
// event, and what closing does to them.

// Which queues a chooser shares.
const (
	shareCQ     = 1 << iota // one CQ for both queues of every connection
	shareRecvCQ             // with shareCQ: receives on a second, separate CQ
	shareSRQ                // one SRQ for every connection
)

// chooser is the cases' transport.QueueChooser: on first use in a domain it
// makes the queues the case asks for, and gives every connection of that
// domain the same ones. They are closed at cleanup (a case that checks
// Close does it first).
type chooser struct {
	what     int
	srqDepth int
	mu       sync.Mutex
	made     map[transport.QueueDomain]transport.Queues
}

func newChooser(t *testing.T, what int) *chooser {
	c := &chooser{what: what, srqDepth: 64, made: map[transport.QueueDomain]transport.Queues{}}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, q := range c.made {
			for _, x := range []transport.SharedCQ{q.SendCQ, q.RecvCQ} {
				if x != nil {
					_ = x.Close()
				}
			}
			if q.SRQ != nil {
				_ = q.SRQ.Close()
			}
		}
	})
	return c
}

func (c *chooser) ChooseQueues(d transport.QueueDomain) (transport.Queues, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if q, ok := c.made[d]; ok {
		return q, nil
	}
	var q transport.Queues
	var err error
	if c.what&shareCQ != 0 {
		if q.SendCQ, err = d.CreateCQ(0); err != nil {
			return q, fmt.Errorf("CreateCQ: %w", err)
		}
	}
	if c.what&shareRecvCQ != 0 {
		if q.RecvCQ, err = d.CreateCQ(0); err != nil {
			return q, fmt.Errorf("CreateCQ: %w", err)
		}
	}
	if c.what&shareSRQ != 0 {
		if q.SRQ, err = d.CreateSRQ(transport.SRQConfig{Depth: c.srqDepth}); err != nil {
			return q, fmt.Errorf("CreateSRQ: %w", err)
		}
	}
	c.made[d] = q
	return q, nil
}

// queues returns what the chooser made: one domain's set.
func (c *chooser) queues(t *testing.T) transport.Queues {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.made) != 1 {
		t.Fatalf("the queue chooser was used in %d domains, want 1", len(c.made))
	}
	for _, q := range c.made {
		return q
	}
	return transport.Queues{}
}

// sharedPairs connects n clients (dialling with cliQ) to one listener
// (listening with srvQ); nil choosers mean the connections' own queues.
func (e *Env) sharedPairs(t *testing.T, n int, cliQ, srvQ *chooser) (clis, srvs []transport.Conn) {
	t.Helper()
	lcfg, dcfg := e.Config, e.Config
	if e.Reverse { // the dialled ends play the servers
		cliQ, srvQ = srvQ, cliQ
	}
	if srvQ != nil {
		lcfg.Queues = srvQ
	}
	if cliQ != nil {
		dcfg.Queues = cliQ
	}
	ln, err := e.Server.Listen(e.Addr, lcfg)
	if err != nil {
		t.Fatalf("Listen(%s): %v", e.Addr, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	for i := 0; i < n; i++ {
		d := *e
		d.Config = dcfg
		cli, srv := d.connect(t, ln)
		clis, srvs = append(clis, cli), append(srvs, srv)
	}
	return clis, srvs
}

// collectQ waits for exactly n completions on q.
func (e *Env) collectQ(t *testing.T, q transport.CQ, n int) []transport.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.Timeout)
	defer cancel()
	got := make([]transport.Completion, 0, n)
	buf := make([]transport.Completion, 16)
	for len(got) < n {
		k, err := q.Wait(ctx, buf[:min(len(buf), n-len(got))])
		got = append(got, buf[:k]...)
		if err != nil {
			t.Fatalf("CQ.Wait: %v (got %d of %d completions: %v)", err, len(got), n, got)
		}
	}
	return got
}

// closeWithSend posts wr, a SEND its peer has no receive for (so it stays
// outstanding), closes c, and checks that the SEND is flushed on q, the
// shared CQ of c's sends, naming c.
func (e *Env) closeWithSend(t *testing.T, c transport.Conn, q transport.CQ, wr transport.SendWR) {
	t.Helper()
	if err := c.Post(wr); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	got := e.collectQ(t, q, 1)[0]
	want(t, "the closed connection's outstanding send", got, wr.ID, transport.OpSend, transport.StatusFlushed)
	if got.Conn != c {
		t.Errorf("the flushed send names %v, not the closed connection", got.Conn)
	}
}

// byConn splits completions by the connection they name, in arrival order;
// one naming none of conns is an error.
func byConn(t *testing.T, what string, cs []transport.Completion, conns []transport.Conn) [][]transport.Completion {
	t.Helper()
	out := make([][]transport.Completion, len(conns))
	for _, c := range cs {
		k := -1
		for i, conn := range conns {
			if c.Conn == conn {
				k = i
			}
		}
		if k < 0 {
			t.Errorf("%s: completion %+v names none of the connections sharing the queue", what, c)
			continue
		}
		out[k] = append(out[k], c)
	}
	return out
}

func sharedCQ(t *testing.T, e *Env) {
	// Server: one CQ for both queues of both connections. Client: sends
	// on one shared CQ, receives on another.
	srvQ, cliQ := newChooser(t, shareCQ), newChooser(t, shareCQ|shareRecvCQ)
	clis, srvs := e.sharedPairs(t, 2, cliQ, srvQ)
	sq, cq := srvQ.queues(t), cliQ.queues(t)
	for k := range clis {
		if srvs[k].CQ() != transport.CQ(sq.SendCQ) || clis[k].CQ() != transport.CQ(cq.SendCQ) {
			t.Fatalf("connection %d: CQ() is not the shared send CQ Config.Queues named", k)
		}
	}
	const n = 8
	for k := range clis {
		srecv := alloc(t, srvs[k], n*64, transport.AccessLocal, 0)
		crecv := alloc(t, clis[k], n*64, transport.AccessLocal, 0)
		for i := 0; i < n; i++ {
			if err := srvs[k].PostRecv(transport.RecvWR{ID: uint64(100*k + i), Buf: transport.Segment{Region: srecv, Offset: i * 64, Length: 64}}); err != nil {
				t.Fatal(err)
			}
			if err := clis[k].PostRecv(transport.RecvWR{ID: uint64(200*k + i), Buf: transport.Segment{Region: crecv, Offset: i * 64, Length: 64}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Both clients send n SENDs, interleaved.
	srcs := make([]transport.Region, len(clis))
	for k := range clis {
		srcs[k] = alloc(t, clis[k], n*64, transport.AccessLocal, 0)
		copy(srcs[k].Bytes(), pattern(n*64, byte(k+1)))
	}
	for i := 0; i < n; i++ {
		for k := range clis {
			if err := clis[k].Post(transport.SendWR{ID: uint64(300*k + i), Op: transport.OpSend,
				SGL: []transport.Segment{{Region: srcs[k], Offset: i * 64, Length: 10 + i}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for k, cs := range byConn(t, "server receives", e.collectQ(t, sq.SendCQ, 2*n), srvs) {
		if len(cs) != n {
			t.Fatalf("server connection %d: %d receives on the shared CQ, want %d", k, len(cs), n)
		}
		for i, c := range cs {
			want(t, fmt.Sprintf("server connection %d receive", k), c, uint64(100*k+i), transport.OpRecv, transport.StatusSuccess)
			if c.Len != 10+i {
				t.Errorf("server connection %d receive %d: Len %d, want %d", k, i, c.Len, 10+i)
			}
		}
	}
	// The server answers each; its send completions share the CQ too.
	for k := range srvs {
		src := alloc(t, srvs[k], 64, transport.AccessLocal, byte(0x40+k))
		for i := 0; i < n; i++ {
			if err := srvs[k].Post(transport.SendWR{ID: uint64(400*k + i), Op: transport.OpSend, SGL: []transport.Segment{{Region: src, Length: 20 + k}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for k, cs := range byConn(t, "server sends", e.collectQ(t, sq.SendCQ, 2*n), srvs) {
		for i, c := range cs {
			want(t, fmt.Sprintf("server connection %d send", k), c, uint64(400*k+i), transport.OpSend, transport.StatusSuccess)
		}
		if len(cs) != n {
			t.Errorf("server connection %d: %d send completions, want %d", k, len(cs), n)
		}
	}
	// The client's sends completed on its send CQ, the answers on its
	// receive CQ.
	for k, cs := range byConn(t, "client sends", e.collectQ(t, cq.SendCQ, 2*n), clis) {
		for i, c := range cs {
			want(t, fmt.Sprintf("client connection %d send", k), c, uint64(300*k+i), transport.OpSend, transport.StatusSuccess)
		}
	}
	for k, cs := range byConn(t, "client receives", e.collectQ(t, cq.RecvCQ, 2*n), clis) {
		for i, c := range cs {
			want(t, fmt.Sprintf("client connection %d receive", k), c, uint64(200*k+i), transport.OpRecv, transport.StatusSuccess)
			if c.Len != 20+k {
				t.Errorf("client connection %d receive %d: Len %d, want %d (the other connection's answer?)", k, i, c.Len, 20+k)
			}
		}
	}
	for _, q := range []transport.CQ{sq.SendCQ, cq.SendCQ, cq.RecvCQ} {
		var buf [4]transport.Completion
		if m := q.Poll(buf[:]); m > 0 {
			t.Errorf("unexpected completions on a shared CQ: %v", buf[:m])
		}
	}
	// Closing client 0 with a SEND outstanding (the server has no receive
	// left for it) and a receive posted flushes each to its own CQ.
	crecv := alloc(t, clis[0], 64, transport.AccessLocal, 0)
	if err := clis[0].PostRecv(transport.RecvWR{ID: 999, Buf: transport.Whole(crecv)}); err != nil {
		t.Fatal(err)
	}
	e.closeWithSend(t, clis[0], cq.SendCQ, transport.SendWR{ID: 998, Op: transport.OpSend, SGL: []transport.Segment{{Region: srcs[0], Length: 8}}})
	c := e.collectQ(t, cq.RecvCQ, 1)[0]
	want(t, "closed connection's posted receive", c, 999, transport.OpRecv, transport.StatusFlushed)
	if c.Conn != clis[0] {
		t.Error("the flushed receive does not name the closed connection")
	}
	// A connection with its own queues says whose completions they are too.
	cli, srv := e.pair(t)
	src := alloc(t, cli, 8, transport.AccessLocal, 1)
	rbuf := alloc(t, srv, 8, transport.AccessLocal, 0)
	if err := srv.PostRecv(transport.RecvWR{ID: 1, Buf: transport.Whole(rbuf)}); err != nil {
		t.Fatal(err)
	}
	if err := cli.Post(transport.SendWR{ID: 2, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}); err != nil {
		t.Fatal(err)
	}
	if c := e.collect(t, cli, 1)[0]; c.Conn != cli {
		t.Errorf("a send completion on a connection's own CQ names %v, not the connection", c.Conn)
	}
	if c := e.collect(t, srv, 1)[0]; c.Conn != srv {
		t.Errorf("a receive completion on a connection's own CQ names %v, not the connection", c.Conn)
	}
}

// srqPost posts n receives of 64 bytes of rbuf, IDs from first, to s.
func srqPost(t *testing.T, s transport.SRQ, rbuf transport.Region, first, n int) {
	t.Helper()
	wrs := make([]transport.RecvWR, n)
	for i := range wrs {
		id := first + i
		wrs[i] = transport.RecvWR{ID: uint64(id), Buf: transport.Segment{Region: rbuf, Offset: (id % (len(rbuf.Bytes()) / 64)) * 64, Length: 64}}
	}
	if err := s.PostRecv(wrs...); err != nil {
		t.Fatalf("SRQ.PostRecv: %v", err)
	}
}

func srqShared(t *testing.T, e *Env) {
	srvQ := newChooser(t, shareSRQ)
	clis, srvs := e.sharedPairs(t, 2, nil, srvQ)
	s := srvQ.queues(t).SRQ
	probe := alloc(t, srvs[0], 64, transport.AccessLocal, 0)
	if err := srvs[0].PostRecv(transport.RecvWR{Buf: transport.Whole(probe)}); err == nil {
		t.Error("Conn.PostRecv on a connection that takes its receives from an SRQ succeeded")
	}
	rbuf := alloc(t, srvs[0], 16*64, transport.AccessLocal, 0xEE)
	srqPost(t, s, rbuf, 0, 16)
	srcs := []transport.Region{alloc(t, clis[0], 64, transport.AccessLocal, 0), alloc(t, clis[1], 64, transport.AccessLocal, 0)}
	// One at a time, in an irregular order: each SEND takes the next
	// receive posted, whichever connection it comes by.
	order := []int{0, 1, 1, 0, 1, 0, 0, 1}
	for round, k := range order {
		msg := pattern(10+round, byte(round))
		copy(srcs[k].Bytes(), msg)
		if err := clis[k].Post(transport.SendWR{ID: uint64(round), Op: transport.OpSend, SGL: []transport.Segment{{Region: srcs[k], Length: len(msg)}}}); err != nil {
			t.Fatal(err)
		}
		want(t, "send", e.collect(t, clis[k], 1)[0], uint64(round), transport.OpSend, transport.StatusSuccess)
		c := e.collect(t, srvs[k], 1)[0]
		want(t, fmt.Sprintf("round %d: receive", round), c, uint64(round), transport.OpRecv, transport.StatusSuccess)
		if c.Conn != srvs[k] || c.Len != len(msg) {
			t.Errorf("round %d: receive names connection %v, Len %d; want connection %d, Len %d", round, c.Conn, c.Len, k, len(msg))
		}
		wantBytes(t, fmt.Sprintf("round %d: received", round), rbuf.Bytes()[round*64:round*64+len(msg)], msg)
	}
	// Both at once: the two connections share out the next receives, each
	// taking them in posting order.
	const each = 4
	var wg sync.WaitGroup
	for k := range clis {
		wg.Go(func() {
			for i := 0; i < each; i++ {
				if err := clis[k].Post(transport.SendWR{ID: uint64(100 + i), Op: transport.OpSend, SGL: []transport.Segment{{Region: srcs[k], Length: 8}}}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for k := range srvs {
		last := -1
		for _, c := range e.collect(t, srvs[k], each) {
			if c.Status != transport.StatusSuccess || c.Conn != srvs[k] || int(c.ID) <= last || c.ID < uint64(len(order)) || c.ID >= 16 {
				t.Errorf("connection %d: receive %+v (previous ID %d)", k, c, last)
			}
			last = int(c.ID)
			seen[c.ID] = true
		}
	}
	if len(seen) != 2*each {
		t.Errorf("the two connections took receives %v, want %d distinct ones", seen, 2*each)
	}
}

func srqReceiverNotReady(t *testing.T, e *Env) {
	var clis, srvs []transport.Conn
	var q transport.Queues
	var rbuf transport.Region
	var src transport.Region
	// A SEND that finds the SRQ empty waits for a receive posted in time.
	for attempt := 1; ; attempt++ {
		srvQ := newChooser(t, shareCQ|shareSRQ)
		clis, srvs = e.sharedPairs(t, 2, nil, srvQ)
		q = srvQ.queues(t)
		rbuf = alloc(t, srvs[0], 8*64, transport.AccessLocal, 0)
		src = alloc(t, clis[0], 64, transport.AccessLocal, 1)
		start := time.Now()
		if err := clis[0].Post(transport.SendWR{ID: 1, Op: transport.OpSend, SGL: []transport.Segment{{Region: src, Length: 16}}}); err != nil {
			t.Fatal(err)
		}
		wr := transport.RecvWR{ID: 0, Buf: transport.Segment{Region: rbuf, Length: 64}}
		inTime, err := e.postInTime(start, func() error { return q.SRQ.PostRecv(wr) })
		if !inTime {
			e.lateAttempt(t, attempt, start)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		break
	}
	want(t, "send that waited", e.collectWithin(t, clis[0], 1, e.RNRTimeout+e.Timeout)[0], 1, transport.OpSend, transport.StatusSuccess)
	if c := e.collectQ(t, q.SendCQ, 1)[0]; c.Conn != srvs[0] || c.ID != 0 || c.Status != transport.StatusSuccess {
		t.Errorf("receive after the wait: %+v", c)
	}
	// One that finds it empty for longer fails: receiver not ready.
	src1 := alloc(t, clis[1], 64, transport.AccessLocal, 2)
	crecv := alloc(t, clis[1], 64, transport.AccessLocal, 0)
	if err := clis[1].PostRecv(transport.RecvWR{ID: 3, Buf: transport.Whole(crecv)}); err != nil {
		t.Fatal(err)
	}
	e.wantRNR(t, clis[1], transport.SendWR{ID: 2, Op: transport.OpSend, SGL: []transport.Segment{{Region: src1, Length: 16}}}, 3)
	// The other connection on the SRQ carries on.
	srqPost(t, q.SRQ, rbuf, 1, 1)
	if err := clis[0].Post(transport.SendWR{ID: 4, Op: transport.OpSend, SGL: []transport.Segment{{Region: src, Length: 16}}}); err != nil {
		t.Fatal(err)
	}
	want(t, "send on the other connection", e.collect(t, clis[0], 1)[0], 4, transport.OpSend, transport.StatusSuccess)
	for _, c := range e.collectQ(t, q.SendCQ, 1) {
		if c.Conn != srvs[0] || c.ID != 1 || c.Status != transport.StatusSuccess {
			t.Errorf("receive on the other connection: %+v", c)
		}
	}
}

// limitQuiet is how long a case waits to be sure an event does not come.
const limitQuiet = 200 * time.Millisecond

func srqLimit(t *testing.T, e *Env) {
	srvQ := newChooser(t, shareSRQ)
	clis, srvs := e.sharedPairs(t, 1, nil, srvQ)
	cli, srv := clis[0], srvs[0]
	s := srvQ.queues(t).SRQ
	rbuf := alloc(t, srv, 32*64, transport.AccessLocal, 0)
	src := alloc(t, cli, 64, transport.AccessLocal, 1)
	next := 0 // the next SEND's ID, and the receive it takes
	send := func() {
		t.Helper()
		if err := cli.Post(transport.SendWR{ID: uint64(next), Op: transport.OpSend, SGL: []transport.Segment{{Region: src, Length: 8}}}); err != nil {
			t.Fatal(err)
		}
		want(t, "send", e.collect(t, cli, 1)[0], uint64(next), transport.OpSend, transport.StatusSuccess)
		want(t, "receive", e.collect(t, srv, 1)[0], uint64(next), transport.OpRecv, transport.StatusSuccess)
		next++
	}
	event := func(d time.Duration) bool {
		select {
		case <-s.LimitReached():
			return true
		case <-time.After(d):
			return false
		}
	}
	srqPost(t, s, rbuf, 0, 8)
	if err := s.SetLimit(4); err != nil {
		t.Fatalf("SetLimit(4): %v", err)
	}
	for i := 0; i < 4; i++ { // 8 → 4 posted: not below the limit
		send()
	}
	if event(limitQuiet) {
		t.Fatal("limit event with 4 receives posted and the limit at 4")
	}
	send() // 3 left: below
	if !event(e.Timeout) {
		t.Fatal("no limit event when the posted receives fell below the limit")
	}
	send() // 2 left: the limit disarmed itself
	if event(limitQuiet) {
		t.Error("a second limit event without re-arming")
	}
	// Replenish by load and arm again.
	srqPost(t, s, rbuf, 8, 8) // 10 posted
	if err := s.SetLimit(6); err != nil {
		t.Fatalf("SetLimit(6): %v", err)
	}
	for i := 0; i < 4; i++ { // 6 left
		send()
	}
	if event(limitQuiet) {
		t.Fatal("limit event at the limit after re-arming")
	}
	send() // 5 left
	if !event(e.Timeout) {
		t.Fatal("no limit event after replenishing and re-arming")
	}
	if err := s.SetLimit(0); err != nil {
		t.Errorf("SetLimit(0) (disarm): %v", err)
	}
	send()
	if event(limitQuiet) {
		t.Error("limit event while disarmed")
	}
}

func sharedCloseFlush(t *testing.T, e *Env) {
	srvQ := newChooser(t, shareCQ|shareSRQ)
	clis, srvs := e.sharedPairs(t, 2, nil, srvQ)
	q := srvQ.queues(t)
	rbuf := alloc(t, srvs[0], 4*64, transport.AccessLocal, 0)
	srqPost(t, q.SRQ, rbuf, 0, 4)
	// Server connection 0 has a SEND outstanding (its client posted no
	// receive) when it closes: it is flushed on the shared CQ, naming it.
	src := alloc(t, srvs[0], 64, transport.AccessLocal, 1)
	e.closeWithSend(t, srvs[0], q.SendCQ, transport.SendWR{ID: 7, Op: transport.OpSend, SGL: []transport.Segment{{Region: src, Length: 8}}})
	// The SRQ's receives were not flushed: the other connection gets the
	// first one posted.
	csrc := alloc(t, clis[1], 64, transport.AccessLocal, 2)
	if err := clis[1].Post(transport.SendWR{ID: 8, Op: transport.OpSend, SGL: []transport.Segment{{Region: csrc, Length: 12}}}); err != nil {
		t.Fatal(err)
	}
	want(t, "send on the other connection", e.collect(t, clis[1], 1)[0], 8, transport.OpSend, transport.StatusSuccess)
	c := e.collectQ(t, q.SendCQ, 1)[0]
	want(t, "receive on the other connection", c, 0, transport.OpRecv, transport.StatusSuccess)
	if c.Conn != srvs[1] || c.Len != 12 {
		t.Errorf("receive names %v with Len %d, want the open connection and 12", c.Conn, c.Len)
	}
	// The queues outlive neither rule: not closable while used, closable
	// after.
	if err := q.SendCQ.Close(); !errors.Is(err, transport.ErrInUse) {
		t.Errorf("closing a shared CQ a connection uses: %v, want ErrInUse", err)
	}
	if err := q.SRQ.Close(); !errors.Is(err, transport.ErrInUse) {
		t.Errorf("closing an SRQ a connection uses: %v, want ErrInUse", err)
	}
	if err := srvs[1].Close(); err != nil {
		t.Fatal(err)
	}
	if err := q.SendCQ.Close(); err != nil {
		t.Errorf("closing a shared CQ nobody uses: %v", err)
	}
	if err := q.SRQ.Close(); err != nil {
		t.Errorf("closing an SRQ nobody uses: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.Timeout)
	defer cancel()
	var buf [4]transport.Completion
	if _, err := q.SendCQ.Wait(ctx, buf[:]); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Wait on a closed shared CQ: %v, want ErrClosed", err)
	}
	if err := q.SRQ.PostRecv(transport.RecvWR{Buf: transport.Whole(rbuf)}); err == nil {
		t.Error("PostRecv on a closed SRQ succeeded")
	}
}
