package soft

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// cq is a connection's completion queue. Only the connection's reader
// goroutine and, at the end, its final flush push to it, so completions
// keep the order in which they were generated.
//
// Waiters sleep on a one-slot channel; a waiter that leaves completions
// behind passes the wake-up on, so no waiter sleeps while some are ready.
type cq struct {
	delay time.Duration // Faults.DelayCompletions
	idle  func()        // called when the application finds nothing to reap
	// read lets a waiter run the receive engine itself (conn.appRead).
	read func(ctx context.Context) bool

	waiting    atomic.Int32 // goroutines asleep in Wait
	wokeWaiter atomic.Bool  // a push found a goroutine asleep in Wait

	mu     sync.Mutex
	items  []cqItem
	head   int
	closed bool

	notify chan struct{} // one slot: "something was pushed"
	done   chan struct{} // closed when the queue is closed
}

type cqItem struct {
	c  transport.Completion
	at time.Time // ready time; zero unless delay > 0
}

var _ transport.CQ = (*cq)(nil)

func newCQ(delay time.Duration) *cq {
	return &cq{delay: delay, notify: make(chan struct{}, 1), done: make(chan struct{})}
}

func (q *cq) push(cs ...transport.Completion) {
	if len(cs) == 0 {
		return
	}
	var at time.Time
	if q.delay > 0 {
		at = time.Now().Add(q.delay)
	}
	q.mu.Lock()
	for _, c := range cs {
		q.items = append(q.items, cqItem{c: c, at: at})
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

// close marks the end of the queue: once drained, Wait returns ErrClosed.
func (q *cq) close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.done)
	}
	q.mu.Unlock()
}

// poll copies out ready completions; it reports how many remain queued
// and, when the head is not yet due (DelayCompletions), when it will be.
func (q *cq) poll(out []transport.Completion) (n, left int, next time.Time, closed bool) {
	q.mu.Lock()
	var now time.Time
	if q.delay > 0 {
		now = time.Now()
	}
	for n < len(out) && q.head < len(q.items) {
		it := &q.items[q.head]
		if q.delay > 0 && it.at.After(now) {
			next = it.at
			break
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
	if n == 0 && q.idle != nil {
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
		if q.idle != nil {
			q.idle()
		}
		if q.read != nil && q.delay == 0 && !closed && ctx.Err() == nil && q.read(ctx) {
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
