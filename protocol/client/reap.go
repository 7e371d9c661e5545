package client

import (
	"context"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// Completions are reaped by whoever holds the connection's reaper role
// (conn.reaping), one goroutine at a time, so they are dispatched in order:
//
//   - An interrupt-mode requester that finds the role free takes it and
//     waits on the CQ itself, dispatching every completion it finds (others'
//     go to their slots' channels) until its own has come; then it gives the
//     role back. At queue depth 1 the completion thus wakes the requester
//     straight from the provider, with no reaper goroutine in between, and
//     the provider's deferred acknowledgement rides on the next request
//     rather than going out as a message of its own.
//   - The background reaper (one goroutine per connection) takes the role
//     whenever completions are owed and nobody holds it, and keeps it while
//     they are owed. A requester leaving the role while others still wait
//     kicks it.
//   - A polling requester, once its status block has come, reaps what is in
//     the CQ (its SEND's completion) if the role is free (reapNow); one that
//     sleeps after sending an INTERRUPT takes the free role and reaps until
//     the answer comes (reapUntilWoken).
//   - While the connection's last I/O request was a polling one (lastPolled),
//     the background reaper keeps the role and waits on the CQ even with
//     nothing owed, as a plain reaper loop would: polling requests do not
//     wait on the CQ, and waking the reaper for each would cost more than
//     the hop saved. The next interrupt-mode request clears lastPolled, and the
//     role is free again after the next batch.
//   - A posted write (WriteAsync) has no requester waiting for its answer
//     (fs's write-behind waits only once its queue is full): posting it
//     kicks the background reaper, which reaps while it is owed, so the
//     answer frees its credits as it comes and the delta credits the
//     server sends behind it are seen. Left to the idle looks, the next
//     write waiting for those credits waited up to idlePollMax (bufw17:
//     the first buffered 1 MiB writes after an idle spell stalled 30–100
//     ms each in auto and interrupt mode, not in polling, whose reaper
//     kept the role after the polled writes that came first).
//   - With nothing owed, nobody waits on the CQ; the background reaper looks
//     every idlePoll (backing off to idlePollMax) for what the server sends
//     unasked (delta credits) and for the connection's death.

// idlePoll is how often an idle connection's CQ is looked at; the period
// doubles up to idlePollMax while the looks find nothing. Variables so
// that a test can make the looks rare: nothing a request waits for may
// depend on them.
var (
	idlePoll    = 10 * time.Millisecond
	idlePollMax = 160 * time.Millisecond
)

// dispatch handles a batch of completions; the caller holds the role.
func (c *conn) dispatch(wcs []transport.Completion) {
	for i := range wcs {
		wc := &wcs[i]
		if err := wc.Err(); err != nil {
			c.die(err)
			continue
		}
		switch wc.Op {
		case transport.OpRecv:
			c.onRecv(wc)
		default:
			if wc.ID == authID {
				continue
			}
			if wc.ID&fragID != 0 {
				c.expect.Add(-1) // a fragment's SEND; the last one frees the slot
				continue
			}
			if sl := c.slotAt(int(wc.ID)); sl != nil {
				c.expect.Add(-1)
				sl.unref()
			}
		}
	}
	if c.auto.sleepers.Load() > 0 {
		c.pollSleepers(false) // auto.go
	}
	if err := c.dying; err != nil {
		c.dying = nil
		c.die(err)
	}
}

// reapUntilDone is an interrupt-mode requester holding the role: it reaps until sl
// has its completion, then gives the role back. ok is false when it gave
// up (its context ended, the connection died): the caller then waits as a
// follower, which sorts out which.
func (c *conn) reapUntilDone(ctx context.Context, sl *slot) (r result, ok bool) {
	ok = c.reapUntil(ctx, func() bool {
		select {
		case r = <-sl.done:
			return true
		default:
			return false
		}
	})
	return r, ok
}

// reapUntil is a requester holding the role: it reaps until done reports
// true, then gives the role back; false when it gave up first (its context
// ended, the connection died).
func (c *conn) reapUntil(ctx context.Context, done func() bool) bool {
	defer c.releaseReaper()
	cq := c.tc.CQ()
	for !done() {
		n, err := cq.Wait(ctx, c.wcs[:])
		if err != nil {
			if ctx.Err() == nil {
				c.die(err)
			}
			return false
		}
		c.dispatch(c.wcs[:n])
		if !c.alive() {
			return false
		}
	}
	return true
}

// reapNow is a polling request whose status block has come: it looks at
// the CQ once if nobody is reaping, for its SEND's completion is there by
// now (the provider's acknowledgement arrives before the status block it
// rides with), so the slot is free again without waking anyone.
func (c *conn) reapNow() {
	if !c.reaping.CompareAndSwap(false, true) {
		return
	}
	n := c.tc.CQ().Poll(c.wcs[:])
	c.dispatch(c.wcs[:n])
	c.releaseReaper()
}

// releaseReaper gives the role back and wakes the background reaper if
// completions are still owed (or the connection is to be drained).
func (c *conn) releaseReaper() {
	c.reaping.Store(false)
	if c.expect.Load() > 0 || !c.alive() {
		signal(c.reapKick)
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// reap is the background reaper. It returns once the connection is dead
// and its CQ drained.
func (c *conn) reap() {
	cq := c.tc.CQ()
	defer c.pool.Drop()
	var wcs [64]transport.Completion
	idlePoll, idlePollMax := c.idlePoll[0], c.idlePoll[1]
	period := idlePoll
	idle := time.NewTimer(period)
	defer idle.Stop()
	dead := c.dead
	look := false
	for {
		if (look || c.expect.Load() > 0 || dead == nil) && c.reaping.CompareAndSwap(false, true) {
			look = false
			for first := true; ; first = false {
				var n int
				var err error
				if c.expect.Load() > 0 || !c.alive() || c.lastPolled.Load() {
					n, err = cq.Wait(context.Background(), wcs[:])
				} else {
					n = cq.Poll(wcs[:])
				}
				if err != nil {
					c.die(err)
					c.reaping.Store(false)
					return
				}
				c.dispatch(wcs[:n])
				if n > 0 && first {
					period = idlePoll
				}
				if n == 0 && c.expect.Load() <= 0 && c.alive() && !c.lastPolled.Load() {
					break
				}
			}
			c.reaping.Store(false)
			if c.expect.Load() > 0 {
				continue // a requester may have missed the role as it left
			}
		}
		select {
		case <-c.reapKick:
			period = idlePoll
		case <-idle.C:
			look = true
			idle.Reset(period)
			period = min(2*period, idlePollMax)
		case <-dead:
			dead = nil
		}
	}
}
