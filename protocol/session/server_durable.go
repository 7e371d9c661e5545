package session

import (
	"crypto/rand"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// DefaultDurableTimeout is how long a durable open outlives its connection
// when ServerConfig.DurableTimeout is zero: SMB 3's default for durable
// handles v2 that ask for no particular timeout.
const DefaultDurableTimeout = 60 * time.Second

// identityKey is the key that seals file identities: kept in dir across
// restarts, or a fresh one per process when dir is empty.
func identityKey(dir string) ([]byte, error) {
	if dir != "" {
		return share.LoadIdentityKey(dir)
	}
	k := make([]byte, share.IdentityKeySize)
	_, err := rand.Read(k)
	return k, err
}

// newOpen registers what open opens on the session (newHandle: counted
// against the handle limits first): its handle, and when id is not zero
// the durable open the id names. It returns the OPEN answer.
func (s *Server) newOpen(ss *serverSession, id DurableID, open func() (*share.OpenFile, Attr, error)) (*openResp, error) {
	var a Attr
	hd, of, err := s.newHandle(ss, func() (f *share.OpenFile, err error) {
		f, a, err = open()
		return f, err
	})
	if err != nil {
		return nil, err
	}
	r := &openResp{Handle: hd, Attr: a}
	if !id.IsZero() {
		s.mu.Lock()
		of.durable = id
		if old := s.durables[id]; old != nil && old != of {
			// Two live opens cannot share an id; the older one keeps
			// its handle but is no longer durable.
			old.durable = DurableID{}
		}
		s.durables[id] = of
		s.mu.Unlock()
		r.FileID = of.file.FileID()
	}
	return r, nil
}

// open serves OPEN. One that repeats a known DurableID is a replay (its
// first answer was lost with the connection): it gets the open the first
// one made, never a second create — an O_EXCL create is not refused with
// EEXIST for having happened.
func (s *Server) open(ss *serverSession, tr *share.Tree, r *openReq) (message, error) {
	if !r.DurableID.IsZero() {
		of, err := s.claim(ss, tr, r.DurableID)
		if err != nil || of != nil {
			if err != nil {
				return nil, err
			}
			hd, a, err := s.adopt(ss, of)
			if err != nil {
				return nil, err
			}
			resp := &openResp{Handle: hd, Attr: a, FileID: of.file.FileID()}
			s.registerIfAsked(ss, r, resp)
			return resp, nil
		}
	}
	var resp *openResp
	var err error
	if r.Leased && r.Lease != 0 { // (Want 0: lease fields sent for the registration after them)
		resp, err = s.openLease(ss, tr, r)
	} else {
		resp, err = s.newOpen(ss, r.DurableID, func() (*share.OpenFile, Attr, error) {
			return tr.Open(r.Path, int(r.Flags), r.Mode)
		})
	}
	if err != nil {
		return nil, err
	}
	s.registerIfAsked(ss, r, resp)
	return resp, nil
}

// reopen serves REOPEN: the durable open itself while the server keeps it
// (reclaimed, with its locks), else the file re-opened by its sealed
// identity — the same file or STATUS_FILE_INVALID, never what now bears
// its name — as a new durable open under the same id.
func (s *Server) reopen(ss *serverSession, tr *share.Tree, r *reopenReq) (message, error) {
	if !r.DurableID.IsZero() {
		of, err := s.claim(ss, tr, r.DurableID)
		if err != nil {
			return nil, err
		}
		if of != nil {
			hd, a, err := s.adopt(ss, of)
			if err != nil {
				return nil, err
			}
			return &reopenResp{Handle: hd, Attr: a, Flags: reopenReclaimed}, nil
		}
	}
	if len(r.FileID) == 0 {
		return nil, ntstatus.FileInvalid
	}
	or, err := s.newOpen(ss, r.DurableID, func() (*share.OpenFile, Attr, error) {
		return tr.Reopen(r.FileID, r.Path, int(r.Flags))
	})
	if err != nil {
		return nil, err
	}
	return &reopenResp{Handle: or.Handle, Attr: or.Attr}, nil
}

// claim takes the durable open id for session ss: a parked one, or one
// still on another session of the same user whose connection the server
// has not yet seen die (a client that reconnects after a silent network
// failure). nil, nil when the server does not know the id. An id of
// another user or share is refused.
func (s *Server) claim(ss *serverSession, tr *share.Tree, id DurableID) (*openFile, error) {
	s.mu.Lock()
	of := s.durables[id]
	if of == nil {
		s.mu.Unlock()
		return nil, nil
	}
	if of.user != ss.user || of.file.Tree().Share() != tr.Share() {
		s.mu.Unlock()
		return nil, protocol.StatusAccessDenied
	}
	if of.parked != nil {
		of.parked.Stop()
		of.parked = nil
	}
	old := of.sess
	of.sess = ss
	s.mu.Unlock()
	if old != ss {
		old.mu.Lock()
		for h, o := range old.handles {
			if o == of {
				delete(old.handles, h)
			}
		}
		old.mu.Unlock()
		s.closeFidIn(old, of) // the Fid was the old session's
	}
	return of, nil
}

// adopt gives a claimed open a handle on ss. A session that holds no lock
// yet takes over the open's lock space, so that its owners' locks taken
// before the reconnect and after it are one owner's again.
func (s *Server) adopt(ss *serverSession, of *openFile) (Handle, Attr, error) {
	ss.mu.Lock()
	if of.locks != ss.locks && ss.locks.Empty() {
		ss.locks = of.locks
	}
	ss.mu.Unlock()
	hd, err := ss.addHandle(of, s.cfg.MaxHandles)
	if err != nil {
		s.release(of)
		return 0, Attr{}, err
	}
	a, err := of.file.Stat()
	return hd, a, err
}

// park keeps a durable open of session ss whose connection ended, for
// DurableTimeout, and reports whether it did; an open that moved to
// another session meanwhile is left alone (and reported kept).
func (s *Server) park(ss *serverSession, of *openFile) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if of.sess != ss {
		return true // claimed by a new session
	}
	if of.durable.IsZero() || s.durables[of.durable] != of || s.closing || ss.loggedOff.Load() || s.cfg.DurableTimeout < 0 {
		return false
	}
	timeout := s.cfg.DurableTimeout
	if timeout == 0 {
		timeout = DefaultDurableTimeout
	}
	of.parked = time.AfterFunc(timeout, func() { s.expire(of) })
	s.log.WithFields(logrus.Fields{"session": ss.id, "durable": shortID(of.durable), "timeout": timeout}).Debug("durable open kept for a reconnect")
	return true
}

// expire closes a parked open nobody reclaimed in time, with its locks.
func (s *Server) expire(of *openFile) {
	s.mu.Lock()
	if of.parked == nil {
		s.mu.Unlock()
		return // reclaimed meanwhile
	}
	of.parked = nil
	s.mu.Unlock()
	s.log.WithField("durable", shortID(of.durable)).Info("durable open not reclaimed in time: closed, its locks released")
	s.release(of)
}

// release closes an open that belongs to no session.
func (s *Server) release(of *openFile) {
	if err := s.closeOpen(of); err != nil {
		s.log.WithError(err).Debug("closing a durable open")
	}
}

// closeParked closes every parked open (server shutdown).
func (s *Server) closeParked() {
	s.mu.Lock()
	var ofs []*openFile
	for _, of := range s.durables {
		if of.parked != nil {
			of.parked.Stop()
			of.parked = nil
			ofs = append(ofs, of)
		}
	}
	s.mu.Unlock()
	for _, of := range ofs {
		s.release(of)
	}
}

// shortID is a durable id for logs.
func shortID(id DurableID) string {
	const hex = "0123456789abcdef"
	b := make([]byte, 8)
	for i := range 4 {
		b[2*i], b[2*i+1] = hex[id[i]>>4], hex[id[i]&15]
	}
	return string(b)
}
