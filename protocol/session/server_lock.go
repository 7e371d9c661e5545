package session

import (
	"errors"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// errAnswerLater is what dispatch returns for a request it will answer
// itself later (a LOCK that waits): handle then sends nothing.
var errAnswerLater = errors.New("session: answered later")

// lock serves LOCK and GETLK on an open file. A LOCK that may wait is tried
// once at once; on a conflict it becomes a share.Waiter, remembered by
// MessageID for CANCEL, whose outcome is answered when it comes — the
// request holds no goroutine or MaxInFlight slot meanwhile.
func (s *Server) lock(ss *serverSession, h Header, of *openFile, r *lockReq) (message, error) {
	if r.Flags&^lockFlagsKnown != 0 {
		return nil, protocol.StatusInvalidParameter
	}
	lk := r.lock()
	if h.Command == CmdGetLk {
		got, err := of.locks.Test(of.file, lk)
		return &lockResp{Type: got.Type, Start: got.Start, End: got.End}, err
	}
	err := of.locks.Lock(of.file, lk)
	if r.Flags&lockWait == 0 || !share.IsLockConflict(err) {
		return &empty{}, err
	}
	w := of.locks.NewWaiter(of.file, lk, func(err error) {
		ss.mu.Lock()
		delete(ss.waits, h.MessageID)
		ss.mu.Unlock()
		ss.conn.respond(h, ntstatus.FromError(err), &empty{})
	})
	ss.mu.Lock()
	ss.waits[h.MessageID] = w
	ss.mu.Unlock()
	w.Start()
	return nil, errAnswerLater
}

// cancel serves CANCEL: the waiting request it names ends with
// STATUS_CANCELLED (answered before CANCEL is); STATUS_NOT_FOUND when it
// names none — it finished, or never waited.
func (s *Server) cancel(ss *serverSession, r *cancelReq) (message, error) {
	ss.mu.Lock()
	w := ss.waits[r.MessageID]
	ss.mu.Unlock()
	if w == nil || !w.Cancel() {
		return nil, StatusNotFound
	}
	return &empty{}, nil
}

// cancelWaits ends every lock wait of a session whose connection is gone.
func (ss *serverSession) cancelWaits() {
	ss.mu.Lock()
	ws := make([]*share.Waiter, 0, len(ss.waits))
	for _, w := range ss.waits {
		ws = append(ws, w)
	}
	ss.mu.Unlock()
	for _, w := range ws {
		w.Cancel()
	}
}

// LockWaits is how many LOCK requests wait on the server now, over every
// session.
func (s *Server) LockWaits() int { return s.lockTab.Waiting() }
