package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/transport"
)

// servePeers authenticates n connections of n sessions with credits each,
// registers a file on each and reads it through every one.
func servePeers(t *testing.T, e *env, n, credits int) []*peer {
	t.Helper()
	var peers []*peer
	for i := range n {
		id := uint64(10 + i)
		key, signing := e.session(id)
		rk, _ := e.file(id, fmt.Sprintf("f%d", i), testutil.RandBytes(64<<10))
		p := e.dial()
		p.auth(key, signing, credits)
		fid := uint16(p.register(rk, id, 0).Ios.Information)
		peers = append(peers, p)
		for j := range 3 {
			p.read(fid, uint64(j)*4096, 4096, 1, uint64(j+1))
			p.WantImm("READ")
		}
	}
	return peers
}

// Connections take their receives from one shared receive queue (issue 20
// item 2): one queue however many connections, and buffers for the credits
// granted across them plus the headroom — not a queue, and an AUTH buffer,
// per connection.
func TestConnectionsShareReceiveQueue(t *testing.T) {
	e := newEnv(t, Config{Credits: 4})
	peers := servePeers(t, e, 3, 4)
	var bi BudgetInfo
	testutil.Eventually(t, "3 connections × 4 credits posted in one queue", 5*time.Second, func() bool { bi = e.srv.Budget(); return bi.RecvBuffers == 3*4+srqHeadroom })
	if bi.RecvQueues != 1 || bi.Granted != 12 || bi.Connections != 3 {
		t.Fatalf("3 connections of 4 credits: %+v, want 1 receive queue holding 13 buffers", bi)
	}
	p := sharedPool(t, e)
	if posted := postedIn(p); posted != 13 {
		t.Fatalf("%d receives posted to the shared queue with nothing outstanding, want 13", posted)
	}
	// Once the last connection has gone the queue goes with every buffer,
	// and the next connection gets a new one.
	for _, p := range peers {
		p.Conn.Close()
	}
	testutil.Eventually(t, "the queue and its buffers gone", 5*time.Second, func() bool { bi = e.srv.Budget(); return bi.RecvQueues == 0 && bi.RecvBuffers == 0 })
	servePeers(t, e, 1, 4)
	testutil.Eventually(t, "a new queue for the new connection", 5*time.Second, func() bool { bi = e.srv.Budget(); return bi.RecvQueues == 1 && bi.RecvBuffers == 4+srqHeadroom })
}

// postedIn is how many of p's buffers are posted, once nothing is in
// flight: those with memory that no request holds, and not spare.
func postedIn(p *recvPool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := -len(p.spare)
	for _, rb := range *p.bufs.Load() {
		if rb.region != nil && rb.owner.Load() == nil {
			n++
		}
	}
	return n
}

// sharedPool is the server's one shared receive queue.
func sharedPool(t *testing.T, e *env) *recvPool {
	t.Helper()
	e.srv.mu.Lock()
	defer e.srv.mu.Unlock()
	if len(e.srv.srqs) != 1 {
		t.Fatalf("%d shared receive queues, want 1", len(e.srv.srqs))
	}
	for _, p := range e.srv.srqs {
		if p != nil {
			return p
		}
	}
	t.Fatal("the domain has no shared receive queue")
	return nil
}

// noSharing is a QueueChooser that gives every connection its own queues.
type noSharing struct{}

func (*noSharing) ChooseQueues(transport.QueueDomain) (transport.Queues, error) {
	return transport.Queues{}, nil
}

// Where the provider gives a connection no shared receive queue, it gets
// its own, filled the same way, and freed with it.
func TestOwnReceiveQueues(t *testing.T) {
	for name, cfg := range map[string]Config{
		"chooser": {Credits: 4, Transport: transport.Config{Queues: &noSharing{}}},
		// lwio.toml's shared_receive_queue = false
		"PrivateReceiveQueues": {Credits: 4, PrivateReceiveQueues: true},
	} {
		t.Run(name, func(t *testing.T) { checkOwnReceiveQueues(t, cfg) })
	}
}

func checkOwnReceiveQueues(t *testing.T, cfg Config) {
	e := newEnv(t, cfg)
	peers := servePeers(t, e, 3, 4)
	var bi BudgetInfo
	testutil.Eventually(t, "three connections with 4 buffers each in their own queues", 5*time.Second, func() bool { bi = e.srv.Budget(); return bi.RecvBuffers == 3*4 })
	if bi.RecvQueues != 3 || bi.Granted != 12 {
		t.Fatalf("3 connections of 4 credits with their own queues: %+v, want 3 queues of 4 buffers", bi)
	}
	for _, p := range peers {
		p.Conn.Close()
	}
	testutil.Eventually(t, "the queues and buffers gone", 5*time.Second, func() bool { bi = e.srv.Budget(); return bi.RecvQueues == 0 && bi.RecvBuffers == 0 })
}

// A client sending beyond its credits takes receives posted for another's
// credits from the shared queue; its connection ends at the first surplus
// message and what it took is posted again at once — not when its slow
// requests finish — so the other client's requests go on.
func TestBeyondCreditsSparesOthers(t *testing.T) {
	e := newEnv(t, Config{})
	hostile, fid := heldReads(t, e)

	keyB, signingB := e.session(6)
	rkB, _ := e.file(6, "b", testutil.RandBytes(64<<10))
	b := e.dial()
	b.auth(keyB, signingB, 2)
	fidB := uint16(b.register(rkB, 6, 0).Ios.Information)

	// Its two reads held at the disk, it sends more than the shared queue
	// holds (2 + 2 credits and the headroom).
	for i := 0; i < 8; i++ {
		h := protocol.NewReadRequest(fid, 0, 10, hostile.Data.Addr(), hostile.Data.Handle(), 1, protocol.InterruptMode(1, uint64(i+3)))
		if !hostile.trySend(h.Append(nil)) {
			break
		}
	}
	hostile.WantClosed("requests beyond two credits")
	// Its connection is not torn down while its two reads are held at the
	// disk (their credits still count), but what it took beyond them is
	// posted again: every buffer, a READ giving its own back as it starts.
	p := sharedPool(t, e)
	testutil.Eventually(t, "the hostile client's buffers posted again", 5*time.Second, func() bool {
		return postedIn(p) == 2+2+srqHeadroom
	})
	for j := range 4 {
		b.read(fidB, 0, 4096, 1, uint64(j+1))
		b.WantImm(fmt.Sprintf("READ %d beside a hostile client", j))
	}
}

// A connection with a receive queue of its own that has not authenticated
// holds a small AUTH receive, not a full receive buffer (~132 KiB): a
// thousand idle TCP-like connections cost a megabyte. A message longer
// than an AUTH sent first ends the connection; an AUTH after it still
// gets the full buffers for its credits.
func TestPreAuthConnectionHoldsSmallReceive(t *testing.T) {
	e := newEnv(t, Config{Credits: 4, PrivateReceiveQueues: true})
	const n = 4
	var idle []*peer
	for range n {
		idle = append(idle, e.dial())
	}
	var bytes int64
	testutil.Eventually(t, "every connection's AUTH receive posted", 5*time.Second, func() bool {
		posted := 0
		bytes = 0
		for _, p := range e.srv.recvPools() {
			posted += postedIn(p)
			p.mu.Lock()
			for _, rb := range *p.bufs.Load() {
				if rb.region != nil {
					bytes += int64(len(rb.region.Bytes()))
				}
			}
			p.mu.Unlock()
		}
		return posted == n
	})
	if per := bytes / n; per > 4<<10 {
		t.Errorf("%d bytes registered per connection before AUTH, want at most 4 KiB (a full receive is %d)", per, e.srv.cfg.bufferBytes())
	}
	if st := e.srv.Stats(); st.RecvBufferBytes != bytes {
		t.Errorf("Stats().RecvBufferBytes = %d, want the %d registered", st.RecvBufferBytes, bytes)
	}

	// A 4 KiB message where the AUTH should be: the receive fails.
	idle[0].sendMsg(make([]byte, 4096))
	idle[0].WantClosed("a 4 KiB message before AUTH")
	// The others authenticate as usual and get full buffers.
	servePeers(t, e, 2, 4)
	testutil.Eventually(t, "2 connections × 4 full buffers", 5*time.Second, func() bool { return e.srv.Budget().RecvBuffers == 2*4 })
}
