package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/lwiofs/lwiofs/protocol"
)

// Tree is a connection to one share of a session. Paths are relative to
// the share root, slash-separated; "" is the root. Errors are
// protocol.Status values (ToErrno maps them) or connection errors wrapping
// ErrClosed. Safe for concurrent use.
type Tree struct {
	c        *Client
	id       uint32
	name     string
	readOnly bool
	leases   bool // the share grants leases (lease.go)
	account  Account
	shared   bool // treeFlagSharedAccount

	registerOnOpen atomic.Bool
	fidMu          sync.Mutex
	fids           map[Handle]OpenFid // handles OPEN registered with LWIO
}

// TreeConnect connects to share (a name, or \\server\share). An unknown
// share is STATUS_BAD_NETWORK_NAME, one the user may not use
// STATUS_ACCESS_DENIED, one that requires sealing on a session that cannot
// seal an error wrapping ErrSealRequired. When the share seals, every frame
// of the session is sealed from then on.
func (c *Client) TreeConnect(ctx context.Context, share string) (*Tree, error) {
	var r treeConnectResp
	if err := c.call(ctx, CmdTreeConnect, 0, &nameMsg{Name: share}, &r); err != nil {
		if errors.Is(err, StatusSealRequired) {
			return nil, fmt.Errorf("%w: share %q requires sealing (encrypt = required) and this session is not sealed", ErrSealRequired, share)
		}
		return nil, err
	}
	if r.Flags&treeFlagSeal != 0 {
		if c.seal.Load() == nil {
			err := errors.New("session: server seals a tree of a session without sealing keys")
			c.fail(err)
			return nil, err
		}
		c.startSealing("tree connect to " + share)
	}
	return &Tree{c: c, id: r.TreeID, name: share, readOnly: r.Flags&treeFlagReadOnly != 0,
		leases: r.Flags&treeFlagLeases != 0, account: r.Account, shared: r.Flags&treeFlagSharedAccount != 0}, nil
}

// ReadOnly reports whether the share refuses modifications.
func (t *Tree) ReadOnly() bool { return t.readOnly }

// Account is the Unix account on the server that every disk operation of
// this tree runs as: files the tree creates are owned by its Uid and Gid
// (docs/session.md, "Identity"). Callers must not modify Groups.
func (t *Tree) Account() Account { return t.account }

// SharedAccount reports whether the server acts as one account for every
// user (it was not started as root): Account is then the server's own,
// and the server's permission checks cannot tell users apart.
func (t *Tree) SharedAccount() bool { return t.shared }

// Client returns the session the tree belongs to.
func (t *Tree) Client() *Client { return t.c }

// Disconnect forgets the tree on the server. Handles opened on it stay
// open until closed or until the session ends.
func (t *Tree) Disconnect(ctx context.Context) error {
	return t.c.call(ctx, CmdTreeDisconnect, t.id, &empty{}, &empty{})
}

func (t *Tree) call(ctx context.Context, cmd Command, req, resp message) error {
	return t.c.call(ctx, cmd, t.id, req, resp)
}

// GetAttr returns the attributes of path, not following a final symlink
// (lstat).
func (t *Tree) GetAttr(ctx context.Context, path string) (Attr, error) {
	var r attrMsg
	err := t.call(ctx, CmdGetAttr, &nameMsg{Name: path}, &r)
	return r.Attr, err
}

// SetAttr changes the attributes in.Valid names, on the open handle h when
// it is non-zero, else on path (a final symlink is not followed), and
// returns the attributes after the change.
func (t *Tree) SetAttr(ctx context.Context, path string, h Handle, in SetAttrIn) (Attr, error) {
	var r attrMsg
	err := t.call(ctx, CmdSetAttr, &setAttrReq{Path: path, Handle: h, In: in}, &r)
	return r.Attr, err
}

// readDirPage is how many bytes of entries one READDIR asks for.
const readDirPage = 256 << 10

// ReadDir lists a directory with each entry's attributes (lstat), without
// "." and "..", sorted by name. Big directories come in several pages.
func (t *Tree) ReadDir(ctx context.Context, path string) ([]DirEntry, error) {
	var out []DirEntry
	after := ""
	for {
		var r readDirResp
		if err := t.call(ctx, CmdReadDir, &readDirReq{Path: path, After: after, MaxBytes: readDirPage}, &r); err != nil {
			return nil, err
		}
		out = append(out, r.Entries...)
		if !r.More || len(r.Entries) == 0 {
			return out, nil
		}
		after = r.Entries[len(r.Entries)-1].Name
	}
}

// Mkdir creates a directory with the permission bits of mode.
func (t *Tree) Mkdir(ctx context.Context, path string, mode uint32) (Attr, error) {
	var r attrMsg
	err := t.call(ctx, CmdMkdir, &mkdirReq{Path: path, Mode: mode}, &r)
	return r.Attr, err
}

// Rmdir removes an empty directory.
func (t *Tree) Rmdir(ctx context.Context, path string) error {
	return t.call(ctx, CmdRmdir, &nameMsg{Name: path}, &empty{})
}

// Open opens (with O_CREAT, creates) path with open(2) flags and mode and
// returns a handle and the file's attributes. A final symlink is followed,
// confined to the share, unless flags has O_NOFOLLOW. Only regular files
// and directories can be opened. O_DIRECT is not sent as an open flag: it
// only marks the LWIO registration unbuffered (RegisterOnOpen).
func (t *Tree) Open(ctx context.Context, path string, flags int, mode uint32) (Handle, Attr, error) {
	r, err := t.open(ctx, openReq{Path: path, Flags: uint32(flags), Mode: mode})
	return r.Handle, r.Attr, err
}

// open sends OPEN req (Flags still with O_DIRECT), asking for the LWIO
// registration when RegisterOnOpen is on and keeping the Fid answered.
func (t *Tree) open(ctx context.Context, req openReq) (openResp, error) {
	t.openPrep(&req)
	var r openResp
	err := t.call(ctx, CmdOpen, &req, &r)
	if err == nil {
		t.opened(&req, &r)
	}
	return r, err
}

// openPrep readies an OPEN request (alone or in a BATCH): O_DIRECT off
// the flags, and the LWIO registration asked for when RegisterOnOpen is on.
func (t *Tree) openPrep(req *openReq) {
	direct := req.Flags&syscall.O_DIRECT != 0
	req.Flags &^= syscall.O_DIRECT
	if t.registerOnOpen.Load() {
		req.Register = true
		if direct {
			req.FidFlags = protocol.FileNoIntermediateBuffering
		}
	}
}

// opened keeps the Fid a successful OPEN answered.
func (t *Tree) opened(req *openReq, r *openResp) {
	if r.Fid != 0 && r.Fid <= 0xFFFF {
		t.fidMu.Lock()
		if t.fids == nil {
			t.fids = map[Handle]OpenFid{}
		}
		t.fids[r.Handle] = OpenFid{Fid: uint16(r.Fid), FlagsAndAttributes: req.FidFlags}
		t.fidMu.Unlock()
	}
}

// OpenFid is an LWIO registration made by OPEN (RegisterOnOpen).
type OpenFid struct {
	Fid                uint16
	FlagsAndAttributes uint32
}

// RegisterOnOpen makes every later Open ask the server to register the
// file with the session's LWIO engine (an LWIO connection of this session
// must be authenticated) and keep the Fid it answers for Fid.
func (t *Tree) RegisterOnOpen(on bool) { t.registerOnOpen.Store(on) }

// Fid returns the LWIO Fid the server registered handle h as when it was
// opened, if it did. The Fid is the session's until the handle closes.
func (t *Tree) Fid(h Handle) (OpenFid, bool) {
	t.fidMu.Lock()
	defer t.fidMu.Unlock()
	f, ok := t.fids[h]
	return f, ok
}

// CloseHandle closes a handle; its resume key and the Fid OPEN registered
// it as die with it.
func (t *Tree) CloseHandle(ctx context.Context, h Handle) error {
	t.fidMu.Lock()
	delete(t.fids, h)
	t.fidMu.Unlock()
	return t.call(ctx, CmdClose, &handleMsg{Handle: h}, &empty{})
}

// ReadAt reads len(p) bytes at off through the session channel (the
// fallback data path), in MaxIOSize pieces. As io.ReaderAt, fewer bytes
// than asked come with io.EOF.
func (t *Tree) ReadAt(ctx context.Context, h Handle, p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		want := min(len(p)-n, MaxIOSize)
		var r dataMsg
		err := t.call(ctx, CmdRead, &readReq{Handle: h, Offset: uint64(off) + uint64(n), Length: uint32(want)}, &r)
		if err == protocol.StatusEndOfFile {
			return n, io.EOF
		}
		if err != nil {
			return n, err
		}
		if len(r.Data) > want {
			return n, protocol.StatusInvalidNetworkResp
		}
		copy(p[n:], r.Data)
		n += len(r.Data)
		if len(r.Data) < want {
			return n, io.EOF
		}
	}
	return n, nil
}

// WriteAt writes p at off through the session channel, in MaxIOSize
// pieces. A negative off appends, as Append does.
func (t *Tree) WriteAt(ctx context.Context, h Handle, p []byte, off int64) (int, error) {
	n, _, err := t.write(ctx, h, p, off)
	return n, err
}

// write writes p at off (off < 0: at the end of file, WriteToEndOfFile)
// in MaxIOSize pieces and returns the offset just past the last one.
func (t *Tree) write(ctx context.Context, h Handle, p []byte, off int64) (int, int64, error) {
	n := 0
	var end int64
	for {
		chunk := p[n:min(len(p), n+MaxIOSize)]
		at := WriteToEndOfFile
		if off >= 0 {
			at = uint64(off) + uint64(n)
		}
		var r writeResp
		if err := t.call(ctx, CmdWrite, &writeReq{Handle: h, Offset: at, Data: chunk}, &r); err != nil {
			return n, end, err
		}
		if int(r.Count) > len(chunk) || r.End > 1<<63-1 {
			return n, end, protocol.StatusInvalidNetworkResp
		}
		n += int(r.Count)
		end = int64(r.End)
		if int(r.Count) < len(chunk) {
			return n, end, io.ErrShortWrite
		}
		if n >= len(p) {
			return n, end, nil
		}
	}
}

// Unlink removes a non-directory (a final symlink itself, never its
// target).
func (t *Tree) Unlink(ctx context.Context, path string) error {
	return t.call(ctx, CmdUnlink, &nameMsg{Name: path}, &empty{})
}

// Rename renames oldPath to newPath with renameat2(2) flags
// (unix.RENAME_NOREPLACE, unix.RENAME_EXCHANGE).
func (t *Tree) Rename(ctx context.Context, oldPath, newPath string, flags uint32) error {
	return t.call(ctx, CmdRename, &twoPathReq{Old: oldPath, New: newPath, Flags: flags}, &empty{})
}

// Symlink creates path as a symlink whose text is target.
func (t *Tree) Symlink(ctx context.Context, target, path string) (Attr, error) {
	var r attrMsg
	err := t.call(ctx, CmdSymlink, &twoPathReq{Old: target, New: path}, &r)
	return r.Attr, err
}

// Readlink returns a symlink's text.
func (t *Tree) Readlink(ctx context.Context, path string) (string, error) {
	var r dataMsg
	err := t.call(ctx, CmdReadlink, &nameMsg{Name: path}, &r)
	return string(r.Data), err
}

// Link creates newPath as a hard link to oldPath (a final symlink is
// linked itself, not followed).
func (t *Tree) Link(ctx context.Context, oldPath, newPath string) (Attr, error) {
	var r attrMsg
	err := t.call(ctx, CmdLink, &twoPathReq{Old: oldPath, New: newPath}, &r)
	return r.Attr, err
}

// StatFS returns the statistics of the filesystem holding the share root.
func (t *Tree) StatFS(ctx context.Context) (StatFS, error) {
	var r statFSMsg
	err := t.call(ctx, CmdStatFS, &empty{}, &r)
	return r.StatFS, err
}

// Fsync flushes an open file to stable storage on the server before it
// answers (fdatasync when datasync).
func (t *Tree) Fsync(ctx context.Context, h Handle, datasync bool) error {
	return t.call(ctx, CmdFsync, &fsyncReq{Handle: h, Datasync: datasync}, &empty{})
}

// GetXattr returns the value of extended attribute name of path (a final
// symlink is not followed). A missing attribute is ENODATA through ToErrno.
func (t *Tree) GetXattr(ctx context.Context, path, name string) ([]byte, error) {
	var r dataMsg
	err := t.call(ctx, CmdGetXattr, &xattrReq{Path: path, Name: name}, &r)
	return r.Data, err
}

// SetXattr sets extended attribute name of path; flags are
// unix.XATTR_CREATE / unix.XATTR_REPLACE.
func (t *Tree) SetXattr(ctx context.Context, path, name string, value []byte, flags int) error {
	return t.call(ctx, CmdSetXattr, &xattrReq{Path: path, Name: name, Value: value, Flags: uint32(flags)}, &empty{})
}

// ListXattr returns the names of path's extended attributes.
func (t *Tree) ListXattr(ctx context.Context, path string) ([]string, error) {
	var r namesMsg
	err := t.call(ctx, CmdListXattr, &nameMsg{Name: path}, &r)
	return r.Names, err
}

// RemoveXattr removes extended attribute name of path.
func (t *Tree) RemoveXattr(ctx context.Context, path, name string) error {
	return t.call(ctx, CmdRemoveXattr, &xattrReq{Path: path, Name: name}, &empty{})
}

// RequestResumeKey asks for the open's server resume key
// (FSCTL_SRV_REQUEST_RESUME_KEY, seed FIG. 2 steps 205–207, FIG. 3): the
// 24-byte key and the UNC name \\server\share. The key is valid on this
// session only, until h is closed.
func (t *Tree) RequestResumeKey(ctx context.Context, h Handle) (protocol.ResumeKeyResponse, error) {
	var r dataMsg
	if err := t.call(ctx, CmdIoctl, &ioctlReq{Handle: h, CtlCode: FsctlSrvRequestResumeKey}, &r); err != nil {
		return protocol.ResumeKeyResponse{}, err
	}
	return protocol.DecodeResumeKeyResponse(r.Data)
}

// Negotiate runs the LWIO negotiate over \PIPE\LWIO (seed FIG. 2 steps
// 209–215): open the pipe, send the request (FIG. 4A), read the response
// (FIG. 4B) with the common providers and the Key to present in AUTH.
func (t *Tree) Negotiate(ctx context.Context, req protocol.NegotiateRequest) (protocol.NegotiateResponse, error) {
	b, err := req.Append(nil)
	if err != nil {
		return protocol.NegotiateResponse{}, err
	}
	var ph handleMsg
	if err := t.call(ctx, CmdPipeOpen, &nameMsg{Name: LWIOPipe}, &ph); err != nil {
		return protocol.NegotiateResponse{}, err
	}
	var r dataMsg
	err = t.call(ctx, CmdPipeTransact, &pipeTransactReq{Handle: ph.Handle, Data: b}, &r)
	if cerr := t.call(context.WithoutCancel(ctx), CmdClose, &handleMsg{Handle: ph.Handle}, &empty{}); err == nil {
		err = cerr
	}
	if err != nil {
		return protocol.NegotiateResponse{}, err
	}
	return protocol.DecodeNegotiateResponse(r.Data)
}
