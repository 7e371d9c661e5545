package soft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// The stress test's completion queues and receive buffers: an end's own,
// or shared by the ends of several connections (a completion queue made by
// QueueDomain.CreateCQ, a shared receive queue), as an engine running one CQ per
// CPU and one pool of receives would.

// Work request IDs: the kind in the top byte, the slot below.
const (
	idReq  = 1 << 56 // our request's work requests, slot i
	idAns  = 2 << 56 // our answer's work requests, peer slot j
	idRecv = 3 << 56 // a posted receive, buffer r of the end's pool
	idKind = 0xff << 56
)

// stressEvent is a completion routed to the goroutine it concerns.
type stressEvent struct {
	c    transport.Completion
	recv int    // receive buffer index in the pool (OpRecv)
	tag  uint32 // OpRecv: the message's tag
}

// stressQueue is a completion queue and how it is reaped: by one goroutine
// waiting (reapOne), by whoever waits for something taking the role
// (reapLead, with a background reaper), or by a polling loop (reapPoll).
type stressQueue struct {
	cq   transport.CQ
	mode stressMode
	// ends are the ends whose completions come here, by connection; fixed
	// before traffic starts.
	ends map[transport.Conn]*stressEnd

	role atomic.Bool  // reapLead: someone is reaping
	owed atomic.Int64 // reapLead: completions a worker or handler waits for
	kick chan struct{}

	progress *atomic.Int64
	failed   func(error)
}

func newStressQueue(cq transport.CQ, mode stressMode, progress *atomic.Int64, failed func(error)) *stressQueue {
	return &stressQueue{cq: cq, mode: mode, ends: map[transport.Conn]*stressEnd{}, kick: make(chan struct{}, 1),
		progress: progress, failed: failed}
}

// dispatch routes completions to the ends they name.
func (q *stressQueue) dispatch(cs []transport.Completion) {
	for _, c := range cs {
		q.progress.Add(1)
		e := q.ends[c.Conn]
		if e == nil {
			q.failed(fmt.Errorf("completion %+v names no connection of its queue", c))
			continue
		}
		e.route(c)
	}
}

// route hands a completion of e's to the inbox of the goroutine it concerns.
func (e *stressEnd) route(c transport.Completion) {
	if c.Status != transport.StatusSuccess {
		e.failed(fmt.Errorf("%s: completion %#x %v: %v", e.name, c.ID, c.Op, c.Status))
		return
	}
	slot := int(c.ID &^ idKind)
	ev := stressEvent{c: c}
	switch c.ID & idKind {
	case idReq:
	case idAns:
		slot += e.depth
	case idRecv:
		ev.recv = slot
		if c.HasImm && c.Len == 0 {
			ev.tag = c.Imm
		} else if c.Len >= stressHdr {
			ev.tag = binary.LittleEndian.Uint32(e.pool.buf(slot))
		} else {
			e.failed(fmt.Errorf("%s: %d-byte message without immediate", e.name, c.Len))
			return
		}
		slot = int(ev.tag >> 16 & 0x7fff)
		if ev.tag>>31 == 0 { // a request: its handler
			slot += e.depth
		}
	}
	if slot >= len(e.inbox) {
		e.failed(fmt.Errorf("%s: completion %+v for slot %d", e.name, c, slot))
		return
	}
	e.inbox[slot] <- ev
}

// errPolled: await found its memory condition true rather than an event.
var errPolled = errors.New("polled")

// await returns the next event for slot, reaping as the end's queue says,
// or errPolled as soon as polled (if not nil) reports true: an answer by
// RDMA WRITE alone produces no completion, so a polling requester looks at
// memory between waits. owed says an event is owed (an answer, a send
// completion) rather than unsolicited (the peer's next request): only
// owed events keep a reapLead queue's background reaper waiting, as in the
// client engine.
func (e *stressEnd) await(ctx context.Context, slot int, owed bool, polled func() bool, rng *rand.Rand) (stressEvent, error) {
	q := e.q
	ch := e.inbox[slot]
	if owed && q.mode == reapLead {
		q.owed.Add(1)
		defer q.owed.Add(-1)
	}
	var buf [16]transport.Completion
	for {
		select {
		case ev := <-ch:
			return ev, nil
		default:
		}
		if polled != nil && polled() {
			return stressEvent{}, errPolled
		}
		if ctx.Err() != nil {
			return stressEvent{}, ctx.Err()
		}
		if q.mode != reapLead || !q.role.CompareAndSwap(false, true) {
			// Follow: a reaper dispatches to us; look at memory now and
			// then, and for a leader that left.
			var after <-chan time.Time
			if polled != nil || q.mode == reapLead {
				after = time.After(time.Duration(50+rng.IntN(2000)) * time.Microsecond)
			}
			select {
			case ev := <-ch:
				return ev, nil
			case <-ctx.Done():
				return stressEvent{}, ctx.Err()
			case <-after:
			}
			continue
		}
		// Lead: reap until our own event is there, each Wait with a
		// deadline picked at random (interrupted waits are the point).
		var err error
		for len(ch) == 0 && (polled == nil || !polled()) && ctx.Err() == nil && err == nil {
			wctx, cancel := ctx, context.CancelFunc(func() {})
			switch rng.IntN(4) {
			case 1:
				wctx, cancel = context.WithTimeout(ctx, 50*time.Microsecond)
			case 2:
				wctx, cancel = context.WithTimeout(ctx, time.Millisecond)
			case 3:
				wctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
			default:
				if polled != nil { // a polling requester always bounds its wait
					wctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
				}
			}
			var n int
			n, err = q.cq.Wait(wctx, buf[:])
			cancel()
			q.dispatch(buf[:n])
			if err != nil && wctx.Err() != nil && ctx.Err() == nil {
				err = nil // our deadline, not the end
			}
		}
		q.role.Store(false)
		if q.owed.Load() > 0 {
			signal(q.kick)
		}
		if err != nil {
			return stressEvent{}, err
		}
	}
}

// background is a reapLead queue's background reaper: it takes the role
// when events are owed and nobody leads, keeps it while they are, and
// polls now and then when none are, as the client engine's does.
func (q *stressQueue) background(ctx context.Context) {
	var buf [64]transport.Completion
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		if q.role.CompareAndSwap(false, true) {
			for ctx.Err() == nil {
				var n int
				var err error
				if q.owed.Load() > 0 {
					n, err = q.cq.Wait(ctx, buf[:])
				} else {
					n = q.cq.Poll(buf[:])
				}
				q.dispatch(buf[:n])
				if err != nil {
					q.role.Store(false)
					return
				}
				if n == 0 && q.owed.Load() == 0 {
					break
				}
			}
			q.role.Store(false)
		}
		select {
		case <-q.kick:
		case <-tick.C:
		case <-ctx.Done():
		}
	}
}

// reaper is the reapOne and reapPoll queues' completion loop; a reapOne
// reaper waits with no deadline (end is only the harness's last resort)
// and returns when the queue is closed.
func (q *stressQueue) reaper(ctx, end context.Context) {
	var buf [64]transport.Completion
	for ctx.Err() == nil {
		var n int
		var err error
		if q.mode == reapOne {
			n, err = q.cq.Wait(end, buf[:])
		} else if n = q.cq.Poll(buf[:]); n == 0 {
			time.Sleep(20 * time.Microsecond)
		}
		q.dispatch(buf[:n])
		if err != nil {
			return
		}
	}
}

// reap runs the queue's reaping goroutine until ctx ends (and, for
// reapOne, the queue closes).
func (q *stressQueue) reap(ctx, end context.Context) {
	if q.mode == reapLead {
		q.background(ctx)
	} else {
		q.reaper(ctx, end)
	}
}

// stressPool is receive buffers of one size: an end's own, posted on its
// connection, or shared by several ends through a shared receive queue.
type stressPool struct {
	srq    transport.SRQ  // nil: post on conn
	conn   transport.Conn // the end whose own pool it is
	region transport.Region
	size   int
}

func newStressPool(d transport.Domain, n, size int, srq transport.SRQ, conn transport.Conn) (*stressPool, error) {
	r, err := d.Alloc(n*size, transport.AccessLocal)
	if err != nil {
		return nil, err
	}
	return &stressPool{srq: srq, conn: conn, region: r, size: size}, nil
}

func (p *stressPool) buf(r int) []byte { return p.region.Bytes()[r*p.size : (r+1)*p.size] }

// post posts receive buffer r.
func (p *stressPool) post(r int) error {
	wr := transport.RecvWR{ID: idRecv | uint64(r), Buf: transport.Segment{Region: p.region, Offset: r * p.size, Length: p.size}}
	if p.srq != nil {
		return p.srq.PostRecv(wr)
	}
	return p.conn.PostRecv(wr)
}

// repost gives receive buffer r back, at once or after a pause.
func (e *stressEnd) repost(r int, pause bool, rng *rand.Rand) error {
	if pause {
		time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
	}
	return e.pool.post(r)
}
