package session

import (
	"syscall"

	"github.com/lwiofs/lwiofs/protocol/share"
)

// Registrar registers the files OPEN opens with the LWIO engine when the
// client asks (openReq's Register): the open answers with the Fid, so the
// data path needs neither a resume key nor a REGISTER round trip before
// its first byte. The LWIO server engine implements it; fileserver
// connects the two (SetRegistrar). The Fid is the session's, exactly as
// REGISTER by resume key would make it (FIG. 7B), and it goes when the
// handle closes.
type Registrar interface {
	// RegisterOpen registers f on session sessionID with
	// flagsAndAttributes (FIG. 7A's FlagsAndAttributes). ok is false when
	// the session has no LWIO connection or no Fid is free.
	RegisterOpen(sessionID uint64, f share.File, flagsAndAttributes uint32) (fid uint16, ok bool)
	// CloseOpen closes fid on session sessionID if it still names f, as
	// LWIO CLOSE would (FIG. 12A): the handle it was registered for closed.
	CloseOpen(sessionID uint64, fid uint16, f share.File)
}

// SetRegistrar makes OPEN register files with r when asked. Call it before
// Serve; without one, OPEN answers Fid 0 and the client registers by
// resume key.
func (s *Server) SetRegistrar(r Registrar) { s.registrar = r }

// registerOpen registers of's file for an OPEN that asked, recording the
// Fid in of so that closing the handle closes it. It returns the Fid, or 0.
func (s *Server) registerOpen(ss *serverSession, of *openFile, flags uint32) uint32 {
	if s.registrar == nil || of.file == nil {
		return 0
	}
	fid, ok := s.registrar.RegisterOpen(ss.id, of.file, flags)
	if !ok {
		return 0
	}
	of.fid.Store(uint32(fid))
	if of.closed.Load() {
		// Closed while it was registered (a client guessing handles):
		// closeOpen may have run before the Fid was recorded.
		s.closeFid(of)
		return 0
	}
	return uint32(fid)
}

// closeFid closes the Fid an OPEN registered for of, once.
func (s *Server) closeFid(of *openFile) { s.closeFidIn(of.sess, of) }

// closeFidIn closes the Fid of registered in session ss's LWIO engine
// (an open a new session claimed: its Fid was the old session's).
func (s *Server) closeFidIn(ss *serverSession, of *openFile) {
	if fid := of.fid.Swap(0); fid != 0 && s.registrar != nil {
		s.registrar.CloseOpen(ss.id, uint16(fid), of.file)
	}
}

// registerIfAsked registers the open resp answers with the session's LWIO
// engine when the OPEN asked and it is a regular file, and sets resp.Fid.
func (s *Server) registerIfAsked(ss *serverSession, r *openReq, resp *openResp) {
	if !r.Register || resp.Attr.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return
	}
	if of, ok := ss.handle(resp.Handle); ok {
		resp.Fid, resp.Registered = s.registerOpen(ss, of, r.FidFlags), true
	}
}
