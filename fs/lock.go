package fs

import (
	"context"
	"errors"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// Locks: fcntl (F_SETLK, F_SETLKW, F_GETLK, the OFD forms) and flock(2)
// on a mounted file go to the server, which holds them on its disk
// against every other client and local process (docs/session.md, "Locks").
// The kernel names a lock's owner: a process for POSIX locks, an open file
// for OFD locks and flock; that owner travels as it is.
//
// Data cached under a lock must be what the last holder left: taking a
// lock drops this mount's cached pages of the file (and of the files open
// beside it: sqlite's journal and WAL live next to the database and are
// read under the database's or the -shm file's locks), so reads after it go
// to the server; and releasing one first waits for the posted writes of
// the files open beside it (drainBeside), then pushes the file's dirty
// pages (a shared writable mapping's, from the end of the file to its
// start: pushDirty) to the server and waits until every write of the file
// is there — posted ones (writeasync.go) and a Write lease's held-back ones
// (writebehind.go) — so the next holder reads them.

// Locker is the session channel's lock calls on an open handle
// (*session.Tree; the Reconnector forwards them across reconnects).
type Locker interface {
	// Lock sets or clears lk on h's file; with wait it waits for a
	// conflicting holder until ctx ends (which cancels the wait on the
	// server).
	Lock(ctx context.Context, h session.Handle, lk session.Lock, wait bool) error
	// Unlock releases every lock owner holds on h's file.
	Unlock(ctx context.Context, h session.Handle, owner uint64) error
	// TestLock returns the first lock that would conflict with lk, or one
	// of Type session.Unlock.
	TestLock(ctx context.Context, h session.Handle, lk session.Lock) (session.Lock, error)
}

var (
	_ = (gofs.NodeGetlker)((*Node)(nil))
	_ = (gofs.NodeSetlker)((*Node)(nil))
	_ = (gofs.NodeSetlkwer)((*Node)(nil))
)

// lockOf converts the kernel's lock request.
func lockOf(owner uint64, lk *fuse.FileLock, flags uint32) session.Lock {
	return session.Lock{Owner: owner, Start: lk.Start, End: lk.End, Type: lk.Typ, Flock: flags&fuse.FUSE_LK_FLOCK != 0}
}

// locker returns the file handle a lock request came through and the tree
// that forwards it. Only files get here: FUSE keeps a directory's locks in
// the client's kernel (its directory operations have no lock or flock).
func (n *Node) locker(f gofs.FileHandle) (*fileHandle, Locker, syscall.Errno) {
	l, ok := n.fs.tree.(Locker)
	fh, isFile := f.(*fileHandle)
	if !ok || !isFile {
		return nil, nil, syscall.ENOLCK
	}
	return fh, l, 0
}

// Getlk is F_GETLK (and F_OFD_GETLK): the first conflicting lock. Its pid
// is 0: the holder is another client or a process on the server host.
func (n *Node) Getlk(ctx context.Context, f gofs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	fh, l, errno := n.locker(f)
	if errno != 0 {
		return errno
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	got, err := l.TestLock(ctx, fh.h, lockOf(owner, lk, flags))
	if err != nil {
		return fh.errno("getlk", err)
	}
	*out = fuse.FileLock{Start: got.Start, End: got.End, Typ: got.Type}
	return 0
}

// Setlk is F_SETLK, and flock with LOCK_NB (or an unlock).
func (n *Node) Setlk(ctx context.Context, f gofs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return n.setlk(ctx, f, owner, lk, flags, false)
}

// Setlkw is F_SETLKW, and a blocking flock: it waits on the server until
// the lock is granted or the caller is interrupted (Ctrl-C, any signal:
// FUSE INTERRUPT ends ctx, the wait is cancelled on the server, EINTR).
func (n *Node) Setlkw(ctx context.Context, f gofs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return n.setlk(ctx, f, owner, lk, flags, true)
}

func (n *Node) setlk(ctx context.Context, f gofs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32, wait bool) syscall.Errno {
	fh, l, errno := n.locker(f)
	if errno != 0 {
		return errno
	}
	dctx, cancel := detach(ctx)
	defer cancel()
	req := lockOf(owner, lk, flags)
	if req.Type == session.Unlock {
		// The next holder reads what this one wrote: the posted writes
		// of the files beside go first (drainBeside), then a shared
		// mapping's dirty pages, as writes, and then every write of the
		// file must be on the server — posted ones (writeasync.go; the
		// write-back's own pieces are posted too, and may travel on
		// another connection than the unlock) and a Write lease's
		// held-back ones — before the lock goes.
		// A failure among those writes is the unlock's error, and is
		// kept for close(2) and fsync as well (a write-back error is
		// reported at the next fsync or close, as NFS and Linux do);
		// the lock goes all the same — kept on the server, it would
		// stop every other client until the file is closed.
		n.drainBeside()
		perr := n.pushDirty()
		err := n.flushAll(dctx, true)
		if err == nil {
			err = perr
		}
		if uerr := l.Lock(dctx, fh.h, req, false); err == nil {
			err = uerr
		}
		return fh.errno("unlock", err)
	}
	n.settle(dctx) // a lock holder reads the file as its last close left it (asyncclose.go)
	if !wait {
		ctx = dctx
	}
	if err := l.Lock(ctx, fh.h, req, wait); err != nil {
		if wait && errors.Is(err, context.Canceled) {
			return syscall.EINTR
		}
		return fh.errno("lock", err)
	}
	fh.locked.Store(true) // its server handle is not kept after release (handlecache.go)
	n.fs.open.owns(n, owner)
	n.dropForLock()
	return 0
}

// releaseLocks is what a close(2) of a descriptor asks (FLUSH): the
// closing process's POSIX locks on the file go. Only a process this mount
// has seen take a lock on the node costs a round trip.
func (f *fileHandle) releaseLocks(ctx context.Context) syscall.Errno {
	owner, ok := f.node.fs.flushOwner(ctx)
	if !ok || !f.node.fs.open.disown(f.node, owner) {
		return 0
	}
	l, ok := f.node.fs.tree.(Locker)
	if !ok {
		return 0
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	f.node.drainBeside()
	if err := l.Unlock(ctx, f.h, owner); err != nil {
		// close(2) has done its part; a lock the server keeps is
		// released with the handle at the last close anyway.
		f.log.WithField("op", "flush").WithError(err).Warn("fs: releasing a closing process's locks")
	}
	return 0
}

// pushDirty writes the node's dirty pages (a shared writable mapping's)
// back to the server before an unlock: invalidating a page the kernel holds
// dirty writes it back first (FUSE's launder_folio).
// It runs inside the unlock's FUSE request: a lock request holds none of
// the inode's or its pages' locks in the kernel (unlike a read or write).
//
// Page by page from the end of the file to its start, each page's write on
// the server before the next page is written back: the order in which a
// program's stores become visible to another mount, which may read the
// file at any time (a lock of its own is no lock of this one), is the
// order a program on one host publishes in — sqlite fills the -shm's hash
// tables, then stores the header at its start that makes them count; pushed
// start first, a reader on another mount took the new header with the old
// hash tables and read old pages of the database ("database disk image is
// malformed"). The pages with twins are the ones the kernel may hold, up
// to twin.go's limits (the first MiB; 4,096 pages once mapped); Invalidate
// then drops the rest (and the attributes), writing back any beyond
// those limits in the kernel's order. A file the kernel
// never wrote back from a mapping goes in one Invalidate (rollback-journal
// sqlite's database: no notification per cached page at every unlock).
// A lock's acquisition drops the cache the same way (dropForLock): the
// pages it writes back may hold another owner's stores.
// A failed page stops the push: the pages below it are not sent — what is
// on the server stays a state the program passed through, not the header
// without its hash tables. Their write-backs fail unsent (the kernel drops
// them and keeps the failure for fsync and close(2)), and the failure is
// the unlock's error and is kept for the file's next write, close or fsync.
// (Left alone, the failure was taken by the next page's write-back only,
// which went unsent, and the unlock returned 0.)
func (n *Node) pushDirty() error {
	pages := n.fs.open.mappedPages(n)
	if len(pages) == 0 {
		n.Invalidate(0, 0)
		return nil
	}
	// A failure of the file's earlier writes is set aside: left, the
	// first page's write-back would return it and go unsent.
	prior := n.flushWrites(false)
	var failed error
	for _, p := range pages {
		if failed != nil {
			n.keepWriteErr(failed) // the page's write-back returns it, unsent
		}
		n.NotifyContent(p*twinPage, twinPage)
		if err := n.flushWrites(false); err != nil && failed == nil {
			failed = err
		}
	}
	if failed != nil {
		n.keepWriteErr(failed)
	}
	n.Invalidate(0, 0)
	if failed == nil {
		failed = prior
	}
	if failed != nil {
		n.keepWriteErr(failed)
	}
	return failed
}

// drainBeside waits until the posted writes of the files open beside n
// (writeasync.go) are on the server, before a lock of n goes — at an
// unlock, at a close(2) that drops POSIX locks (releaseLocks), and at the
// last close of a handle OFD locks or flocks were taken through (release,
// file.go, which drops them with the server handle): what was
// written under a lock is not only in the locked file. sqlite's WAL
// checkpoint writes database pages under a lock of the -shm file and, when
// it copies only part of the WAL, publishes how far it got in the -shm
// without an fsync of the database; a reader on another mount that took the
// lock next read those pages from the server before they landed
// ("database disk image is malformed"). The reader's side is dropForLock.
// A failure stays with its file, for that file's next write, close or
// fsync. What a Write lease holds back needs no wait: no other client has
// that file open, and its open recalls the lease first.
func (n *Node) drainBeside() {
	if n.fs.wb.pending.Load() == 0 {
		return
	}
	for _, m := range n.fs.open.beside(n)[1:] {
		m.drainWrites()
	}
}

// dropForLock drops what this mount caches of the file just locked, and of
// the files open in the same directory, so that reads under the lock see
// what the previous holder wrote — unless cacheTrusted says nobody else
// can have written.
func (n *Node) dropForLock() {
	for _, m := range n.fs.open.beside(n) {
		if m.cacheTrusted() {
			continue
		}
		// In the lock's request (see pushDirty), and in pushDirty's
		// order: the kernel writes back the dirty pages it drops,
		// another owner's stores under another lock among them.
		// A failure is kept for the file's next write, close or fsync.
		m.pushDirty()
	}
}

// cacheTrusted reports whether this mount's cached data of the node is
// known to be current without asking: it holds a Read lease, which the
// server grants only while no other client has the file open for writing
// and breaks (and waits for the acknowledgement) before another client's
// write-open or a local process's change goes on. A lock another client
// holds needs an open of the file, which recalls Write, so a node that
// holds Write has no other lock holders at all. Without a lease, a lock
// acquisition drops the cache.
func (n *Node) cacheTrusted() bool { return n.holdsRead() }

// openNodes is the set of nodes with open files, and per node the lock
// owners that took locks through this mount (FLUSH then releases theirs).
type openNodes struct {
	mu sync.Mutex
	m  map[*Node]*openNode
}

type openNode struct {
	handles int
	rw      int // handles open read-write (a shared writable mapping needs one)
	owners  map[uint64]struct{}
	tw      twinSet // twin.go
}

// opened counts an open file of n, opened with flags.
func (o *openNodes) opened(n *Node, flags int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[*Node]*openNode{}
	}
	on := o.m[n]
	if on == nil {
		on = &openNode{}
		o.m[n] = on
	}
	on.handles++
	if flags&syscall.O_ACCMODE == syscall.O_RDWR {
		on.rw++
	}
}

// closed counts one open file of n, opened with flags, less; with the
// last, the server has released every lock taken through the mount on it.
func (o *openNodes) closed(n *Node, flags int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if on := o.m[n]; on != nil {
		if flags&syscall.O_ACCMODE == syscall.O_RDWR {
			on.rw--
		}
		if on.handles--; on.handles <= 0 {
			delete(o.m, n)
		}
	}
}

// owns records that owner took a lock on n.
func (o *openNodes) owns(n *Node, owner uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if on := o.m[n]; on != nil {
		if on.owners == nil {
			on.owners = map[uint64]struct{}{}
		}
		on.owners[owner] = struct{}{}
	}
}

// disown forgets owner's locks on n and reports whether it had taken any.
func (o *openNodes) disown(n *Node, owner uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	on := o.m[n]
	if on == nil {
		return false
	}
	_, ok := on.owners[owner]
	delete(on.owners, owner)
	return ok
}

// beside returns n and the nodes open in n's directory.
func (o *openNodes) beside(n *Node) []*Node {
	o.mu.Lock()
	all := make([]*Node, 0, len(o.m))
	for m := range o.m {
		if m != n {
			all = append(all, m)
		}
	}
	o.mu.Unlock()
	_, dir := n.Parent()
	out := []*Node{n}
	for _, m := range all {
		if _, p := m.Parent(); p != nil && p == dir {
			out = append(out, m)
		}
	}
	return out
}
