package client

import (
	"context"
	"runtime"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
)

// waitPoll is the polling-mode wait (FIG. 8, "Wakeup of Client in Polling
// Mode"): spin on the status block for SpinTime, then send an INTERRUPT
// and sleep until the server's next completion wakes us.
func (c *conn) waitPoll(ctx context.Context, sl *slot) (result, error) {
	ios := sl.remote.Bytes()[:protocol.IOStatusBlockSize]
	if r, ok := pollIOS(ios); ok {
		return c.polled(sl, r), nil
	}
	if !raceEnabled && c.shouldSpin() {
		// Spin, yielding between looks: on a machine with few cores the
		// goroutines that deliver the completion need the CPU we would
		// burn. Only a few requests per connection spin at once, and only
		// while spinning pays (see shouldSpin); the rest sleep until an
		// INTERRUPT's answer wakes them.
		start := time.Now()
		for time.Since(start) < c.cl.cfg.SpinTime {
			runtime.Gosched()
			if r, ok := pollIOS(ios); ok {
				c.spun(true)
				return c.polled(sl, r), nil
			}
		}
		c.spun(false)
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	backoff := 50 * time.Microsecond
	c.auto.sleepers.Add(1)
	defer c.auto.sleepers.Add(-1)
	for {
		c.intrMu.Lock()
		wake := c.wake
		c.intrMu.Unlock()
		// An interrupt-mode I/O in flight is a doorbell: its completion
		// looks at our status block (auto.go). Else an INTERRUPT.
		armed := c.auto.doorbells.Load() > 0 || c.requestInterrupt()
		if r, ok := pollIOS(ios); ok {
			return c.polled(sl, r), nil
		}
		if armed && c.reaping.CompareAndSwap(false, true) {
			// Reap until the INTERRUPT's answer (or our status block)
			// comes, rather than have another goroutine woken for it.
			if r, ok := c.reapUntilWoken(ctx, sl, wake); ok {
				return c.polled(sl, r), nil
			}
		}
		// Look again after a while even with an INTERRUPT armed. Unarmed
		// (no credit for an INTERRUPT: every credit is a request in flight)
		// that is soon. Armed, it covers a status block still on its way
		// when we looked just now: the server may have finished before our
		// INTERRUPT reached it, and then holds the INTERRUPT until its next
		// I/O completion, which may never come.
		wait := backoff
		if armed {
			wait = armedRecheck
		} else {
			backoff = min(2*backoff, time.Millisecond)
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		tick := timer.C
		select {
		case <-wake:
		case <-sl.poke:
		case <-tick:
		case <-ctx.Done():
			if r, ok := pollIOS(ios); ok {
				return c.polled(sl, r), nil
			}
			go func() {
				// Keep watching so that the slot, its buffer and the credit
				// come back when the server is done with them.
				if _, err := c.waitPoll(context.Background(), sl); err == nil {
					sl.unref()
				}
			}()
			return result{}, ctx.Err()
		case <-c.dead:
			if r, ok := pollIOS(ios); ok {
				return c.polled(sl, r), nil // written before the end
			}
			return result{}, c.connErr()
		}
		if r, ok := pollIOS(ios); ok {
			return c.polled(sl, r), nil
		}
	}
}

// armedRecheck is how often a sleeping polling request looks at its status
// block although an INTERRUPT is armed to wake it.
const armedRecheck = 20 * time.Millisecond

// reapUntilWoken holds the reaper role for a sleeping polling request: it reaps
// until wake closes or sl is poked, the status block shows a result (ok) or
// it must give up (context, connection); it gives the role back before
// returning.
func (c *conn) reapUntilWoken(ctx context.Context, sl *slot, wake chan struct{}) (result, bool) {
	ios := sl.remote.Bytes()[:protocol.IOStatusBlockSize]
	cq := c.tc.CQ()
	defer c.releaseReaper()
	for {
		select {
		case <-wake:
			return pollIOS(ios)
		case <-sl.poke:
			r, ok := pollIOS(ios)
			if !ok {
				signal(sl.poke) // the caller's select looks again at once
			}
			return r, ok
		default:
		}
		// Bounded, for the reason armedRecheck gives.
		wctx, cancel := context.WithTimeout(ctx, armedRecheck)
		n, err := cq.Wait(wctx, c.wcs[:])
		cancel()
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return result{}, false
			case wctx.Err() != nil:
				return pollIOS(ios)
			}
			c.die(err)
			return result{}, false
		}
		c.dispatch(c.wcs[:n])
		if r, ok := pollIOS(ios); ok {
			return r, true
		}
		if !c.alive() {
			return result{}, false
		}
	}
}

func (c *conn) polled(sl *slot, r result) result {
	sl.state.Store(slotDone)
	c.credits.ReleaseN(sl.ncred)
	sl.unref() // the completion's reference
	c.reapNow()
	return r
}

// requestInterrupt makes sure an INTERRUPT (FIG. 9A) is outstanding; false
// if none could be sent for want of a credit.
func (c *conn) requestInterrupt() bool {
	c.intrMu.Lock()
	if c.intrOut {
		c.intrMu.Unlock()
		return true
	}
	if !c.credits.TryCharge() {
		c.intrMu.Unlock()
		return false
	}
	c.intrOut = true
	c.intrMu.Unlock()
	sl, err := c.getSlot(context.Background())
	if err != nil {
		c.credits.Release()
		c.intrMu.Lock()
		c.intrOut = false
		c.intrMu.Unlock()
		return false
	}
	sl.ncred = 1
	h := protocol.NewInterruptRequest(c.hint(), c.prepare(sl, kindInterrupt, 0).Cookie)
	c.cl.ctr.interrupts.Add(1)
	if err := c.post(sl, &h, protocol.HeaderSize, nil); err != nil {
		c.intrMu.Lock()
		c.intrOut = false
		c.intrMu.Unlock()
		return false
	}
	// Nobody waits on the slot: the wake channel is the answer.
	if sl.state.CompareAndSwap(slotWaiting, slotAbandoned) {
		return true
	}
	<-sl.done
	sl.unref()
	return true
}

// shouldSpin decides whether a polling request spins before it sleeps: only
// maxSpinners at once per connection, and only while recent spins mostly
// saw their completion (a spin that fails costs a core and then the
// INTERRUPT round trip anyway). Every 64th request probes again.
func (c *conn) shouldSpin() bool {
	if c.spinScore.Load() <= 0 && c.spinSkips.Add(1)%64 != 0 {
		return false
	}
	if c.spinners.Add(1) > maxSpinners {
		c.spinners.Add(-1)
		return false
	}
	return true
}

// spun records a spin's outcome.
func (c *conn) spun(won bool) {
	c.spinners.Add(-1)
	if s := c.spinScore.Load(); won && s < 16 {
		c.spinScore.Add(1)
	} else if !won && s > -16 {
		c.spinScore.Add(-2)
	}
}
