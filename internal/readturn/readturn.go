// Package readturn ends a goroutine's turn at reading a socket when the
// goroutine's context ends, without losing or spoiling what the next
// reader reads: the protocol/session client's read token (a caller reading
// its own answer) and transport/soft's CQ.Wait (an application goroutine
// running the receive engine) use it.
package readturn

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Deadliner is the part of a net.Conn an Intr uses.
type Deadliner interface {
	SetReadDeadline(t time.Time) error
}

// Intr ends the current turn at a connection's reads. The rule that makes
// it safe: the read deadline is set in the past only while the turn's
// owner is blocked in read(2) (between Enter and Leave), and the owner
// clears it as soon as that read returns (Leave), before it or anyone else
// reads again; a turn ended between reads is remembered and its next read
// is not started (Enter reports false).
type Intr struct {
	nc      Deadliner
	mu      sync.Mutex
	turn    uint64 // the current turn; interruptions of another are stale
	stopped bool   // the current turn's context ended
	inRead  bool   // the owner is blocked in read(2)
	armed   bool   // the read deadline is in the past
}

// New returns an Intr for nc's reads.
func New(nc Deadliner) *Intr { return &Intr{nc: nc} }

// Begin starts a turn and returns its number.
func (i *Intr) Begin() uint64 {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.turn++
	i.stopped = false
	return i.turn
}

// BeginCtx starts a turn that ends when ctx does (Interrupt) and returns
// what stops that watch, for End; nil when ctx never ends.
func (i *Intr) BeginCtx(ctx context.Context) (unwatch func() bool) {
	turn := i.Begin()
	if ctx.Done() == nil {
		return nil
	}
	return context.AfterFunc(ctx, func() { i.Interrupt(turn) })
}

// End finishes the current turn, first stopping unwatch (BeginCtx's; nil
// for none): a late interruption of it is stale.
func (i *Intr) End(unwatch func() bool) {
	if unwatch != nil {
		unwatch()
	}
	i.mu.Lock()
	i.turn++
	i.stopped = false
	i.mu.Unlock()
}

// Interrupt ends turn: at once if its owner is blocked in read(2), else
// before its next read.
func (i *Intr) Interrupt(turn uint64) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if turn != i.turn {
		return
	}
	i.stopped = true
	if i.inRead && !i.armed {
		i.armed = true
		_ = i.nc.SetReadDeadline(time.Unix(1, 0))
	}
}

// Enter is called before a read; false: the turn has ended.
func (i *Intr) Enter() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.stopped {
		return false
	}
	i.inRead = true
	return true
}

// Leave is called as soon as the read returns; it clears a deadline the
// interruption set and reports whether the turn has ended.
func (i *Intr) Leave() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.inRead = false
	if i.armed {
		i.armed = false
		_ = i.nc.SetReadDeadline(time.Time{})
	}
	return i.stopped
}

// Reading reports whether the turn's owner is blocked in a read (for
// tests).
func (i *Intr) Reading() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.inRead
}

// StepAside is a reader goroutine leaving the socket to turns after it
// woke a turn's owner: it waits until yield has passed since the last turn
// ended (last: unix ns; a last turn ahead of the clock, stepped back
// since, does not hold it back), or until wake or done is ready (a nil
// one never is). It reports false when done was. t is the caller's timer,
// kept between calls (nil at first; the caller stops it when done).
func StepAside(t **time.Timer, yield time.Duration, last *atomic.Int64, wake, done <-chan struct{}) bool {
	for {
		if *t == nil {
			*t = time.NewTimer(yield)
		} else {
			(*t).Reset(yield)
		}
		select {
		case <-(*t).C:
			if d := time.Since(time.Unix(0, last.Load())); d >= 0 && d < yield {
				continue
			}
			return true
		case <-wake:
			(*t).Stop()
			return true
		case <-done:
			(*t).Stop()
			return false
		}
	}
}
