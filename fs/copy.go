package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// Work the server does on its own files, so that their bytes never cross
// the network (issue 23): copy_file_range between two files of the mount
// (what cp does after FICLONE), fallocate (space.go), SEEK_DATA/SEEK_HOLE
// (space.go), and O_TMPFILE with the linkat that names it (tmpfile.go).
//
// What the kernel sends here, on this kernel (6.18), as measured with a
// go-fuse loopback in debug mode: FUSE_COPY_FILE_RANGE for a
// copy_file_range between two files of one mount; nothing for FICLONE,
// which the VFS refuses itself (EOPNOTSUPP) because FUSE has no
// remap_file_range — cp then falls back to copy_file_range; nothing for a
// copy between two mounts (two superblocks): the kernel copies through its
// page cache, READ on one and WRITE on the other. FUSE_FALLOCATE for modes
// 0, KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE and ZERO_RANGE; COLLAPSE_RANGE and
// INSERT_RANGE are refused by the kernel (EOPNOTSUPP) before they reach a
// daemon. FUSE_LSEEK for SEEK_DATA and SEEK_HOLE only.

// ServerSide is what the mount needs from a tree for that work: the
// session channel's COPY_RANGE, FALLOCATE, SEEK, TMPFILE and LINKAT_HANDLE
// (*session.Tree and the Reconnector have them). A Tree without them gets
// EOPNOTSUPP, and the kernel's own fallbacks.
type ServerSide interface {
	// CopyRange copies up to n bytes of src from srcOff into dst at
	// dstOff on the server; at most session.MaxCopyRange per call, fewer
	// at src's end of file (0 past it). It returns dst's attributes
	// afterwards.
	CopyRange(ctx context.Context, src session.Handle, srcOff int64, dst session.Handle, dstOff int64, n int64) (int64, session.Attr, error)
	// Allocate is fallocate(2) on the server file.
	Allocate(ctx context.Context, h session.Handle, mode uint32, off, n int64) (session.Attr, error)
	// Seek is lseek(2) with SEEK_DATA or SEEK_HOLE on the server file.
	Seek(ctx context.Context, h session.Handle, off int64, whence int) (int64, error)
	// Tmpfile opens an unnamed file in directory dir (O_TMPFILE).
	Tmpfile(ctx context.Context, dir string, flags int, mode uint32) (session.Handle, session.Attr, error)
	// LinkHandle gives the file open as h the name path.
	LinkHandle(ctx context.Context, h session.Handle, path string) (session.Attr, error)
}

var (
	_ ServerSide = (*session.Tree)(nil)
	_ ServerSide = (*Reconnector)(nil)

	_ = (gofs.NodeCopyFileRanger)((*Node)(nil))
)

// serverSide is the tree's ServerSide, if it has one.
func (n *Node) serverSide() (ServerSide, bool) {
	ss, ok := n.fs.tree.(ServerSide)
	return ss, ok
}

// maxCopyCall bounds what one FUSE_COPY_FILE_RANGE copies: its answer is a
// u32, and page-aligned like the kernel's own limit. The caller goes on
// from the count.
const maxCopyCall = 1<<32 - 1<<12

// CopyFileRange is copy_file_range(2) between two files of this mount:
// the server copies, in COPY_RANGE requests of at most
// session.MaxCopyRange (each bounded in time on the server), and the bytes
// never come here. A FUSE INTERRUPT (a cancelled cp) stops it between two
// requests with the count so far — a short copy, which copy_file_range
// may always return — so the server's copying ends within one request.
// The kernel drops its cached pages of the copied range and updates the
// size itself when this returns; the mount's remembered attributes and
// close-to-open validator of the destination go too.
func (n *Node) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode,
	fhOut gofs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	ss, ok := n.serverSide()
	src, okIn := fhIn.(*fileHandle)
	dst, okOut := fhOut.(*fileHandle)
	if !ok || !okIn || !okOut {
		return 0, syscall.EOPNOTSUPP // the kernel copies through its page cache
	}
	if flags != 0 || offIn > maxOffset || offOut > maxOffset {
		return 0, syscall.EINVAL
	}
	want := int64(min(length, maxCopyCall))
	for _, f := range []*fileHandle{src, dst} {
		if err := f.node.flushDeferred(ctx, false); err != nil {
			return 0, f.errno("copy_file_range", err) // the server copies what it has
		}
	}
	if err := dst.node.killSetIDUnflagged(ctx, dst.h); err != nil { // killpriv.go
		return 0, dst.errno("copy_file_range", err)
	}
	dst.dirty()
	defer dst.dirty()
	var done int64
	for done < want {
		// Each request runs to its end even when interrupted, so that
		// its count says what was copied.
		rctx, cancel := detach(ctx)
		k, _, err := ss.CopyRange(rctx, src.h, int64(offIn)+done, dst.h, int64(offOut)+done, want-done)
		cancel()
		if err != nil {
			if done > 0 {
				break // what was copied stays copied; the next call meets the error
			}
			return 0, dst.errno("copy_file_range", err)
		}
		done += k
		if k == 0 || ctx.Err() != nil {
			break
		}
	}
	return uint32(done), 0
}

// maxOffset is the largest offset a request may name (the server's are
// signed).
const maxOffset = 1<<63 - 1

// Invalidate drops what this mount caches of the node's data in [off,
// off+size) (size ≤ 0: to the end) and its attributes: the kernel's pages
// (FUSE_NOTIFY_INVAL_INODE) and the node's remembered attributes and
// close-to-open validator. Operations of this mount need not call it —
// the kernel drops its own pages after a copy, punch or zero it sent, and
// they drop the rest — it is for a change made elsewhere: the hook a lease
// break (issue 15) calls for a file another client copied into, punched
// or zeroed. It must not be called from inside a FUSE request on this
// node (the kernel may hold the inode's locks while it waits).
func (n *Node) Invalidate(off, size int64) syscall.Errno {
	n.mu.Lock()
	n.cache = validator{}
	n.freshValid = false
	n.freshGen = n.fs.seq.Add(1)
	n.mu.Unlock()
	errno := n.NotifyContent(off, size)
	n.fs.open.dropTwins(n, off, size) // twin.go: the pages went
	return errno
}

// CopyRange runs COPY_RANGE on the live session with the two files' handles
// there, re-opening them after a reconnect. A copy at explicit offsets is
// safe to repeat, so it is replayed.
func (r *Reconnector) CopyRange(ctx context.Context, src session.Handle, srcOff int64, dst session.Handle, dstOff int64, n int64) (k int64, a session.Attr, err error) {
	err = r.onServer(ctx, true, func(ss ServerSide, _ uint64, real func(session.Handle) (session.Handle, error)) error {
		rs, err := real(src)
		if err != nil {
			return err
		}
		rd, err := real(dst)
		if err != nil {
			return err
		}
		k, a, err = ss.CopyRange(ctx, rs, srcOff, rd, dstOff, n)
		return err
	})
	return k, a, err
}

// onServer runs op with the live session's ServerSide and its generation;
// real maps a handle of the mount to the session's, re-opening the file
// after a reconnect. replay says whether op is safe to repeat on the next
// session when this one dies under it.
func (r *Reconnector) onServer(ctx context.Context, replay bool,
	op func(ss ServerSide, gen uint64, real func(session.Handle) (session.Handle, error)) error) error {
	return r.do(ctx, replay, func(s *Session, gen uint64) error {
		ss, ok := s.Tree.(ServerSide)
		if !ok {
			return syscall.EOPNOTSUPP
		}
		return op(ss, gen, func(vh session.Handle) (session.Handle, error) { return r.realHandle(ctx, s, gen, vh) })
	})
}

// serverSideHandle is onServer for an operation on one open file: op gets
// vh's handle on the live session.
func (r *Reconnector) serverSideHandle(ctx context.Context, vh session.Handle, replay bool, op func(ss ServerSide, real session.Handle) error) error {
	return r.onServer(ctx, replay, func(ss ServerSide, _ uint64, real func(session.Handle) (session.Handle, error)) error {
		h, err := real(vh)
		if err != nil {
			return err
		}
		return op(ss, h)
	})
}
