package session

import (
	"context"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// Locks on the session channel: LOCK (29), UNLOCK (30), GETLK (31), and
// CANCEL (32), which ends a LOCK that waits. The server holds every lock on
// its own disk, so that it conflicts with other clients and with local
// processes (protocol/share, lock_linux.go); docs/session.md has the
// bodies.

// Lock is a lock request or a lock found (share's type): Owner, Start, End
// (inclusive; LockToEOF to the end of the file), Type, Flock.
type Lock = share.Lock

// Lock types and the end of a lock that runs to the end of the file.
const (
	LockRead  = share.LockRead
	LockWrite = share.LockWrite
	Unlock    = share.Unlock
	LockToEOF = share.LockToEOF
)

// Flags of a LOCK or GETLK request.
const (
	// lockWait: wait while another holder conflicts (F_SETLKW, a
	// blocking flock); the answer comes when the lock is taken or the
	// wait is cancelled.
	lockWait uint32 = 1 << 0
	// lockFlock: a whole-file flock(2) lock, apart from fcntl locks.
	lockFlock uint32 = 1 << 1

	lockFlagsKnown = lockWait | lockFlock
)

// StatusNotFound answers a CANCEL that names no pending request
// (STATUS_NOT_FOUND).
const StatusNotFound = protocol.Status(0xC0000225)

// lockReq is a LOCK or GETLK request.
type lockReq struct {
	Handle     Handle
	Owner      uint64
	Start, End uint64
	Type       uint32
	Flags      uint32
}

func (m *lockReq) code(c coder) {
	handle(c, &m.Handle)
	u64s(c, &m.Owner, &m.Start, &m.End)
	u32s(c, &m.Type, &m.Flags)
}

func (m *lockReq) lock() Lock {
	return Lock{Owner: m.Owner, Start: m.Start, End: m.End, Type: m.Type, Flock: m.Flags&lockFlock != 0}
}

func newLockReq(h Handle, lk Lock, flags uint32) *lockReq {
	if lk.Flock {
		flags |= lockFlock
	}
	return &lockReq{Handle: h, Owner: lk.Owner, Start: lk.Start, End: lk.End, Type: lk.Type, Flags: flags}
}

// unlockReq releases every lock Owner holds on the Handle's file.
type unlockReq struct {
	Handle Handle
	Owner  uint64
}

func (m *unlockReq) code(c coder) { handle(c, &m.Handle); c.u64(&m.Owner) }

// lockResp is GETLK's answer: the conflicting lock, or Type Unlock.
type lockResp struct {
	Type       uint32
	Start, End uint64
}

func (m *lockResp) code(c coder) { c.u32(&m.Type); u64s(c, &m.Start, &m.End) }

// cancelReq names the pending request to cancel by its MessageID.
type cancelReq struct{ MessageID uint64 }

func (m *cancelReq) code(c coder) { c.u64(&m.MessageID) }

// Lock sets or clears lk on h's file for lk.Owner. A conflict is
// STATUS_FILE_LOCK_CONFLICT (EAGAIN), unless wait: then the server waits
// for the holder, and when ctx ends first the wait is cancelled there
// (CANCEL) and Lock returns ctx's error — or nil if the lock was granted
// just before the cancel took: the lock is then held.
func (t *Tree) Lock(ctx context.Context, h Handle, lk Lock, wait bool) error {
	if !wait {
		return t.call(ctx, CmdLock, newLockReq(h, lk, 0), &empty{})
	}
	hd, err := t.c.exchange(ctx, CmdLock, t.id, newLockReq(h, lk, lockWait), &empty{}, t.c.cancelAndWait)
	if err != nil {
		return err
	}
	if hd.Status == protocol.StatusCancelled && ctx.Err() != nil {
		return ctx.Err()
	}
	return hd.Status.Err()
}

// Unlock releases every lock owner holds on h's file, fcntl and flock
// (what a close by the owner asks).
func (t *Tree) Unlock(ctx context.Context, h Handle, owner uint64) error {
	return t.call(ctx, CmdUnlock, &unlockReq{Handle: h, Owner: owner}, &empty{})
}

// TestLock returns the first lock that would conflict with lk (F_GETLK),
// or one of Type Unlock when none would. Who holds it is not told.
func (t *Tree) TestLock(ctx context.Context, h Handle, lk Lock) (Lock, error) {
	var r lockResp
	if err := t.call(ctx, CmdGetLk, newLockReq(h, lk, 0), &r); err != nil {
		return Lock{}, err
	}
	return Lock{Type: r.Type, Start: r.Start, End: r.End}, nil
}

// cancelWait bounds how long a cancelled request's own answer is waited
// for after the CANCEL went out.
const cancelWait = 5 * time.Second

// cancelAndWait is exchange's way out of a request whose caller gave up:
// CANCEL it on the server (SMB2 CANCEL: by MessageID) and wait for its own
// answer — STATUS_CANCELLED, or what it finished with before the cancel
// took. When none comes within cancelWait the request is abandoned.
func (c *Client) cancelAndWait(id uint64, ch chan Frame) (Frame, bool) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), cancelWait)
		defer cancel()
		if err := c.call(ctx, CmdCancel, 0, &cancelReq{MessageID: id}, &empty{}); err != nil {
			c.log.WithError(err).WithField("msgid", id).Debug("CANCEL")
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), cancelWait)
	defer cancel()
	if f, err := c.await(ctx, ch); err == nil {
		return f, true
	}
	return Frame{}, false
}
