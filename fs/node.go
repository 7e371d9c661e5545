package fs

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// filesystem is what every node of one mount shares.
type filesystem struct {
	tree Tree
	data DataPath
	opts Options
	log  logrus.FieldLogger
	wb   *asyncWrites // buffered writes in flight (writeasync.go)
	// seq orders this mount's changes and the leases' breaks: each bumps
	// it, and what a reply carried is remembered only if nothing the
	// reply may predate happened since its request began (rememberAt).
	seq   atomic.Uint64
	lease *leaseCtl // nil: no leases (lease.go)

	extras *requestExtras // what rawFS kept of requests in flight
	open   openNodes      // nodes with open files (lock.go)
	watch  watchList      // data requests' interrupt watches (watch.go)
	// releases counts releases running in the background, and
	// syncCloseUntil (unix ns) is when close(2) may stop waiting for
	// held-back changes again after a failure (asyncclose.go); idle
	// (unbuffered) hands a release to a background worker waiting for
	// one: a send that finds none goes to a new worker (background);
	// pacer holds releases until the next exclusive create carries their
	// changes.
	releases       sync.WaitGroup
	idle           chan func()
	pacer          pacer
	syncCloseUntil atomic.Int64
}

// Node is one file, directory or symlink of the share. It keeps no path:
// the path is computed from go-fuse's parent links at each call, so renames
// done through the mount are followed without bookkeeping.
type Node struct {
	gofs.Inode
	fs *filesystem

	mu sync.Mutex
	// cache is the validator the kernel's page cache of this file was
	// filled under (close-to-open; see keepCache).
	cache validator
	// fresh holds the attributes the server last sent for this node and
	// when they came (see freshAttr).
	fresh      session.Attr
	freshAt    time.Time
	freshValid bool
	freshGen   uint64 // fs.seq at the last change this mount made or break it heard
	ls         nodeLease
	// wbq is the file's writes in flight (writeasync.go), made on the
	// first write posted.
	wbq *wbQueue
	// tmp is the open handle of an O_TMPFILE node until it is named
	// (tmpfile.go).
	tmp atomic.Pointer[fileHandle]
	// setID: the last attributes seen had set-id bits a write by a caller
	// without CAP_FSETID clears (killpriv.go).
	setID atomic.Bool
}

// freshAttrAge bounds how long a GETATTR is answered from attributes the
// server just sent in another reply (a SETATTR's, a LOOKUP's, a CREATE's),
// capped by the mount's attribute timeout. The kernel asks for attributes
// it has just been given: before every chown (to recompute the set-user-ID
// bits it may have to clear), after a rename or link… — `tar -x` does
// "utimens, chown, chmod" per file, and the chown's GETATTR would be a
// round trip for what the utimens answered a moment ago. Every operation
// of this mount that changes the node (a write, a read — the atime —, a
// setattr, a namespace change in or of it, an xattr change) drops them, so they are only ever
// as stale as a change made by another client within this window — well
// inside what attr_timeout already allows.
const freshAttrAge = 100 * time.Millisecond

// dropAttr drops the remembered attributes — this mount is changing the
// node — and returns the new generation: attributes fetched by a request
// that overlapped the change are not remembered (rememberAt).
func (n *Node) dropAttr() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.freshValid = n.freshValid && n.ls.wb.predicted // held-back changes: still what the node will be
	n.freshGen = n.fs.seq.Add(1)
	return n.freshGen
}

// gen is the point a request that may return attributes begins at.
func (n *Node) gen() uint64 { return n.fs.seq.Load() }

// rememberAt records attributes the server sent in answer to a request
// begun at g, unless the node changed (or its lease broke) meanwhile.
func (n *Node) rememberAt(g uint64, a session.Attr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ls.wb.predicted {
		return
	}
	if n.freshGen <= g {
		n.sawMode(a.Mode)
		n.fresh, n.freshAt, n.freshValid = a, time.Now(), true
	} else if _, has := setIDCleared(a.Mode); has {
		// Older than a change: only says where to look, and may not
		// unsay what the change showed (a chmod u+s answered first).
		n.setID.Store(true)
	}
}

// freshAttr returns remembered attributes if they are recent enough, or
// held under a Read lease (which a break would have dropped).
func (n *Node) freshAttr() (session.Attr, bool) {
	age := min(freshAttrAge, n.fs.opts.AttrTimeout)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.freshValid && n.ls.state&LeaseRead != 0 {
		return n.fresh, true
	}
	if !n.freshValid || age <= 0 || time.Since(n.freshAt) >= age {
		return session.Attr{}, false
	}
	return n.fresh, true
}

// dropChildAttr drops the remembered attributes of the child called name,
// if the kernel knows it.
func (n *Node) dropChildAttr(name string) {
	if c := n.GetChild(name); c != nil {
		if cn, ok := c.Operations().(*Node); ok {
			cn.dropAttr()
		}
	}
}

var (
	_ = (gofs.NodeLookuper)((*Node)(nil))
	_ = (gofs.NodeGetattrer)((*Node)(nil))
	_ = (gofs.NodeSetattrer)((*Node)(nil))
	_ = (gofs.NodeOpendirHandler)((*Node)(nil))
	_ = (gofs.NodeMkdirer)((*Node)(nil))
	_ = (gofs.NodeRmdirer)((*Node)(nil))
	_ = (gofs.NodeCreater)((*Node)(nil))
	_ = (gofs.NodeOpener)((*Node)(nil))
	_ = (gofs.NodeUnlinker)((*Node)(nil))
	_ = (gofs.NodeRenamer)((*Node)(nil))
	_ = (gofs.NodeSymlinker)((*Node)(nil))
	_ = (gofs.NodeReadlinker)((*Node)(nil))
	_ = (gofs.NodeLinker)((*Node)(nil))
	_ = (gofs.NodeStatfser)((*Node)(nil))
	_ = (gofs.NodeFsyncer)((*Node)(nil))
	_ = (gofs.NodeGetxattrer)((*Node)(nil))
	_ = (gofs.NodeSetxattrer)((*Node)(nil))
	_ = (gofs.NodeListxattrer)((*Node)(nil))
	_ = (gofs.NodeRemovexattrer)((*Node)(nil))
)

// path is the node's path below the share root ("" for the root).
func (n *Node) path() string { return n.Path(n.Root()) }

// childPath is the path of name inside directory n.
func (n *Node) childPath(name string) string { return joinPath(n.path(), name) }

func joinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// errno translates err for op on path (the single error map).
func (n *Node) errno(op, path string, err error) syscall.Errno {
	return translateError(n.fs.log, op, path, err)
}

// fillAttr copies session attributes into a FUSE attribute, the owner as
// the server's ids: what the kernel is shown goes through (*Node).fillAttr,
// which maps the owner through the mount's IDMap (fs/idmap.go).
func fillAttr(out *fuse.Attr, a session.Attr) {
	out.Ino = a.Ino
	out.Mode = a.Mode
	out.Nlink = a.Nlink
	out.Owner = fuse.Owner{Uid: a.Uid, Gid: a.Gid}
	out.Rdev = a.Rdev
	out.Blksize = a.Blksize
	out.Size = a.Size
	out.Blocks = a.Blocks
	out.SetTimes(&a.Atime, &a.Mtime, &a.Ctime)
}

// newChild makes (or finds) the Inode for entry name, attributes a, which
// a request begun at g returned, and fills out with them. A new node
// remembers them; an existing one only if nothing of this mount changed
// it (nor broke its lease) since g. go-fuse's NewInode always makes a new
// Inode and swaps in a known one with the same inode number only after
// the operation returns: the node already under name is taken here, so
// that what is remembered and held lands on the node the kernel will use.
func (n *Node) newChild(ctx context.Context, name string, a session.Attr, out *fuse.EntryOut, g uint64) *gofs.Inode {
	n.fillAttr(&out.Attr, a)
	child := n.GetChild(name)
	if child == nil || child.StableAttr().Ino != a.Ino || child.StableAttr().Mode != a.Mode&syscall.S_IFMT {
		child = n.NewInode(ctx, &Node{fs: n.fs}, gofs.StableAttr{Mode: a.Mode & syscall.S_IFMT, Ino: a.Ino})
	}
	if cn, ok := child.Operations().(*Node); ok {
		cn.rememberAt(g, a)
	}
	return child
}

func (n *Node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	n.fs.wb.barrier()        // the attributes of every write answered so far
	n.settleChild(ctx, name) // and of what was held back (asyncclose.go)
	if n.fs.lease.on() {
		return n.lookupLeased(ctx, name, out)
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	p := n.childPath(name)
	g := n.gen()
	a, err := n.fs.tree.GetAttr(ctx, p)
	if err != nil {
		return nil, n.errno("lookup", p, err)
	}
	return n.newChild(ctx, name, a, out, g), 0
}

func (n *Node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fs.wb.barrier() // a size from before a write already answered would shrink the file
	if errno, ok := n.getattrLeased(ctx, out); ok {
		return errno
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	if a, ok := n.freshAttr(); ok {
		n.fillAttr(&out.Attr, a)
		return 0
	}
	p := n.path()
	g := n.gen()
	a, err := n.fs.tree.GetAttr(ctx, p)
	if fh, ok := f.(*fileHandle); ok && err != nil {
		// fstat of a file unlinked or renamed elsewhere: ask by handle
		// (a SETATTR that sets nothing returns the handle's attributes).
		a, err = n.fs.tree.SetAttr(ctx, "", fh.h, session.SetAttrIn{})
	}
	if err != nil {
		return n.errno("getattr", p, err)
	}
	n.rememberAt(g, a)
	n.fillAttr(&out.Attr, a)
	return 0
}

// setAttrIn converts a FUSE setattr into the session's.
func setAttrIn(in *fuse.SetAttrIn) session.SetAttrIn {
	var s session.SetAttrIn
	if m, ok := in.GetMode(); ok {
		s.Valid |= session.SetMode
		s.Mode = m & 07777
	}
	if u, ok := in.GetUID(); ok {
		s.Valid |= session.SetUid
		s.Uid = u
	}
	if g, ok := in.GetGID(); ok {
		s.Valid |= session.SetGid
		s.Gid = g
	}
	if sz, ok := in.GetSize(); ok {
		s.Valid |= session.SetSize
		s.Size = sz
	}
	if setTime(in, fuse.FATTR_ATIME, fuse.FATTR_ATIME_NOW, in.GetATime, &s.Atime, &s.AtimeNow) {
		s.Valid |= session.SetAtime
	}
	if setTime(in, fuse.FATTR_MTIME, fuse.FATTR_MTIME_NOW, in.GetMTime, &s.Mtime, &s.MtimeNow) {
		s.Valid |= session.SetMtime
	}
	return s
}

// setTime fills one time of a setattr when in sets it (the FUSE bit set):
// the server's clock (UTIME_NOW) with the bit now, else the time given.
func setTime(in *fuse.SetAttrIn, set, now uint32, get func() (time.Time, bool), t *time.Time, isNow *bool) bool {
	if in.Valid&set == 0 {
		return false
	}
	if in.Valid&now != 0 {
		*isNow = true
	} else {
		*t, _ = get()
	}
	return true
}

func (n *Node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	ctx, cancel := detach(ctx)
	defer cancel()
	n.fs.wb.barrier() // a truncate must land after the writes before it
	if !n.mayHoldSetattr(f) {
		n.settle(ctx) // what a closed handle held back lands first (asyncclose.go)
	}
	p := n.path()
	var h session.Handle
	if fh, ok := f.(*fileHandle); ok {
		h = fh.h
	}
	s := setAttrIn(in)
	if errno := n.serverOwner(ctx, &s); errno != 0 {
		return errno
	}
	if err := n.killSetIDSetattr(ctx, in, h, &s); err != nil {
		return n.errno("setattr", p, err)
	}
	if a, ok := n.deferSetattr(f, s, n.serverClearsSetID(ctx)); ok {
		n.fillAttr(&out.Attr, a)
		out.SetTimeout(predictedTimeout)
		return 0
	}
	n.settle(ctx) // a failure stays for the file's next write, close or fsync
	g := n.dropAttr()
	a, err := n.fs.tree.SetAttr(ctx, p, h, s)
	if err != nil {
		n.dropAttr()
		return n.errno("setattr", p, err)
	}
	n.rememberAt(g, a)
	if s.Valid&session.SetSize != 0 {
		n.mu.Lock()
		n.cache = validator{} // the kernel truncated its pages; the server's mtime moved
		n.mu.Unlock()
	}
	n.fillAttr(&out.Attr, a)
	// The server's attributes, as fresh as a GETATTR's: trusted as long
	// (go-fuse gives a SETATTR reply none, so the next stat, or a chown's
	// or chmod's permission check, would ask again at once).
	out.SetTimeout(n.fs.opts.AttrTimeout)
	if n.held(LeaseRead, g) {
		out.SetTimeout(leaseTimeout)
	}
	return 0
}

func (n *Node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makeChild(ctx, "mkdir", name, out, nil, func(ctx context.Context, p string) (session.Attr, LeaseState, error) {
		return n.mkdirTree(ctx, p, mode)
	})
}

// makeChild makes the entry name with mk (MKDIR, SYMLINK, LINK, MKNOD) and
// returns its node, dropping the remembered attributes of this directory
// — and of other, the link's target, when not nil — before and after.
func (n *Node) makeChild(ctx context.Context, op, name string, out *fuse.EntryOut, other *Node,
	mk func(ctx context.Context, p string) (session.Attr, LeaseState, error)) (*gofs.Inode, syscall.Errno) {
	ctx, cancel := detach(ctx)
	defer cancel()
	p := n.childPath(name)
	dropAttrs := func() {
		n.dropAttr()
		if other != nil {
			other.dropAttr()
		}
	}
	dropAttrs()
	defer dropAttrs()
	g := n.gen()
	a, got, err := mk(ctx, p)
	if err != nil {
		n.nameUnknown(name)
		return nil, n.errno(op, p, err)
	}
	child := n.newChild(ctx, name, a, out, g)
	n.created(child, name, got, g, op == "mkdir", out)
	return child, 0
}

func (n *Node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.removeChild(ctx, "rmdir", name, n.fs.tree.Rmdir)
}

func (n *Node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.removeChild(ctx, "unlink", name, n.fs.tree.Unlink)
}

// removeChild removes the name with remove (RMDIR or UNLINK), dropping the
// remembered attributes of this directory and of the child before and after.
func (n *Node) removeChild(ctx context.Context, op, name string, remove func(context.Context, string) error) syscall.Errno {
	ctx, cancel := detach(ctx)
	defer cancel()
	p := n.childPath(name)
	n.dropAttr()
	n.dropChildAttr(name)
	defer n.dropChildAttr(name)
	defer n.dropAttr()
	err := remove(ctx, p)
	if err != nil {
		n.nameUnknown(name)
	} else {
		n.removed(name)
	}
	return n.errno(op, p, err)
}

func (n *Node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	ctx, cancel := detach(ctx)
	defer cancel()
	oldPath := n.childPath(name)
	newPath := joinPath(newParent.EmbeddedInode().Path(n.Root()), newName)
	n.settleChild(ctx, name) // the file as its last close left it (asyncclose.go)
	if np, ok := newParent.(*Node); ok {
		np.settleChild(ctx, newName)
	}
	dropAttrs := func() {
		n.dropAttr()
		n.dropChildAttr(name)
		if np, ok := newParent.(*Node); ok {
			np.dropAttr()
			np.dropChildAttr(newName)
		}
	}
	dropAttrs()
	defer dropAttrs()
	err := n.fs.tree.Rename(ctx, oldPath, newPath, flags)
	n.renamed(name, newParent, newName, flags, err)
	return n.errno("rename", oldPath, err)
}

func (n *Node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makeChild(ctx, "symlink", name, out, nil, func(ctx context.Context, p string) (session.Attr, LeaseState, error) {
		a, err := n.fs.tree.Symlink(ctx, target, p)
		return a, 0, err
	})
}

func (n *Node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	ctx, cancel := detach(ctx)
	defer cancel()
	p := n.path()
	t, err := n.fs.tree.Readlink(ctx, p)
	if err != nil {
		return nil, n.errno("readlink", p, err)
	}
	return []byte(t), 0
}

func (n *Node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	tn, _ := target.(*Node)
	if fh := tn.tmpHandle(); fh != nil {
		return n.linkTmp(ctx, tn, fh, name, out) // an O_TMPFILE file has no path
	}
	oldPath := target.EmbeddedInode().Path(n.Root())
	if tn != nil {
		tn.settle(ctx) // asyncclose.go
	}
	return n.makeChild(ctx, "link", name, out, tn, func(ctx context.Context, p string) (session.Attr, LeaseState, error) {
		a, err := n.fs.tree.Link(ctx, oldPath, p)
		return a, 0, err // a hard-linked file keeps no lease: created drops tn's
	})
}

func (n *Node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	ctx, cancel := detach(ctx)
	defer cancel()
	n.settleHeld(ctx, func(string, *gofs.Inode) bool { return true }) // asyncclose.go: df counts what closed files held back
	s, err := n.fs.tree.StatFS(ctx)
	if err != nil {
		return n.errno("statfs", "", err)
	}
	out.Blocks, out.Bfree, out.Bavail = s.Blocks, s.Bfree, s.Bavail
	out.Files, out.Ffree = s.Files, s.Ffree
	out.Bsize, out.Frsize, out.NameLen = s.Bsize, s.Frsize, s.NameLen
	return 0
}

func (n *Node) Fsync(ctx context.Context, f gofs.FileHandle, flags uint32) syscall.Errno {
	ctx, cancel := detach(ctx)
	defer cancel()
	p := n.path()
	if err := n.flushAll(ctx, false); err != nil {
		return n.errno("fsync", p, err)
	}
	if fh, ok := f.(*fileHandle); ok {
		return n.errno("fsync", p, n.fs.tree.Fsync(ctx, fh.h, flags&1 != 0))
	}
	// fsync of a directory, or without a handle: open one for it.
	h, _, err := n.fs.tree.Open(ctx, p, syscall.O_RDONLY, 0)
	if err != nil {
		return n.errno("fsync", p, err)
	}
	err = n.fs.tree.Fsync(ctx, h, flags&1 != 0)
	if cerr := n.fs.tree.CloseHandle(context.Background(), h); err == nil {
		err = cerr
	}
	return n.errno("fsync", p, err)
}

// hostLocalXattr reports whether an extended attribute belongs to the host
// that reads it rather than to the file: security.* names (SELinux and
// other LSM labels, file capabilities) are the server's security policy,
// meaningless on this client — and ls -l asks for security.selinux of every
// file, a round trip each. They are neither shown nor set through the mount
// (as on NFS without labeled NFS).
func hostLocalXattr(name string) bool { return strings.HasPrefix(name, "security.") }

func (n *Node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if hostLocalXattr(attr) {
		return 0, syscall.ENODATA
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	n.settle(ctx) // asyncclose.go
	p := n.path()
	v, err := n.fs.tree.GetXattr(ctx, p, attr)
	if err != nil {
		return 0, n.errno("getxattr", p, err)
	}
	if len(dest) == 0 {
		return uint32(len(v)), 0 // size query
	}
	if len(v) > len(dest) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

func (n *Node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if hostLocalXattr(attr) {
		return syscall.EOPNOTSUPP
	}
	return n.changeXattr(ctx, "setxattr", func(ctx context.Context, p string) error {
		return n.fs.tree.SetXattr(ctx, p, attr, data, int(flags))
	})
}

func (n *Node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if hostLocalXattr(attr) {
		return syscall.ENODATA
	}
	return n.changeXattr(ctx, "removexattr", func(ctx context.Context, p string) error {
		return n.fs.tree.RemoveXattr(ctx, p, attr)
	})
}

// changeXattr runs change on the node's path, dropping its remembered
// attributes (the ctime moves) before and after.
func (n *Node) changeXattr(ctx context.Context, op string, change func(ctx context.Context, p string) error) syscall.Errno {
	ctx, cancel := detach(ctx)
	defer cancel()
	n.settle(ctx) // a held-back chown would clear what is set (asyncclose.go)
	p := n.path()
	n.dropAttr()
	defer n.dropAttr()
	return n.errno(op, p, change(ctx, p))
}

func (n *Node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	ctx, cancel := detach(ctx)
	defer cancel()
	n.settle(ctx) // asyncclose.go
	p := n.path()
	names, err := n.fs.tree.ListXattr(ctx, p)
	if err != nil {
		return 0, n.errno("listxattr", p, err)
	}
	var b strings.Builder
	for _, name := range names {
		if hostLocalXattr(name) {
			continue
		}
		b.WriteString(name)
		b.WriteByte(0)
	}
	if len(dest) == 0 {
		return uint32(b.Len()), 0
	}
	if b.Len() > len(dest) {
		return uint32(b.Len()), syscall.ERANGE
	}
	return uint32(copy(dest, b.String())), 0
}
