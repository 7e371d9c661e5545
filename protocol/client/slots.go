package client

import (
	"context"
	"sync/atomic"

	"github.com/lwiofs/lwiofs/internal/enum"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/transport"
)

// This file is the request slot table: a connection's requests in flight,
// their states and the slots' reuse. Posting and completing are conn.go's.

// slotKind is what a slot's request is: its completion is handled by it.
type slotKind uint8

const (
	kindIO        slotKind = iota // READ, WRITE, VEC_*
	kindControl                   // REGISTER, CLOSE, CANCEL
	kindCredit                    // CREDIT answering a positive delta
	kindRetire                    // CREDIT giving a credit back
	kindInterrupt                 // INTERRUPT (polling wakeup)
)

// slotState is where a request is between its post and its slot's reuse.
// A requester waiting in wait or waitPoll moves Waiting to Done when the
// completion comes, or to Abandoned when its context ends first; then the
// completion moves Abandoned to Finished and frees the slot. A second
// completion for one cookie finds neither Waiting nor Abandoned and ends
// the connection.
type slotState int32

const (
	slotIdle      slotState = iota // free, or being filled
	slotWaiting                    // posted, the requester waits
	slotDone                       // completed and handed to the requester
	slotAbandoned                  // the requester left (context); the completion frees it
	slotFinished                   // abandoned and completed
)

var slotStateNames = [...]string{"idle", "waiting", "done", "abandoned", "finished"}

func (s slotState) String() string { return enum.Name(slotStateNames[:], s, "slotState") }

// atomicSlotState is a slotState changed by compare-and-swap, since the
// requester and the completion race for it.
type atomicSlotState struct{ v atomic.Int32 }

func (a *atomicSlotState) Load() slotState   { return slotState(a.v.Load()) }
func (a *atomicSlotState) Store(s slotState) { a.v.Store(int32(s)) }
func (a *atomicSlotState) CompareAndSwap(old, new slotState) bool {
	return a.v.CompareAndSwap(int32(old), int32(new))
}

type result struct {
	info uint32
	st   protocol.Status
}

// slot is one request in flight. Its cookie (generation<<16 | index) comes
// back in the STATUS_RESPONSE, and its low 32 bits as the immediate data,
// so a completion finds its slot by index, without a map or a lock.
type slot struct {
	c      *conn
	idx    uint16
	cookie atomic.Uint64
	send   transport.Region // header (+ regions or small data)
	remote transport.Region // IO_STATUS_BLOCK and bounce buffer, remote-writable
	segs   [2]transport.Segment
	wr     [1]transport.SendWR
	done   chan result
	poke   chan struct{} // a polling request's wakeup (pollSleepers)
	state  atomicSlotState
	// refs: the SEND completion, the request's completion and the
	// requester each hold one; the slot is free when all three let go.
	// A posted write's requester (WriteAsync) lets go once it is posted.
	refs    atomic.Int32
	buf     transport.Region      // data buffer, back to the pool with the slot
	data    transport.Segment     // a large write's data segment (in buf)
	ncred   int                   // credits the request took (a fragmented write: one per message)
	fwrs    []transport.SendWR    // a fragmented write's SENDs, kept for the next
	fsegs   []transport.Segment   // and their gather lists
	regions []protocol.RDMARegion // a VEC_READ's list, kept for the next
	// pw: a write WriteAsync posted. Its answer goes to pw, and the slot
	// is free once answered, not once the poster waits: writers keeping
	// writes in flight on many files would otherwise hold every slot with
	// writes already answered, and wait for a slot for good.
	pw      *PendingWrite
	kind    slotKind
	reqLen  uint32
	mode    Mode // wanted by the request (kindIO only)
	polling bool
}

func (sl *slot) unref() {
	if sl.refs.Add(-1) == 0 {
		sl.c.freeSlot(sl)
	}
}

func (c *conn) slotAt(i int) *slot {
	if i < 0 || i >= maxSlots {
		return nil
	}
	return c.slots[i].Load()
}

// getSlot returns a free slot, making one while fewer than maxSlots exist.
func (c *conn) getSlot(ctx context.Context) (*slot, error) {
	select {
	case sl := <-c.free:
		return sl, nil
	default:
	}
	if n := c.nslots.Add(1); n <= maxSlots {
		sl, err := c.newSlot(int(n - 1))
		if err != nil {
			c.nslots.Add(-1)
			return nil, err
		}
		return sl, nil
	}
	c.nslots.Add(-1)
	// Every slot is taken: the answers that free them (posted writes'
	// among them) are reaped at once rather than at the next idle look.
	signal(c.reapKick)
	select {
	case sl := <-c.free:
		return sl, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.dead:
		return nil, c.connErr()
	}
}

func (c *conn) newSlot(i int) (*slot, error) {
	dom := c.tc.Domain()
	send, err := dom.Alloc(sendAreaSize, transport.AccessLocal)
	if err != nil {
		return nil, err
	}
	remote, err := dom.Alloc(remoteAreaSize, transport.AccessLocal|transport.AccessRemoteWrite)
	if err != nil {
		send.Deregister()
		return nil, err
	}
	sl := &slot{c: c, idx: uint16(i), send: send, remote: remote, done: make(chan result, 1), poke: make(chan struct{}, 1)}
	c.slots[i].Store(sl)
	return sl, nil
}

func (c *conn) freeSlot(sl *slot) {
	if sl.buf != nil {
		if raceEnabled && sl.polling {
			// Written by the peer with no event the race detector
			// sees: not reused under -race (see poll_race.go).
			sl.buf.Deregister()
		} else {
			c.pool.Put(sl.buf)
		}
		sl.buf = nil
	}
	sl.pw = nil
	sl.state.Store(slotIdle)
	select {
	case c.free <- sl:
	default:
	}
}

// prepare readies sl for a request of kind: a fresh cookie (generation<<16
// | index) and its completion mode. It returns the Completion the request's
// protocol constructor takes (control requests use its Cookie): polling
// for an I/O request of a polling file, with the slot's status block armed,
// else interrupt mode with the cookie in both ImmediateCookie and Cookie.
// n is the file data an I/O request moves (Auto decides by it too).
func (c *conn) prepare(sl *slot, kind slotKind, n int) protocol.Completion {
	sl.kind = kind
	sl.polling = kind == kindIO && c.polls(sl.mode, n)
	cookie := (sl.cookie.Load()>>16+1)<<16 | uint64(sl.idx)
	sl.cookie.Store(cookie)
	if sl.polling {
		putPending(sl.remote.Bytes())
		return protocol.PollingMode(sl.remote.Addr(), sl.remote.Handle())
	}
	return protocol.InterruptMode(uint32(cookie), cookie)
}
