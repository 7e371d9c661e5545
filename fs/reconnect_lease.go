package fs

import (
	"context"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// The Reconnector's lease side: leases belong to one session, so the
// mount is told every lease is gone as soon as the connection is lost (it
// drops all it cached under them), and each new session forwards its
// breaks to the mount. Requests with lease fields go only to a session
// whose share grants leases; on another they go without, and grant none.

var _ SessionLeaser = (*Reconnector)(nil)

// leaser is s's tree when it grants leases.
func leaser(s *Session) (SessionLeaser, bool) {
	sl, ok := s.Tree.(SessionLeaser)
	return sl, ok && sl.Leases()
}

// Leases reports whether the live session's share grants leases.
func (r *Reconnector) Leases() bool {
	r.mu.Lock()
	s := r.cur
	r.mu.Unlock()
	if s == nil {
		return false
	}
	_, ok := leaser(s)
	return ok
}

// OnLeaseBreak sets the mount's break handler, for this session and every
// later one.
func (r *Reconnector) OnLeaseBreak(fn func(session.LeaseBreak) LeaseState) {
	r.mu.Lock()
	r.breakTo = fn
	s := r.cur
	r.mu.Unlock()
	if s != nil {
		forwardBreaks(s, fn)
	}
}

// forwardBreaks hands s's breaks to the mount's handler fn.
func forwardBreaks(s *Session, fn func(session.LeaseBreak) LeaseState) {
	if sl, ok := s.Tree.(SessionLeaser); ok && fn != nil {
		sl.OnLeaseBreak(fn)
	}
}

func (r *Reconnector) Lease(ctx context.Context, path string, want LeaseState) (a session.Attr, got LeaseState, err error) {
	err = r.do(ctx, true, func(s *Session, _ uint64) error {
		if sl, ok := leaser(s); ok {
			a, got, err = sl.Lease(ctx, path, want)
			return err
		}
		a, got = session.Attr{}, 0
		a, err = s.Tree.GetAttr(ctx, path)
		return err
	})
	return a, got, err
}

// ReleaseLeases gives up leases of the live session; those of a lost one
// went with it.
func (r *Reconnector) ReleaseLeases(ctx context.Context, inos []uint64) error {
	r.mu.Lock()
	s := r.cur
	r.mu.Unlock()
	if s == nil {
		return nil
	}
	if sl, ok := leaser(s); ok {
		return sl.ReleaseLeases(ctx, inos)
	}
	return nil
}

func (r *Reconnector) OpenLease(ctx context.Context, path string, flags int, mode uint32, want LeaseState) (session.Handle, session.Attr, LeaseState, error) {
	return r.openLeased(ctx, path, flags, mode, want)
}

func (r *Reconnector) MkdirLease(ctx context.Context, path string, mode uint32, want LeaseState) (a session.Attr, got LeaseState, err error) {
	err = r.do(ctx, false, func(s *Session, _ uint64) error {
		if sl, ok := leaser(s); ok {
			a, got, err = sl.MkdirLease(ctx, path, mode, want)
			return err
		}
		got = 0
		a, err = s.Tree.Mkdir(ctx, path, mode)
		return err
	})
	return a, got, err
}

func (r *Reconnector) ReadDirLease(ctx context.Context, path string, want, entryWant LeaseState) (ents []session.DirEntry, leases []LeaseState, got LeaseState, err error) {
	err = r.do(ctx, true, func(s *Session, _ uint64) error {
		if sl, ok := leaser(s); ok {
			ents, leases, got, err = sl.ReadDirLease(ctx, path, want, entryWant)
			return err
		}
		ents, err = s.Tree.ReadDir(ctx, path)
		leases, got = make([]LeaseState, len(ents)), 0
		return err
	})
	return ents, leases, got, err
}

// OpenLeaseAfter runs ops (changes held back of other files, as Batch)
// and then opens path as OpenLease does, in one BATCH. ran reports whether
// the OPEN ran — every op before it succeeded — and then h, a, got and err
// are its outcome; when it did not, res says which op failed (or err is
// the batch's failure as a whole) and the caller opens path alone. A
// session whose tree cannot put an OPEN in a BATCH (a test's fake) runs
// nothing: ran is false, res empty.
func (r *Reconnector) OpenLeaseAfter(ctx context.Context, ops []session.BatchOp, path string, flags int, mode uint32, want LeaseState) (res []session.BatchResult, h session.Handle, a session.Attr, got LeaseState, ran bool, err error) {
	vh := &vhandle{path: path, flags: flags}
	err = r.do(ctx, true, func(s *Session, gen uint64) error {
		res, ran = nil, false
		sl, leasing := leaser(s)
		_, durable := s.Tree.(durableLeaser)
		if !leasing || !durable || want == 0 {
			return nil
		}
		all, err := r.realOps(ctx, s, gen, ops)
		if err != nil {
			return err
		}
		if vh.id.IsZero() {
			vh.id = session.NewDurableID()
		}
		all = append(all, session.BatchOp{Command: session.CmdOpen, Path: path, Flags: flags, Mode: mode, Durable: vh.id, Lease: want})
		out, err := sl.Batch(ctx, all)
		if err != nil {
			return err
		}
		res = out
		if len(out) < len(all) {
			return nil // an op before the OPEN failed: it did not run
		}
		res, ran = out[:len(ops)], true
		o := out[len(ops)]
		if o.Status != protocol.StatusSuccess {
			return o.Status
		}
		vh.real, vh.gen, vh.fileID = o.Handle, gen, o.FileID
		a, got = o.Attr, o.Lease
		return nil
	})
	for _, x := range res {
		r.stats.countWrite(int(x.Count))
	}
	if !ran || err != nil {
		return res, 0, session.Attr{}, 0, ran, err
	}
	return res, r.addHandle(vh), a, got, true, nil
}

// realOps is ops with each handle's number on session s (generation gen).
func (r *Reconnector) realOps(ctx context.Context, s *Session, gen uint64, ops []session.BatchOp) ([]session.BatchOp, error) {
	real := make([]session.BatchOp, len(ops), len(ops)+1)
	for i, op := range ops {
		if op.Handle != 0 {
			h, err := r.realHandle(ctx, s, gen, op.Handle)
			if err != nil {
				return nil, err
			}
			op.Handle = h
		}
		real[i] = op
	}
	return real, nil
}

// Batch runs ops on the live session with each handle's number there
// (re-opening files after a reconnect); replayed, as its requests are
// writes at explicit offsets and absolute attribute changes.
func (r *Reconnector) Batch(ctx context.Context, ops []session.BatchOp) (res []session.BatchResult, err error) {
	err = r.do(ctx, true, func(s *Session, gen uint64) error {
		sl, ok := s.Tree.(SessionLeaser)
		if !ok {
			return errNotConnected
		}
		real, err := r.realOps(ctx, s, gen, ops)
		if err != nil {
			return err
		}
		res, err = sl.Batch(ctx, real)
		return err
	})
	for _, x := range res {
		r.stats.countWrite(int(x.Count)) // held-back writes are session-channel data too
	}
	return res, err
}

// CloseHandles closes handles of the live session; those of a lost one
// died with it. Their numbers are forgotten either way.
func (r *Reconnector) CloseHandles(ctx context.Context, vhs []session.Handle) error {
	r.mu.Lock()
	s, gen := r.cur, r.gen
	var real []session.Handle
	var hs []*vhandle
	for _, vh := range vhs {
		if h, ok := r.handles[vh]; ok {
			delete(r.handles, vh)
			hs = append(hs, h)
		}
	}
	r.mu.Unlock()
	for _, h := range hs {
		h.mu.Lock()
		if s != nil && h.gen == gen {
			real = append(real, h.real)
		} else {
			r.orphan(h) // durable: the server keeps it for a reclaim (CloseHandle)
		}
		h.mu.Unlock()
	}
	if len(real) == 0 {
		return nil
	}
	sl, ok := s.Tree.(SessionLeaser)
	if !ok {
		for _, h := range real {
			s.Tree.CloseHandle(ctx, h)
		}
		return nil
	}
	err := sl.CloseHandles(ctx, real)
	if protocol.IsConnectionLost(err) {
		// Which of them closed is unknown: reclaiming one the server
		// closed finds nothing, and one it kept is closed then.
		for _, h := range hs {
			h.mu.Lock()
			r.orphan(h)
			h.mu.Unlock()
		}
		return nil
	}
	return err
}
