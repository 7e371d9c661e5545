package session

import (
	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// FSCTL_SRV_REQUEST_RESUME_KEY ([MS-SMB2] 2.2.31, [MS-FSCC] 2.3): the ioctl
// that returns an open's SRV_REQUEST_RESUME_KEY (seed FIG. 3).
const FsctlSrvRequestResumeKey uint32 = 0x00140078

// handle decodes and runs one request and answers it. A body that does not
// decode is returned as an error: the caller drops the connection.
func (c *serverConn) handle(ss *serverSession, f Frame) error {
	if f.Command >= cmdLimit || bodies[f.Command].req == nil {
		c.respond(f.Header, protocol.StatusNotImplemented, nil)
		return nil
	}
	req := bodies[f.Command].req()
	if err := unmarshal(f.Body, req); err != nil {
		return err
	}
	var resp message
	var err error
	if b, ok := req.(*batchReq); ok {
		var broken error
		onTree(ss, f.Header, func() { resp, err, broken = c.batch(ss, f.Header, b) })
		if broken != nil {
			return broken
		}
	} else {
		onTree(ss, f.Header, func() { resp, err = c.s.dispatch(ss, f.Header, req) })
		if err == errAnswerLater {
			return nil
		}
	}
	st := ntstatus.FromError(err)
	if st != protocol.StatusSuccess {
		c.log.WithFields(logrus.Fields{"op": f.Command, "msgid": f.MessageID, "status": st}).WithError(err).Debug("request failed")
	}
	c.respond(f.Header, st, resp)
	return nil
}

// onTree runs fn, the whole of one request, on one identity thread of the
// request's tree (share.Tree.Run) when the command is a namespace operation
// or a BATCH: its disk operations — an OPEN's open, attributes, file id and
// lease; a BATCH's writes, setattrs and closes — then cost one thread
// hand-off together instead of one each. Only commands whose handling is
// disk operations and bookkeeping qualify (treeWhole); the rest, and a
// request for a tree the session does not have, run fn here.
func onTree(ss *serverSession, h Header, fn func()) {
	tr, ok := ss.tree(h.TreeID)
	if !ok || !treeWhole(h.Command) {
		fn()
		return
	}
	tr.Run(func() error { fn(); return nil })
}

// treeWhole reports whether a request may run whole on its tree's identity
// thread (onTree): it does nothing that needs the server's own thread. Not
// REOPEN (an open by file handle needs CAP_DAC_READ_SEARCH), not LOCK (a
// waiting lock is answered later, by another goroutine), not the data,
// copy and listing commands (one disk operation each, or long).
func treeWhole(cmd Command) bool {
	switch cmd {
	case CmdBatch, CmdOpen, CmdMkdir, CmdSetAttr, CmdGetAttr, CmdLease, CmdUnlink, CmdRmdir, CmdRename,
		CmdSymlink, CmdLink:
		return true
	}
	return false
}

func (s *Server) dispatch(ss *serverSession, h Header, req message) (message, error) {
	switch h.Command {
	case CmdEcho:
		return &empty{}, nil
	case CmdIDMap:
		return s.mapID(req.(*idMapMsg))
	case CmdTreeConnect:
		id, tr, err := s.treeConnect(ss, req.(*nameMsg).Name)
		if err != nil {
			return nil, err
		}
		var flags uint32
		if tr.Share().ReadOnly {
			flags |= treeFlagReadOnly
		}
		if ss.leasing(tr) {
			flags |= treeFlagLeases
		}
		if ss.treeSeals(id) {
			flags |= treeFlagSeal
		}
		if !s.accounts.PerUser() {
			flags |= treeFlagSharedAccount
		}
		return &treeConnectResp{TreeID: id, Flags: flags, Account: tr.Identity().Account}, nil
	case CmdTreeDisconnect:
		ss.mu.Lock()
		tr, ok := ss.trees[h.TreeID]
		delete(ss.trees, h.TreeID)
		ss.mu.Unlock()
		if !ok {
			return nil, StatusNetworkNameDeleted
		}
		tr.Disconnect()
		return &empty{}, nil
	case CmdPipeOpen:
		return s.pipeOpen(ss, req.(*nameMsg).Name)
	case CmdPipeTransact:
		return s.pipeTransact(ss, req.(*pipeTransactReq))
	case CmdClose:
		of, ok := ss.removeHandle(req.(*handleMsg).Handle)
		if !ok {
			return nil, protocol.StatusInvalidHandle
		}
		return &empty{}, s.closeOpen(of)
	case CmdCancel:
		return s.cancel(ss, req.(*cancelReq))
	}

	tr, ok := ss.tree(h.TreeID)
	if !ok {
		return nil, StatusNetworkNameDeleted
	}
	open := func(hd Handle) (*openFile, error) { return ss.fileIn(tr, hd) }
	switch h.Command {
	case CmdCopyRange, CmdFallocate, CmdSeek, CmdTmpfile, CmdLinkHandle:
		return s.serverSide(ss, tr, h.Command, req)
	}
	if resp, err, ok := s.leaseDispatch(ss, tr, req); ok {
		return resp, err
	}
	// Every disk operation goes through the tree (protocol/share), which
	// also applies the read-only rule.
	switch r := req.(type) {
	case *nameMsg:
		switch h.Command {
		case CmdGetAttr:
			a, err := tr.GetAttr(r.Name)
			return &attrMsg{a}, err
		case CmdRmdir:
			return &empty{}, tr.Rmdir(r.Name)
		case CmdUnlink:
			return &empty{}, tr.Unlink(r.Name)
		case CmdReadlink:
			t, err := tr.Readlink(r.Name)
			return &dataMsg{[]byte(t)}, err
		case CmdListXattr:
			names, err := tr.ListXattr(r.Name)
			return &namesMsg{names}, err
		}
	case *empty:
		if h.Command == CmdStatFS {
			st, err := tr.StatFS()
			return &statFSMsg{st}, err
		}
	case *setAttrReq:
		if r.Handle == 0 {
			a, err := tr.SetAttr(r.Path, r.In)
			return &attrMsg{a}, err
		}
		of, err := open(r.Handle)
		if err != nil {
			return nil, err
		}
		a, err := of.file.SetAttr(r.In)
		return &attrMsg{a}, err
	case *readDirReq:
		return readDir(tr, r)
	case *mkdirReq:
		a, err := tr.Mkdir(r.Path, r.Mode)
		return &mkdirResp{Attr: a}, err
	case *mknodReq:
		a, err := tr.Mknod(r.Path, r.Mode, r.Rdev)
		return &attrMsg{a}, err
	case *openReq:
		return s.open(ss, tr, r)
	case *reopenReq:
		return s.reopen(ss, tr, r)
	case *lockReq:
		of, err := open(r.Handle)
		if err != nil {
			return nil, err
		}
		return s.lock(ss, h, of, r)
	case *unlockReq:
		of, err := open(r.Handle)
		if err != nil {
			return nil, err
		}
		return &empty{}, of.locks.UnlockOwner(of.file, r.Owner)
	case *readReq:
		of, err := open(r.Handle)
		if err != nil {
			return nil, err
		}
		if r.Length > MaxIOSize || r.Offset > 1<<63-1 {
			return nil, protocol.StatusInvalidParameter
		}
		buf := make([]byte, r.Length)
		n, err := of.file.ReadAt(buf, int64(r.Offset))
		if n > 0 || r.Length == 0 {
			err = nil // a short read is success: the client sees the count
		}
		return &dataMsg{buf[:n]}, err
	case *writeReq:
		of, err := open(r.Handle)
		if err != nil {
			return nil, err
		}
		if r.Offset == WriteToEndOfFile {
			n, end, err := of.file.Append(r.Data)
			return &writeResp{Count: uint32(n), End: uint64(end)}, err
		}
		if r.Offset > 1<<63-1 {
			return nil, protocol.StatusInvalidParameter
		}
		write := of.file.WriteAt
		if r.inRun {
			write = of.file.WriteAtInRun
		}
		n, err := write(r.Data, int64(r.Offset))
		return &writeResp{Count: uint32(n), End: r.Offset + uint64(n)}, err
	case *twoPathReq:
		switch h.Command {
		case CmdRename:
			return &empty{}, tr.Rename(r.Old, r.New, r.Flags)
		case CmdLink:
			a, err := tr.Link(r.Old, r.New)
			return &attrMsg{a}, err
		case CmdSymlink:
			a, err := tr.Symlink(r.Old, r.New)
			return &attrMsg{a}, err
		}
	case *fsyncReq:
		of, err := open(r.Handle)
		if err != nil {
			return nil, err
		}
		// Really on disk before the answer: the client's fsync(2) promises it.
		return &empty{}, of.file.Fsync(r.Datasync)
	case *xattrReq:
		switch h.Command {
		case CmdGetXattr:
			v, err := tr.GetXattr(r.Path, r.Name)
			return &dataMsg{v}, err
		case CmdSetXattr:
			return &empty{}, tr.SetXattr(r.Path, r.Name, r.Value, int(r.Flags))
		case CmdRemoveXattr:
			return &empty{}, tr.RemoveXattr(r.Path, r.Name)
		}
	case *ioctlReq:
		of, err := open(r.Handle)
		if err != nil {
			return nil, err
		}
		if r.CtlCode != FsctlSrvRequestResumeKey {
			return nil, protocol.StatusInvalidDeviceRequest
		}
		k, err := s.newResumeKey(of)
		if err != nil {
			return nil, err
		}
		return &dataMsg{encodeResumeKey(k, `\\`+s.cfg.ServerName+`\`+tr.Share().Name)}, nil
	}
	return nil, protocol.StatusInvalidDeviceRequest
}

// readDirMaxBytes bounds one READDIR page when the client asks for more.
const readDirMaxBytes = 512 << 10

// readDir answers one READDIR page: entries after r.After, as many as fit
// r.MaxBytes (at most readDirMaxBytes) of encoded body.
func readDir(tr *share.Tree, r *readDirReq) (*readDirResp, error) {
	max := int(r.MaxBytes)
	if max <= 0 || max > readDirMaxBytes {
		max = readDirMaxBytes
	}
	const head = 1 + 4 // More, Count
	ents, more, err := tr.ReadDir(r.Path, r.After, max-head, func(name string) int { return 2 + len(name) + attrWireSize })
	if err != nil {
		return nil, err
	}
	return &readDirResp{More: more, Entries: ents}, nil
}
