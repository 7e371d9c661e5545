package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// fallocate(2) and SEEK_DATA/SEEK_HOLE on the server file (issue 23; see
// copy.go for what the kernel sends).

var (
	_ = (gofs.NodeAllocater)((*Node)(nil))
	_ = (gofs.NodeLseeker)((*Node)(nil))
)

// Allocate is fallocate(2): the server file is allocated, punched or
// zeroed as the export's filesystem does it, so sizes, block counts and
// bytes are the export's; posix_fallocate(3), which falls back to writing
// zeroes where fallocate fails, sends nothing but this. The kernel drops
// its cached pages of a punched or zeroed range and its attributes itself;
// the node's remembered attributes and validator go too.
func (n *Node) Allocate(ctx context.Context, f gofs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	ss, ok := n.serverSide()
	fh, okf := f.(*fileHandle)
	if !ok || !okf {
		return syscall.EOPNOTSUPP
	}
	if off > maxOffset || size > maxOffset {
		return syscall.EINVAL
	}
	req := ctx
	ctx, cancel := detach(ctx)
	defer cancel()
	if err := n.flushDeferred(ctx, false); err != nil {
		return fh.errno("fallocate", err) // what a Write lease held back lands first
	}
	if err := n.killSetIDUnflagged(req, fh.h); err != nil { // killpriv.go
		return fh.errno("fallocate", err)
	}
	fh.dirty()
	defer fh.dirty()
	_, err := ss.Allocate(ctx, fh.h, mode, int64(off), int64(size))
	return fh.errno("fallocate", err)
}

// Lseek answers SEEK_DATA and SEEK_HOLE from the server file, so that
// sparse files stay sparse through cp --sparse, tar -S and backup tools
// (the kernel answers the other whence values itself). Past the last data
// it is ENXIO, as locally.
func (n *Node) Lseek(ctx context.Context, f gofs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	ss, ok := n.serverSide()
	fh, okf := f.(*fileHandle)
	if !ok || !okf {
		return 0, syscall.ENOSYS // the kernel falls back to "all data" for the mount
	}
	if whence != unix.SEEK_DATA && whence != unix.SEEK_HOLE {
		return 0, syscall.EINVAL
	}
	if off > maxOffset {
		return 0, syscall.ENXIO
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	if err := n.flushDeferred(ctx, false); err != nil {
		return 0, fh.errno("lseek", err) // the server must see what was held back
	}
	pos, err := ss.Seek(ctx, fh.h, int64(off), int(whence))
	if err != nil {
		return 0, fh.errno("lseek", err)
	}
	return uint64(pos), 0
}

// Allocate runs FALLOCATE on the live session, re-opening the file after a
// reconnect. Allocating, punching and zeroing are safe to repeat;
// collapsing and inserting a range are not, and are not replayed.
func (r *Reconnector) Allocate(ctx context.Context, vh session.Handle, mode uint32, off, n int64) (a session.Attr, err error) {
	replay := mode&(unix.FALLOC_FL_COLLAPSE_RANGE|unix.FALLOC_FL_INSERT_RANGE) == 0
	err = r.serverSideHandle(ctx, vh, replay, func(ss ServerSide, h session.Handle) error {
		a, err = ss.Allocate(ctx, h, mode, off, n)
		return err
	})
	return a, err
}

// Seek runs SEEK on the live session (replayed: it changes nothing).
func (r *Reconnector) Seek(ctx context.Context, vh session.Handle, off int64, whence int) (pos int64, err error) {
	err = r.serverSideHandle(ctx, vh, true, func(ss ServerSide, h session.Handle) error {
		pos, err = ss.Seek(ctx, h, off, whence)
		return err
	})
	return pos, err
}
