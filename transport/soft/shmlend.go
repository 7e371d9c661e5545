package soft

import (
	"encoding/binary"
	"fmt"

	"github.com/lwiofs/lwiofs/transport"
)

// A SEND's data lent (transport.LentReader, docs/transport.md "SEND data
// lent"): a dialer's SEND by reference whose user marked it Lend carries
// its last reference as shmLent. The listener's reader checks it resolves
// (take, then release) and completes the receive with the bytes before it
// placed and the reference as Completion.Lent; the bytes stay in the
// dialer's arena. The listener's user then reads them where they are
// (PinLent: the slot taken, as a fill takes it, with the pages there) or
// has them copied behind the rest (PlaceLent: readRefs' copy, later and on
// the user's goroutine). The acknowledgement is unchanged: the SEND is
// acknowledged once its frame is read; the dialer's user keeps the bytes
// until its own protocol frees them (the LWIO client: the server's answer).

// lendLast marks the SEND's last entry (of its entries ents) lent when it
// is a reference: only a message's tail is lent.
func lendLast(ents []byte) {
	if i := len(ents) - shmEntrySize; i >= 0 && binary.LittleEndian.Uint32(ents[i:]) == shmRef {
		binary.LittleEndian.PutUint32(ents[i:], shmLent)
	}
}

// check reports whether the n bytes at addr of region handle resolve now.
func (pa *peerArena) check(handle uint32, addr uint64, n int) bool {
	pa.mu.RLock()
	defer pa.mu.RUnlock()
	_, slot, ok := pa.takeFor(handle, addr, n, false, false)
	if ok {
		release(pa.mem, slot)
	}
	return ok
}

var _ transport.LentReader = (*conn)(nil)

// PinLent is transport.LentReader's. It holds the mapping (pa.mu for
// reading) and the region's slot until UnpinLent. Like FillRemote it never
// queues behind an unmap: a connection's end with bytes pinned unmaps once
// they are let go (unmapSoon).
func (c *conn) PinLent(l transport.Lent) ([]byte, bool) {
	pa := c.peer
	if pa == nil || l.Length <= 0 || c.faults != nil {
		return nil, false
	}
	select {
	case <-c.closing:
		return nil, false
	default:
	}
	if !pa.mu.TryRLock() {
		return nil, false
	}
	start, _, ok := pa.takeFor(l.Handle, l.Addr, l.Length, false, true)
	if !ok {
		pa.mu.RUnlock()
		return nil, false
	}
	if pa.hook != nil {
		pa.hook()
	}
	c.p.shmPins.Add(1)
	end := start + uint64(l.Length)
	return pa.mem[start:end:end], true
}

// UnpinLent is transport.LentReader's.
func (c *conn) UnpinLent(l transport.Lent) {
	pa := c.peer
	release(pa.mem, int(l.Handle&(shmSlots-1)))
	pa.mu.RUnlock()
}

// PlaceLent is transport.LentReader's: the copy readRefs would have made.
// Like PinLent it never queues behind an unmap: on a connection whose end
// waits for a pin to unmap (a pwrite to a hung export), a read lock
// asked for would wait as long, holding the caller (a disk worker); the
// mapping is going, so the bytes are refused.
func (c *conn) PlaceLent(l transport.Lent, dst []byte) error {
	if len(dst) != l.Length {
		return fmt.Errorf("softrdma: %d lent bytes into %d", l.Length, len(dst))
	}
	pa := c.peer
	if pa == nil {
		return shmRefError{"lent bytes on a connection that maps no shared memory"}
	}
	if !pa.mu.TryRLock() {
		return fmt.Errorf("softrdma: lent bytes: the shared memory is being unmapped: %w", transport.ErrClosed)
	}
	ok := pa.copyFromLocked(dst, l.Handle, l.Addr)
	pa.mu.RUnlock()
	if !ok {
		return shmRefError{fmt.Sprintf("%d lent bytes at %#x of region %#x are not in the shared memory", l.Length, l.Addr, l.Handle)}
	}
	return nil
}
