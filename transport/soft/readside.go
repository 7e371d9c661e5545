package soft

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
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
// and runs the same receive engine itself until a completion appears. The
// reader goroutine takes the token back as soon as no application
// goroutine has read for readYield, when a request must wait for a receive
// (receiver-not-ready), and when the connection fails. Placement never
// depends on the application: at worst it waits readYield for the reader
// goroutine.

// readYield is how long the reader goroutine leaves the socket to the
// application after handing it a completion.
const readYield = time.Millisecond

// errInterrupted: an application goroutine's wait for a header was
// interrupted (its context ended); the partial header stays buffered.
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
		c.cq.wokeWaiter.Store(false)
		r := c.step(false)
		c.rdMu.Unlock()
		if r == stepDone {
			break
		}
		if c.cq.wokeWaiter.Load() && c.cq.delay == 0 {
			c.yieldRead(&yield)
		}
	}
	if yield != nil {
		yield.Stop()
	}
	c.drainAfterNak()
}

// yieldRead leaves the socket to the application goroutine just woken,
// for as long as application goroutines keep reading it.
func (c *conn) yieldRead(t **time.Timer) {
	for {
		if *t == nil {
			*t = time.NewTimer(readYield)
		} else {
			(*t).Reset(readYield)
		}
		select {
		case <-(*t).C:
			if time.Since(time.Unix(0, c.lastAppRead.Load())) < readYield {
				continue
			}
			return
		case <-c.bgWake:
			(*t).Stop()
			return
		case <-c.closing:
			(*t).Stop()
			return
		}
	}
}

// appRead is CQ.Wait's turn at the socket: if the read side is free it
// runs the receive engine until a completion is queued, the context ends
// (interrupting a wait for a header), or a request needs the reader
// goroutine. It reports whether it read; false means the caller sleeps.
func (c *conn) appRead(ctx context.Context) bool {
	if !c.rdMu.TryLock() {
		return false
	}
	if c.pendValid || !c.isOpen() {
		c.rdMu.Unlock()
		signal(c.bgWake)
		return false
	}
	var stop func() bool
	if ctx.Done() != nil {
		epoch := c.intr.begin()
		stop = context.AfterFunc(ctx, func() { c.intr.interrupt(epoch) })
	}
	for {
		r := c.step(true)
		if r == stepHandoff {
			signal(c.bgWake)
			break
		}
		if r != stepOK || c.cq.ready() {
			break
		}
	}
	c.lastAppRead.Store(time.Now().UnixNano())
	// Clear an interruption before giving up the socket: the reader
	// goroutine must never read with the past deadline it left.
	if stop != nil {
		stop()
	}
	c.intr.reset(c)
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
	c.intr.mu.Lock()
	_ = c.nc.SetReadDeadline(time.Now().Add(drainTimeout))
	c.intr.mu.Unlock()
	_, _ = io.Copy(io.Discard, c.nc)
}

// readIntr lets a context end an application goroutine's blocking read of
// a header, by a past read deadline, without disturbing any other read.
type readIntr struct {
	nc        *net.TCPConn
	mu        sync.Mutex
	inRead    bool
	cancelled bool
	// epoch names one appRead's turn at the socket: an interruption meant
	// for an earlier turn (its context ended as that turn finished) must
	// not touch a later reader's read.
	epoch uint64
}

// begin starts a new turn and returns its epoch.
func (i *readIntr) begin() uint64 {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.epoch++
	return i.epoch
}

// interrupt cuts the blocking header read of turn epoch short.
func (i *readIntr) interrupt(epoch uint64) {
	i.mu.Lock()
	if i.inRead && i.epoch == epoch {
		i.cancelled = true
		_ = i.nc.SetReadDeadline(time.Unix(1, 0))
	}
	i.mu.Unlock()
}

// enter is called before the blocking read; false: already interrupted.
func (i *readIntr) enter() bool {
	i.mu.Lock()
	ok := !i.cancelled
	i.inRead = ok
	i.mu.Unlock()
	return ok
}

// leave is called after it and reports whether it was interrupted.
func (i *readIntr) leave() bool {
	i.mu.Lock()
	i.inRead = false
	was := i.cancelled
	i.mu.Unlock()
	return was
}

// reset clears an interruption's deadline, unless the connection is
// failing (then the deadline is drainAfterNak's business).
func (i *readIntr) reset(c *conn) {
	i.mu.Lock()
	i.epoch++ // a late interrupt for the turn just ended is stale now
	if i.cancelled {
		i.cancelled = false
		if c.isOpen() {
			_ = i.nc.SetReadDeadline(time.Time{})
		}
	}
	i.mu.Unlock()
}
