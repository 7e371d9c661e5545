package soft

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/lwiofs/lwiofs/internal/readturn"
)

// Who reads the socket.
//
// The connection's reader goroutine is the NIC: it places incoming data
// and generates completions whether or not the application is looking.
// But handing each completion from that goroutine to an application
// goroutine blocked in CQ.Wait costs a thread wake-up per message (the Go
// runtime wakes an idle P for the readied goroutine), which doubled a small
// round trip compared with a plain socket (docs/transport.md). So the read
// side is a token, c.rdMu: when the reader goroutine has just delivered a
// completion to a waiting application goroutine, it steps aside, and an
// application goroutine that finds its CQ empty in Wait takes the token
// and runs the same receive engine itself until a completion appears or
// its context ends. The reader goroutine takes the token back as soon as
// no application goroutine has read for readYield, when a payload has not
// fully arrived or a request must wait for a receive (receiver-not-ready),
// and when the connection fails. Placement never depends on the
// application: at worst it waits readYield for the reader goroutine.
//
// An application goroutine's turn at the socket ends when its context
// does, wherever it is: blocked in read(2) (readturn.Intr cuts the read
// short with a past read deadline, cleared before anyone reads again) or
// between reads (the next read is not started). Both halves matter: a turn
// that outlived its context held the socket with nothing more to come —
// the status block of a polling request lands by RDMA WRITE, with no
// completion — and the requester, whose wait was to end after 20 ms to
// look at that status block, never looked (issue 16); a read deadline
// left behind failed the next non-blocking read with a timeout and killed
// the connection. TestStress reproduces both against the first version of
// this file.
//
// And a turn starts only on an empty queue: between the waiter finding its
// CQ empty and taking the socket, the reader goroutine may have delivered
// a completion and let go of the socket (under load it can be preempted
// right there); a waiter that then read would block with the completion
// queued (TestWaitSeesWhatTheReaderPushed; seen once in test/load as a
// healthy connection waiting 30 s for an answer in its own CQ).

// readYield is how long the reader goroutine leaves the socket to the
// application after handing it a completion.
const readYield = time.Millisecond

// errInterrupted: an application goroutine's turn ended (its context did)
// while it waited for a header; a partial header stays buffered.
var errInterrupted = errors.New("softrdma: read interrupted")

// readLoop is the reader goroutine.
func (c *conn) readLoop() {
	defer c.exit()
	var yield *time.Timer
	for {
		c.rdMu.Lock()
		if !c.isOpen() {
			c.rdMu.Unlock()
			break
		}
		if c.own != nil {
			c.own.wokeWaiter.Store(false)
		}
		r := c.step(false)
		c.rdMu.Unlock()
		if r == stepDone {
			break
		}
		if h := c.hooks.Load(); h != nil && h.afterUnlock != nil {
			h.afterUnlock()
		}
		if c.own != nil && c.own.read != nil && c.own.wokeWaiter.Load() {
			// Leave the socket to the application goroutine just woken,
			// for as long as application goroutines keep reading it.
			readturn.StepAside(&yield, readYield, &c.lastAppRead, c.bgWake, c.closing)
		}
	}
	if yield != nil {
		yield.Stop()
	}
	c.drainAfterNak()
}

// appRead is CQ.Wait's turn at the socket: if the read side is free it
// runs the receive engine until a completion is queued, the context ends,
// or a request needs the reader goroutine. It reports whether it read;
// false means the caller sleeps.
func (c *conn) appRead(ctx context.Context) bool {
	if h := c.hooks.Load(); h != nil && h.beforeTurn != nil {
		h.beforeTurn()
	}
	if !c.rdMu.TryLock() {
		return false
	}
	if c.pendValid || !c.isOpen() {
		c.rdMu.Unlock()
		signal(c.bgWake)
		return false
	}
	if c.own.ready() {
		// The reader goroutine delivered a completion after the caller
		// found the queue empty and let go of the socket before we took
		// it. Completions are pushed only by whoever holds the socket,
		// so from here on none can come unseen: the check is needed
		// once, before the first read, and after each step.
		c.rdMu.Unlock()
		return true
	}
	unwatch := c.intr.BeginCtx(ctx)
	for {
		r := c.step(true)
		if h := c.hooks.Load(); h != nil && h.afterStep != nil {
			h.afterStep()
		}
		if r == stepHandoff {
			signal(c.bgWake)
			break
		}
		if r != stepOK || c.own.ready() {
			break
		}
	}
	c.intr.End(unwatch)
	// An acknowledgement owed for what this turn placed rides on the
	// application's answer, or goes after ackFallback: the reader
	// goroutine, which would otherwise arm that timer, is not reading.
	if c.placed.Load() != c.ackSent.Load() {
		c.deferAck()
	}
	c.lastAppRead.Store(time.Now().UnixNano())
	c.rdMu.Unlock()
	return true
}

func (c *conn) isOpen() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st == stateOpen
}

// drainAfterNak keeps reading, after this end sent a NAK, until the peer
// closes (or drainTimeout), so the NAK is not lost to a TCP reset.
func (c *conn) drainAfterNak() {
	c.mu.Lock()
	nak := c.fail1.nak
	c.mu.Unlock()
	if !nak {
		return
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(drainTimeout))
	_, _ = io.Copy(io.Discard, c.nc)
}
