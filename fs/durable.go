package fs

import (
	"context"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// Durable handles on the mount's side (docs/session.md, "Durable
// handles"). Every open asks for one, under a DurableID of the mount's
// choosing. After a reconnect, before any other call runs, each open file
// is reclaimed with REOPEN: while the server kept it (the connection broke,
// the server lived) it is the same open with its locks; when the server
// lost it (a restart, the durable timeout) the file is re-opened by its
// sealed identity — the same file, wherever it was renamed to, or ESTALE if
// it was deleted or replaced — and if locks had been taken through it,
// they are gone: from then on its I/O and lock calls fail with EIO, so a
// program cannot go on believing it holds them (NFS's choice on lost
// locks). Close it and open the file again to go on.

// durableTree is the session channel's durable opens (*session.Tree).
type durableTree interface {
	OpenDurable(ctx context.Context, path string, flags int, mode uint32, id session.DurableID) (session.Handle, session.Attr, []byte, error)
	Reopen(ctx context.Context, id session.DurableID, fileID []byte, path string, flags int) (session.Handle, session.Attr, bool, error)
}

// durableLeaser is the session channel's durable opens with a lease
// (*session.Tree).
type durableLeaser interface {
	OpenDurableLease(ctx context.Context, path string, flags int, mode uint32, id session.DurableID, want LeaseState) (session.Handle, session.Attr, []byte, LeaseState, error)
}

// reopenFlags are the open flags a reopen keeps: the file exists (or is
// gone); it is never created, truncated or insisted on exclusively again.
func reopenFlags(flags int) int { return flags &^ (syscall.O_CREAT | syscall.O_EXCL | syscall.O_TRUNC) }

// open opens h's file on session s of generation gen: durable when the
// session offers it, with a lease of want (0: none) when it grants leases.
// A replay after a lost connection sends the same id, which the server
// answers with the open it made the first time — without a lease: the
// first one went with the lost session.
func (r *Reconnector) open(ctx context.Context, s *Session, gen uint64, h *vhandle, mode uint32, want LeaseState) (a session.Attr, got LeaseState, err error) {
	sl, leasing := leaser(s)
	d, ok := s.Tree.(durableTree)
	switch {
	case !ok && leasing && want != 0:
		h.real, a, got, err = sl.OpenLease(ctx, h.path, h.flags, mode, want)
		h.gen = gen
		return a, got, err
	case !ok:
		h.real, a, err = s.Tree.Open(ctx, h.path, h.flags, mode)
		h.gen = gen
		return a, 0, err
	}
	if h.id.IsZero() {
		h.id = session.NewDurableID()
	}
	var fid []byte
	if dl, ok := s.Tree.(durableLeaser); ok && leasing && want != 0 {
		h.real, a, fid, got, err = dl.OpenDurableLease(ctx, h.path, h.flags, mode, h.id, want)
	} else {
		h.real, a, fid, err = d.OpenDurable(ctx, h.path, h.flags, mode, h.id)
	}
	h.gen, h.fileID = gen, fid
	return a, got, err
}

// failed is the sticky error of a handle whose file is gone or whose
// locks were lost; called with h.mu held.
func (h *vhandle) failed() error {
	switch {
	case h.stale:
		return syscall.ESTALE
	case h.lost:
		return syscall.EIO
	}
	return nil
}

// reopen reclaims h on session s of generation gen; called with h.mu held.
func (r *Reconnector) reopen(ctx context.Context, s *Session, gen uint64, h *vhandle) error {
	d, ok := s.Tree.(durableTree)
	if !ok {
		return syscall.ESTALE // a durable open cannot be re-opened by path
	}
	real, _, reclaimed, err := d.Reopen(ctx, h.id, h.fileID, h.path, reopenFlags(h.flags))
	log := r.log.WithFields(logrus.Fields{"path": h.path, "generation": gen})
	if err != nil {
		if !protocol.IsConnectionLost(err) {
			log.WithError(err).Warn("fs: re-opening a file after reconnect failed")
			if e := ntstatus.ToErrno(err); e == syscall.ESTALE || e == syscall.ENOENT {
				h.stale = true
				return syscall.ESTALE
			}
		}
		return err
	}
	h.real, h.gen = real, gen
	if !reclaimed && len(h.owners) > 0 {
		h.lost = true
		log.Warn("fs: the server lost this file's locks (restarted, or kept them past its durable timeout): its I/O and lock calls fail with EIO until it is closed")
	}
	return nil
}

// reopenTimeout bounds the reopens after one reconnect.
const reopenTimeout = 30 * time.Second

// reopenAll reclaims every open file on the new session s (generation gen)
// before it serves anything — the locks of an idle program too, before the
// server's durable timeout — and closes the durable opens the mount let
// go of while disconnected.
func (r *Reconnector) reopenAll(s *Session, gen uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), reopenTimeout)
	defer cancel()
	r.closeOrphans(ctx, s)
	r.mu.Lock()
	hs := make(map[session.Handle]*vhandle, len(r.handles))
	for vh, h := range r.handles {
		hs[vh] = h
	}
	r.mu.Unlock()
	for vh, h := range hs {
		h.mu.Lock()
		var err error
		if h.gen != gen && h.failed() == nil && !h.id.IsZero() {
			err = r.reopen(ctx, s, gen, h)
		}
		real, now := h.real, h.gen == gen
		h.mu.Unlock()
		if protocol.IsConnectionLost(err) {
			return // the new session is gone too; the next one retries
		}
		r.mu.Lock()
		_, open := r.handles[vh]
		r.mu.Unlock()
		if !open && now {
			s.Tree.CloseHandle(ctx, real) // released meanwhile
		}
	}
}

// orphan remembers a durable open the mount closed while it could not
// tell the server; called with h.mu held.
func (r *Reconnector) orphan(h *vhandle) {
	if h.id.IsZero() {
		return
	}
	r.mu.Lock()
	r.orphans = append(r.orphans, h.id)
	r.mu.Unlock()
}

// closeOrphans reclaims and closes the durable opens the mount closed
// while disconnected, which the server would otherwise keep — with their
// locks — until its durable timeout.
func (r *Reconnector) closeOrphans(ctx context.Context, s *Session) {
	r.mu.Lock()
	ids := r.orphans
	r.orphans = nil
	r.mu.Unlock()
	d, ok := s.Tree.(durableTree)
	if !ok {
		return
	}
	for _, id := range ids {
		real, _, reclaimed, err := d.Reopen(ctx, id, nil, "", 0)
		if err == nil && reclaimed {
			s.Tree.CloseHandle(ctx, real)
		}
	}
}

// Locks across reconnects (Locker): forwarded on the live session with
// the handle's current real handle; the owners that take locks through a
// handle are remembered so that a reopen that lost them says so.

var (
	_ Locker   = (*Reconnector)(nil)
	_ Appender = (*Reconnector)(nil)
)

func (r *Reconnector) Lock(ctx context.Context, vh session.Handle, lk session.Lock, wait bool) error {
	taking := lk.Type != session.Unlock
	undo := func() {}
	if taking { // an unlock forgets the owner only once all is unlocked (below)
		undo = r.noteOwner(vh, lk.Owner, true)
	}
	err := r.withHandle(ctx, vh, func(s *Session, real session.Handle) error {
		l, ok := s.Tree.(Locker)
		if !ok {
			return syscall.ENOLCK
		}
		return l.Lock(ctx, real, lk, wait)
	})
	if err != nil && taking {
		undo()
	}
	if err == nil && !taking && (lk.Flock || lk.Start == 0 && lk.End == session.LockToEOF) {
		r.noteOwner(vh, lk.Owner, false)
	}
	return err
}

func (r *Reconnector) Unlock(ctx context.Context, vh session.Handle, owner uint64) error {
	err := r.withHandle(ctx, vh, func(s *Session, real session.Handle) error {
		l, ok := s.Tree.(Locker)
		if !ok {
			return syscall.ENOLCK
		}
		return l.Unlock(ctx, real, owner)
	})
	if err == nil {
		r.noteOwner(vh, owner, false)
	}
	return err
}

func (r *Reconnector) TestLock(ctx context.Context, vh session.Handle, lk session.Lock) (got session.Lock, err error) {
	err = r.withHandle(ctx, vh, func(s *Session, real session.Handle) error {
		l, ok := s.Tree.(Locker)
		if !ok {
			return syscall.ENOLCK
		}
		got, err = l.TestLock(ctx, real, lk)
		return err
	})
	return got, err
}

// noteOwner records (add) or forgets owner as holding locks through vh,
// and returns what undoes a record that was new — for a lock that then
// failed. An owner is recorded before its lock is asked for, so that a
// reconnect in between still counts it.
func (r *Reconnector) noteOwner(vh session.Handle, owner uint64, add bool) (undo func()) {
	r.mu.Lock()
	h := r.handles[vh]
	r.mu.Unlock()
	undo = func() {}
	if h == nil {
		return undo
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, had := h.owners[owner]
	switch {
	case add && !had:
		if h.owners == nil {
			h.owners = map[uint64]struct{}{}
		}
		h.owners[owner] = struct{}{}
		undo = func() { r.noteOwner(vh, owner, false) }
	case !add:
		delete(h.owners, owner)
	}
	return undo
}

// Append appends over the session channel; never replayed after the
// connection broke under it, since it may have been done.
func (r *Reconnector) Append(ctx context.Context, vh session.Handle, p []byte) (n int, end int64, err error) {
	err = r.onHandle(ctx, vh, false, func(s *Session, real session.Handle) error {
		ap, ok := s.Tree.(Appender)
		if !ok {
			n, err = s.Tree.WriteAt(ctx, real, p, appendAt)
			end = -1
			return err
		}
		n, end, err = ap.Append(ctx, real, p)
		return err
	})
	return n, end, err
}

// The session channel's tree has every optional call the mount uses.
var (
	_ durableTree = (*session.Tree)(nil)
	_ Locker      = (*session.Tree)(nil)
	_ Appender    = (*session.Tree)(nil)
)
