package session

import (
	"errors"
	"io"
	"os"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
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
	resp, err := c.s.dispatch(ss, f.Header, req)
	st := StatusFromError(err)
	if st != protocol.StatusSuccess {
		c.log.WithFields(logrus.Fields{"op": f.Command, "msgid": f.MessageID, "status": st}).WithError(err).Debug("request failed")
	}
	c.respond(f.Header, st, resp)
	return nil
}

// modifies lists the commands a read-only share refuses outright. OPEN is
// checked by its flags, WRITE and SETATTR-by-handle by the open.
var modifies = [cmdLimit]bool{
	CmdSetAttr: true, CmdMkdir: true, CmdRmdir: true, CmdWrite: true, CmdUnlink: true,
	CmdRename: true, CmdSymlink: true, CmdLink: true, CmdSetXattr: true, CmdRemoveXattr: true,
}

func (s *Server) dispatch(ss *serverSession, h Header, req message) (message, error) {
	switch h.Command {
	case CmdEcho:
		return &empty{}, nil
	case CmdTreeConnect:
		id, sh, err := s.treeConnect(ss, req.(*nameMsg).Name)
		if err != nil {
			return nil, err
		}
		var flags uint32
		if sh.ReadOnly {
			flags |= treeFlagReadOnly
		}
		if ss.treeSeals(id) {
			flags |= treeFlagSeal
		}
		return &treeConnectResp{TreeID: id, Flags: flags}, nil
	case CmdTreeDisconnect:
		ss.mu.Lock()
		_, ok := ss.trees[h.TreeID]
		delete(ss.trees, h.TreeID)
		ss.mu.Unlock()
		if !ok {
			return nil, StatusNetworkNameDeleted
		}
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
	}

	sh, ok := ss.tree(h.TreeID)
	if !ok {
		return nil, StatusNetworkNameDeleted
	}
	if sh.ReadOnly && modifies[h.Command] {
		return nil, protocol.StatusMediaWriteProtected
	}
	// open finds a handle of this tree.
	open := func(hd Handle) (*openFile, error) {
		of, ok := ss.handle(hd)
		if !ok || of.share != sh || of.f == nil {
			return nil, protocol.StatusInvalidHandle
		}
		return of, nil
	}
	switch r := req.(type) {
	case *nameMsg:
		switch h.Command {
		case CmdGetAttr:
			a, err := sh.getattr(r.Name)
			return &attrMsg{a}, err
		case CmdRmdir:
			return &empty{}, sh.remove(r.Name, unix.AT_REMOVEDIR)
		case CmdUnlink:
			return &empty{}, sh.remove(r.Name, 0)
		case CmdReadlink:
			t, err := sh.readlink(r.Name)
			return &dataMsg{[]byte(t)}, err
		case CmdListXattr:
			names, err := sh.listxattr(r.Name)
			return &namesMsg{names}, err
		}
	case *empty:
		if h.Command == CmdStatFS {
			st, err := sh.statfs()
			return &statFSMsg{st}, err
		}
	case *setAttrReq:
		if r.Handle != 0 {
			of, err := open(r.Handle)
			if err != nil {
				return nil, err
			}
			var a Attr
			err = withFd(of.f, func(fd int) error {
				var err error
				a, err = sh.setattrFd(fd, r.In)
				return err
			})
			return &attrMsg{a}, err
		}
		a, err := sh.setattr(r.Path, r.In)
		return &attrMsg{a}, err
	case *readDirReq:
		return sh.readdir(r, &ss.listing)
	case *mkdirReq:
		a, err := sh.mkdir(r.Path, r.Mode)
		return &attrMsg{a}, err
	case *openReq:
		of, a, err := sh.open(r.Path, int(r.Flags), r.Mode)
		if err != nil {
			return nil, err
		}
		of.sess = ss
		hd, err := ss.addHandle(of, s.cfg.MaxHandles)
		if err != nil {
			of.f.Close()
			return nil, err
		}
		return &openResp{Handle: hd, Attr: a}, nil
	case *readReq:
		of, err := open(r.Handle)
		if err != nil {
			return nil, err
		}
		if r.Length > MaxIOSize || r.Offset > 1<<63-1 {
			return nil, protocol.StatusInvalidParameter
		}
		buf := make([]byte, r.Length)
		n, err := of.f.ReadAt(buf, int64(r.Offset))
		if n > 0 || r.Length == 0 {
			err = nil // a short read is success: the client sees the count
		}
		return &dataMsg{buf[:n]}, ioErr(err)
	case *writeReq:
		of, err := open(r.Handle)
		if err != nil {
			return nil, err
		}
		if r.Offset > 1<<63-1 {
			return nil, protocol.StatusInvalidParameter
		}
		n, err := of.WriteAt(r.Data, int64(r.Offset))
		return &countMsg{uint32(n)}, ioErr(err)
	case *twoPathReq:
		switch h.Command {
		case CmdRename:
			return &empty{}, sh.rename(r.Old, r.New, r.Flags)
		case CmdLink:
			a, err := sh.link(r.Old, r.New)
			return &attrMsg{a}, err
		case CmdSymlink:
			a, err := sh.symlink(r.Old, r.New)
			return &attrMsg{a}, err
		}
	case *fsyncReq:
		of, err := open(r.Handle)
		if err != nil {
			return nil, err
		}
		// Really on disk before the answer: the client's fsync(2) promises it.
		return &empty{}, withFd(of.f, func(fd int) error {
			if r.Datasync {
				return unix.Fdatasync(fd)
			}
			return unix.Fsync(fd)
		})
	case *xattrReq:
		switch h.Command {
		case CmdGetXattr:
			v, err := sh.getxattr(r.Path, r.Name)
			return &dataMsg{v}, err
		case CmdSetXattr:
			return &empty{}, sh.setxattr(r.Path, r.Name, r.Value, int(r.Flags))
		case CmdRemoveXattr:
			return &empty{}, sh.removexattr(r.Path, r.Name)
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
		return &dataMsg{encodeResumeKey(k, `\\`+s.cfg.ServerName+`\`+sh.Name)}, nil
	}
	return nil, protocol.StatusInvalidDeviceRequest
}

// ioErr maps the errors of os.File reads and writes (which wrap errno in
// *PathError, or are io.EOF / os.ErrClosed) for StatusFromError.
func ioErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrClosed):
		return protocol.StatusFileClosed
	case errors.Is(err, io.EOF):
		return protocol.StatusEndOfFile
	}
	return err
}

// withFd runs fn with f's descriptor, holding it open for the call so that
// a concurrent CLOSE cannot let the number be reused under fn.
func withFd(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return ioErr(err)
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return ioErr(err)
	}
	return ferr
}
