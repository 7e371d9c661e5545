package soft

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// cq is a completion queue: a connection's own, or one made by
// QueueDomain.CreateCQ that several connections share. Only a connection's
// receive engine and, at the end, its final flush push its completions, so
// each connection's keep the order in which they were generated.
//
// Waiters sleep on a one-slot channel; a waiter that leaves completions
// behind passes the wake-up on, so no waiter sleeps while some are ready.
// A waiter on a connection's own queue may instead run the connection's
// receive engine itself (read, readside.go); on a shared queue, fed by
// several sockets, it sleeps and the connections' reader goroutines wake it.
type cq struct {
	pd *domain
	// owner is the connection whose own queue this is; nil when shared.
	owner *conn
	// read lets a waiter run the receive engine itself (conn.appRead);
	// nil on shared queues and with Faults.DelayCompletions.
	read func(ctx context.Context) bool
	// users are the connections a shared queue serves (copy on write), so
	// an idle waiter can send the acknowledgements they owe.
	users atomic.Pointer[[]*conn]

	waiting    atomic.Int32 // goroutines asleep in Wait
	wokeWaiter atomic.Bool  // a push found a goroutine asleep in Wait

	mu      sync.Mutex
	items   []cqItem
	head    int
	delayed int  // items with a ready time (Faults.DelayCompletions)
	closed  bool // no more pushes: drained, Wait returns ErrClosed
	shut    bool // a shared queue's Close: destroyed

	notify chan struct{} // one slot: "something was pushed"
	done   chan struct{} // closed when the queue is closed
}

type cqItem struct {
	c  transport.Completion
	at time.Time // ready time; zero unless delayed
}

var (
	_ transport.CQ       = (*cq)(nil)
	_ transport.SharedCQ = (*cq)(nil)
)

func newCQ(pd *domain, owner *conn) *cq {
	return &cq{pd: pd, owner: owner, notify: make(chan struct{}, 1), done: make(chan struct{})}
}

// push queues completions, each ready after delay (Faults.DelayCompletions).
func (q *cq) push(delay time.Duration, cs ...transport.Completion) {
	if len(cs) == 0 {
		return
	}
	var at time.Time
	if delay > 0 {
		at = time.Now().Add(delay)
	}
	q.mu.Lock()
	if q.shut {
		q.mu.Unlock()
		return
	}
	for _, c := range cs {
		q.items = append(q.items, cqItem{c: c, at: at})
	}
	if delay > 0 {
		q.delayed += len(cs)
	}
	q.mu.Unlock()
	if q.waiting.Load() > 0 {
		q.wokeWaiter.Store(true)
	}
	q.wake()
}

// ready reports whether completions are queued.
func (q *cq) ready() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head < len(q.items)
}

func (q *cq) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// close marks the end of a connection's own queue: once drained, Wait
// returns ErrClosed.
func (q *cq) close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.done)
	}
	q.mu.Unlock()
}

// attach makes c a user of the shared queue q.
func (q *cq) attach(c *conn) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.shut {
		return errors.New("softrdma: completion queue is closed")
	}
	old := q.users.Load()
	var us []*conn
	if old != nil {
		us = append(us, *old...)
	}
	us = append(us, c)
	q.users.Store(&us)
	return nil
}

// detach forgets c once it has delivered its last completion.
func (q *cq) detach(c *conn) {
	q.mu.Lock()
	defer q.mu.Unlock()
	old := q.users.Load()
	if old == nil {
		return
	}
	us := make([]*conn, 0, len(*old))
	for _, u := range *old {
		if u != c {
			us = append(us, u)
		}
	}
	q.users.Store(&us)
}

// Close destroys a shared queue: ErrInUse while a connection uses it.
func (q *cq) Close() error {
	if q.owner != nil {
		return errors.New("softrdma: a connection's own completion queue closes with the connection")
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.shut {
		return transport.ErrClosed
	}
	if us := q.users.Load(); us != nil && len(*us) > 0 {
		return transport.ErrInUse
	}
	q.shut = true
	clear(q.items)
	q.items, q.head, q.delayed = nil, 0, 0
	if !q.closed {
		q.closed = true
		close(q.done)
	}
	return nil
}

// idle sends the acknowledgements owed by the connections whose
// completions come here: the application found nothing to reap, so no
// answer is about to carry them.
func (q *cq) idle() {
	if q.owner != nil {
		q.owner.flushAck()
		return
	}
	if us := q.users.Load(); us != nil {
		for _, c := range *us {
			c.flushAck()
		}
	}
}

// poll copies out ready completions; it reports how many remain queued
// and, when the head is not yet due (DelayCompletions), when it will be.
func (q *cq) poll(out []transport.Completion) (n, left int, next time.Time, closed bool) {
	q.mu.Lock()
	var now time.Time
	if q.delayed > 0 {
		now = time.Now()
	}
	for n < len(out) && q.head < len(q.items) {
		it := &q.items[q.head]
		if !it.at.IsZero() {
			if it.at.After(now) {
				next = it.at
				break
			}
			q.delayed--
		}
		out[n] = it.c
		*it = cqItem{}
		n++
		q.head++
	}
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head > 1024 && q.head*2 > len(q.items) {
		m := copy(q.items, q.items[q.head:])
		q.items, q.head = q.items[:m], 0
	}
	left, closed = len(q.items)-q.head, q.closed
	q.mu.Unlock()
	return n, left, next, closed
}

// Poll returns ready completions without blocking.
func (q *cq) Poll(out []transport.Completion) int {
	n, left, _, _ := q.poll(out)
	if n > 0 && left > 0 {
		q.wake()
	}
	if n == 0 {
		q.idle()
	}
	return n
}

// Wait blocks until a completion is ready, ctx ends, or the queue is
// closed and empty (transport.ErrClosed).
func (q *cq) Wait(ctx context.Context, out []transport.Completion) (int, error) {
	if len(out) == 0 {
		return 0, nil
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		n, left, next, closed := q.poll(out)
		if n > 0 {
			if left > 0 {
				q.wake()
			}
			return n, nil
		}
		if closed && left == 0 {
			return 0, transport.ErrClosed
		}
		var due <-chan time.Time
		if !next.IsZero() {
			if timer == nil {
				timer = time.NewTimer(time.Until(next))
			} else {
				timer.Reset(time.Until(next))
			}
			due = timer.C
		}
		q.idle()
		if q.read != nil && !closed && ctx.Err() == nil && q.read(ctx) {
			continue
		}
		done := q.done
		if closed {
			done = nil // closed but a delayed completion is still due
		}
		q.waiting.Add(1)
		select {
		case <-q.notify:
		case <-done:
		case <-due:
		case <-ctx.Done():
			q.waiting.Add(-1)
			return 0, ctx.Err()
		}
		q.waiting.Add(-1)
	}
}
