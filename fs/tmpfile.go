package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// O_TMPFILE on the mount (issue 23): open(dir, O_TMPFILE) makes an unnamed
// file on the server (TMPFILE), and the linkat(2) that names it —
// through /proc/self/fd/N with AT_SYMLINK_FOLLOW, or AT_EMPTY_PATH — comes
// here as FUSE_LINK of the unnamed node, which has no path to link by: it
// is linked by its open handle (LINKAT_HANDLE).

var _ = (gofs.NodeTmpfiler)((*Node)(nil))

// Tmpfile opens an unnamed regular file in this directory on the server.
// The node remembers its handle until it gets a name (linkTmp) or the
// handle is released.
func (n *Node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	ss, ok := n.serverSide()
	if !ok {
		return nil, nil, 0, syscall.EOPNOTSUPP
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	p := n.path()
	open := int(flags) &^ unix.O_TMPFILE // O_DIRECT stays, for the data path
	h, a, err := ss.Tmpfile(ctx, p, open&sessionOpenFlags, mode)
	if err != nil {
		return nil, nil, 0, n.errno("tmpfile", p, err)
	}
	n.fillAttr(&out.Attr, a) // the owner as shown here (issue 21)
	child := n.NewInode(ctx, &Node{fs: n.fs}, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: a.Ino})
	cn := child.Operations().(*Node)
	fh := cn.newHandle(joinPath(p, "(unnamed)"), h, open)
	cn.tmp.Store(fh)
	return child, fh, cn.openFlags(a, open), 0
}

// tmpHandle is the open handle of an unnamed (O_TMPFILE) node, nil once
// it has a name or its handle is gone.
func (n *Node) tmpHandle() *fileHandle {
	if n == nil {
		return nil
	}
	if fh := n.tmp.Load(); fh != nil && !fh.released.Load() {
		return fh
	}
	return nil
}

// linkTmp names the unnamed node target, open as fh, name in directory n
// (LINKAT_HANDLE). From then on the node has a path, and is linked and
// re-opened by it like any other.
func (n *Node) linkTmp(ctx context.Context, target *Node, fh *fileHandle, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ss, ok := n.serverSide()
	if !ok {
		return nil, syscall.EOPNOTSUPP
	}
	return n.makeChild(ctx, "link", name, out, target, func(ctx context.Context, p string) (session.Attr, LeaseState, error) {
		a, err := ss.LinkHandle(ctx, fh.h, p)
		if err == nil {
			target.tmp.CompareAndSwap(fh, nil)
		}
		return a, 0, err
	})
}

// Tmpfile runs TMPFILE on the live session. An unnamed file the server
// made for a request whose answer was lost died with that session (it had
// no name), so the request is safe to repeat. The handle has no path to be
// re-opened by after a reconnect until LinkHandle names it: its I/O then
// fails with ESTALE, as an unlinked file's does.
func (r *Reconnector) Tmpfile(ctx context.Context, dir string, flags int, mode uint32) (session.Handle, session.Attr, error) {
	var real session.Handle
	var a session.Attr
	var gen uint64
	err := r.onServer(ctx, true, func(ss ServerSide, g uint64, _ func(session.Handle) (session.Handle, error)) error {
		var err error
		real, a, err = ss.Tmpfile(ctx, dir, flags, mode)
		gen = g
		return err
	})
	if err != nil {
		return 0, a, err
	}
	return r.addHandle(&vhandle{flags: flags, real: real, gen: gen, unlinked: true}), a, nil
}

// LinkHandle runs LINKAT_HANDLE on the live session; a new name is not
// replayed (a second one would fail with EEXIST). Once named, the file
// re-opens by its new path after a reconnect.
func (r *Reconnector) LinkHandle(ctx context.Context, vh session.Handle, path string) (a session.Attr, err error) {
	err = r.serverSideHandle(ctx, vh, false, func(ss ServerSide, h session.Handle) error {
		a, err = ss.LinkHandle(ctx, h, path)
		return err
	})
	if err == nil {
		r.mu.Lock()
		h := r.handles[vh]
		r.mu.Unlock()
		if h != nil {
			h.mu.Lock()
			h.path, h.unlinked = path, false
			h.mu.Unlock()
		}
	}
	return a, err
}
