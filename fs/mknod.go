package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// Mknoder is the session channel's MKNOD (*session.Tree, *Reconnector,
// *MultiUser).
type Mknoder interface {
	Mknod(ctx context.Context, path string, mode, rdev uint32) (session.Attr, error)
}

var _ = (gofs.NodeMknoder)((*Node)(nil))

// Mknod makes a FIFO, a UNIX-domain socket (bind(2) on the mount) or a
// device node on the server. The kernel serves opens of FIFOs and sockets
// itself — a FUSE inode of those types gets the kernel's pipe or socket
// operations, as on NFS — so the server holds only the name, its owner
// and its mode, and two processes on this client meet through it. Device
// nodes are made only where the share allows them (EPERM otherwise, never
// EOPNOTSUPP), and the mount is nodev: its kernel does not open them.
func (n *Node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	m, ok := n.fs.tree.(Mknoder)
	if !ok {
		return nil, syscall.EPERM
	}
	return n.makeChild(ctx, "mknod", name, out, nil, func(ctx context.Context, p string) (session.Attr, LeaseState, error) {
		a, err := m.Mknod(ctx, p, mode, rdev)
		return a, 0, err
	})
}

// Mknod runs MKNOD on the live session: a namespace change, so not
// replayed once it may have reached the server.
func (r *Reconnector) Mknod(ctx context.Context, path string, mode, rdev uint32) (a session.Attr, err error) {
	err = r.do(ctx, false, func(s *Session, _ uint64) error {
		m, ok := s.Tree.(Mknoder)
		if !ok {
			return protocol.StatusNotSupported
		}
		a, err = m.Mknod(ctx, path, mode, rdev)
		return err
	})
	return a, err
}
