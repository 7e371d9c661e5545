package fs

import (
	"context"
	"slices"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// The node operations' lease side: what a lookup, getattr, open, create or
// listing asks for and what it may then cache (lease.go has the model).

// maxNegatives bounds the absent names a directory answers with the lease
// timeout (each is invalidated by name when the lease goes).
const maxNegatives = 4096

// serverIno is the server's inode number of n, 0 when not known yet (the
// root's until its first lookup).
func (n *Node) serverIno() uint64 {
	n.mu.Lock()
	ino := n.ls.ino
	n.mu.Unlock()
	if ino != 0 || n.IsRoot() {
		return ino
	}
	return n.StableAttr().Ino
}

// knownAbsent reports whether name is known not to exist in directory n:
// n holds Read and knows all its entries.
func (n *Node) knownAbsent(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ls.state&LeaseRead == 0 || !n.ls.complete {
		return false
	}
	_, present := n.ls.names[name]
	_, unknown := n.ls.unknown[name]
	return !present && !unknown
}

// negative makes an ENOENT for name one the kernel may cache for the lease
// timeout (fs/negative.go turns it into a negative entry), when directory
// n held Read since s0.
func (n *Node) negative(name string, out *fuse.EntryOut, s0 uint64) {
	if !n.held(LeaseRead, s0) {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.ls.negs) >= maxNegatives {
		return
	}
	if n.ls.negs == nil {
		n.ls.negs = map[string]struct{}{}
	}
	n.ls.negs[name] = struct{}{}
	delete(n.ls.unknown, name)
	out.SetEntryTimeout(leaseTimeout)
}

// names records what this mount did to directory n's entries, so that a
// complete listing stays complete: added names exist, gone ones do not.
func (n *Node) names(added, gone []string) {
	if n.fs.lease == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, name := range added {
		delete(n.ls.negs, name)
		delete(n.ls.unknown, name)
		if n.ls.complete {
			if n.ls.names == nil {
				n.ls.names = map[string]struct{}{}
			}
			n.ls.names[name] = struct{}{}
		}
	}
	for _, name := range gone {
		delete(n.ls.unknown, name)
		delete(n.ls.names, name)
	}
}

// removed records that this mount removed name from directory n: gone
// from the listing, and the handles kept of it closed (a kept handle
// would keep an unlinked file's space on the server).
func (n *Node) removed(name string) {
	n.names(nil, []string{name})
	if n.fs.lease == nil {
		return
	}
	if c := n.GetChild(name); c != nil {
		if cn, ok := c.Operations().(*Node); ok {
			cn.mu.Lock()
			hs := cn.ls.handles
			cn.ls.handles = nil
			cn.mu.Unlock()
			n.fs.lease.forgetHandles(hs)
		}
	}
}

// nameUnknown forgets what n knew of name (an operation on it failed in a
// way the listing did not predict).
func (n *Node) nameUnknown(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ls.complete {
		delete(n.ls.names, name)
		if n.ls.unknown == nil {
			n.ls.unknown = map[string]struct{}{}
		}
		n.ls.unknown[name] = struct{}{}
	}
}

// leaseTimeouts gives an entry reply for child cn of directory n the lease
// timeouts the leases allow: the name's, when n held Read since s0, and
// the attributes', when cn did.
func (n *Node) leaseTimeouts(out *fuse.EntryOut, cn *Node, s0 uint64) {
	if n.held(LeaseRead, s0) {
		out.SetEntryTimeout(leaseTimeout)
	}
	if cn.held(LeaseRead, s0) {
		out.SetAttrTimeout(leaseTimeout)
	}
}

// lookupLeased is Lookup on a mount with leases: a name known absent costs
// nothing; otherwise LEASE asks for the child's attributes with a Read
// lease on it, in one round trip as GETATTR did.
func (n *Node) lookupLeased(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	s0 := n.gen()
	if n.knownAbsent(name) {
		n.negative(name, out, s0)
		return nil, syscall.ENOENT
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	p := n.childPath(name)
	a, got, err := n.fs.lease.tr.Lease(ctx, p, LeaseRead)
	if err != nil {
		errno := n.errno("lookup", p, err)
		if errno == syscall.ENOENT {
			n.names(nil, []string{name})
			n.negative(name, out, s0)
		}
		return nil, errno
	}
	child := n.newChild(ctx, name, a, out, s0)
	cn := child.Operations().(*Node)
	n.fs.lease.install(cn, a.Ino, got, s0)
	n.names([]string{name}, nil)
	n.leaseTimeouts(out, cn, s0)
	return child, 0
}

// getattrLeased answers GETATTR from what the node holds — attributes
// predicted for changes held back, or remembered under Read — or asks with
// LEASE, which takes a Read lease as it goes. ok false: not answered (no
// leases, or an error the plain path handles: an fstat of a file gone from
// its path).
func (n *Node) getattrLeased(ctx context.Context, out *fuse.AttrOut) (errno syscall.Errno, ok bool) {
	lc := n.fs.lease
	if lc == nil {
		return 0, false
	}
	if a, ok := n.predictedAttr(); ok {
		n.fillAttr(&out.Attr, a)
		out.SetTimeout(predictedTimeout)
		return 0, true
	}
	n.settle(ctx) // no prediction: the server's, once what was held back is there
	s0 := n.gen()
	if a, ok := n.freshAttr(); ok {
		n.fillAttr(&out.Attr, a)
		if n.held(LeaseRead, s0) {
			out.SetTimeout(leaseTimeout)
		}
		return 0, true
	}
	if !lc.on() {
		return 0, false
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	a, got, err := lc.tr.Lease(ctx, n.path(), LeaseRead)
	if err != nil {
		return 0, false
	}
	if want := n.serverIno(); want != 0 && want != a.Ino {
		got = 0 // the path names another object now
	} else {
		lc.install(n, a.Ino, got, s0)
		n.rememberAt(s0, a)
	}
	n.fillAttr(&out.Attr, a)
	if got != 0 && n.held(LeaseRead, s0) {
		out.SetTimeout(leaseTimeout)
	}
	return 0, true
}

// openWant is the lease an open asks for: Read and Handle always; Write
// too when it writes in a way that may be held back (not appending, not
// O_DIRECT, not synchronous).
func openWant(flags int) LeaseState {
	want := LeaseRead | LeaseHandle
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY && flags&(syscall.O_APPEND|syscall.O_DIRECT|syscall.O_SYNC|syscall.O_DSYNC) == 0 {
		want |= LeaseWrite
	}
	return want
}

// carries reports whether an OPEN with session flags sflags may carry the
// waiting releases' changes: only an exclusive create, which makes a new
// file or fails at once. Any other OPEN may recall another mount's Write
// lease and wait for its answer, while that mount's recall of a file
// whose changes ride in this OPEN waits for this OPEN's BATCH (its
// flushMu): two mounts opening each other's just-closed files would wait
// for each other until the server's lease-break timeout. An exclusive
// create recalls no file's lease (an O_TRUNC one may: the server recalls
// the path before it opens), only directory leases, whose recall sends
// nothing held back. The others leave the releases waiting.
func carries(sflags int) bool {
	return sflags&(syscall.O_CREAT|syscall.O_EXCL|syscall.O_TRUNC) == syscall.O_CREAT|syscall.O_EXCL
}

// openTree opens (or creates) p on the server, asking for a lease on a
// mount with leases; the caller installs it on the node.
func (n *Node) openTree(ctx context.Context, p string, flags, sflags int, mode uint32) (session.Handle, session.Attr, LeaseState, error) {
	if !n.fs.lease.on() {
		h, a, err := n.fs.tree.Open(ctx, p, sflags, mode)
		return h, a, 0, err
	}
	if carries(sflags) {
		if w := n.fs.takePaced(); len(w) > 0 {
			// The releases waiting for this OPEN: their changes go with
			// it (asyncclose.go, "Pacing").
			return n.fs.openAfter(ctx, w, p, sflags, mode, openWant(flags))
		}
	}
	return n.fs.lease.tr.OpenLease(ctx, p, sflags, mode, openWant(flags))
}

// created records what this mount made as name in directory n (CREATE,
// MKDIR, SYMLINK, LINK): the name in n's listing, the child's lease (a
// new directory is empty: all its entries are known), the reply's
// timeouts.
func (n *Node) created(child *gofs.Inode, name string, got LeaseState, s0 uint64, emptyDir bool, out *fuse.EntryOut) {
	lc := n.fs.lease
	if lc == nil {
		return
	}
	n.names([]string{name}, nil)
	cn := child.Operations().(*Node)
	lc.install(cn, cn.StableAttr().Ino, got, s0)
	if emptyDir && cn.held(LeaseRead, s0) {
		cn.mu.Lock()
		cn.ls.complete, cn.ls.names, cn.ls.unknown = true, map[string]struct{}{}, nil
		cn.mu.Unlock()
	}
	n.leaseTimeouts(out, cn, s0)
}

// renamed records a rename of name in n to newName in newParent (flags:
// renameat2's) in both directories' listings; err is the rename's.
func (n *Node) renamed(name string, newParent gofs.InodeEmbedder, newName string, flags uint32, err error) {
	np, _ := newParent.(*Node)
	if np == nil {
		return
	}
	if err != nil {
		n.nameUnknown(name)
		np.nameUnknown(newName)
		return
	}
	const exchange = 2 // RENAME_EXCHANGE
	if flags&exchange != 0 {
		n.names([]string{name}, nil)
	} else {
		n.names(nil, []string{name})
	}
	np.names([]string{newName}, nil)
}

// mkdirTree makes directory p, with a Read lease on it on a mount with
// leases.
func (n *Node) mkdirTree(ctx context.Context, p string, mode uint32) (session.Attr, LeaseState, error) {
	if !n.fs.lease.on() {
		a, err := n.fs.tree.Mkdir(ctx, p, mode)
		return a, 0, err
	}
	return n.fs.lease.tr.MkdirLease(ctx, p, mode, LeaseRead)
}

// dirOpenFlags are an OPENDIR's flags: the kernel keeps and fills its
// readdir cache while n holds Read and that cache holds nothing a break
// made doubtful; otherwise it drops the cache at this open.
func (n *Node) dirOpenFlags() (flags uint32, cached bool) {
	if n.fs.lease == nil {
		return 0, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ls.state&LeaseRead != 0 && n.ls.kcache != kcacheSuspect {
		return fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, true
	}
	n.ls.kcache = kcacheEmpty
	return 0, false
}

// filledKernelCache records what the kernel's readdir cache was filled
// from: a listing the lease covered since s0, or not.
func (n *Node) filledKernelCache(s0 uint64) {
	valid := n.held(LeaseRead, s0)
	n.mu.Lock()
	defer n.mu.Unlock()
	if valid && n.ls.kcache != kcacheSuspect {
		n.ls.kcache = kcacheValid
	} else {
		n.ls.kcache = kcacheSuspect
	}
}

// cachedListing is directory n's listing from what it holds: every entry
// known (complete, under Read) and every child's attributes held under
// Read. ok false: ask the server.
func (n *Node) cachedListing() ([]session.DirEntry, bool) {
	n.mu.Lock()
	if n.ls.state&LeaseRead == 0 || !n.ls.complete || len(n.ls.unknown) > 0 {
		n.mu.Unlock()
		return nil, false
	}
	names := make([]string, 0, len(n.ls.names))
	for name := range n.ls.names {
		names = append(names, name)
	}
	n.mu.Unlock()
	slices.Sort(names)
	ents := make([]session.DirEntry, 0, len(names))
	for _, name := range names {
		c := n.GetChild(name)
		if c == nil {
			return nil, false
		}
		cn, ok := c.Operations().(*Node)
		if !ok {
			return nil, false
		}
		a, ok := cn.leasedAttr()
		if !ok {
			return nil, false
		}
		ents = append(ents, session.DirEntry{Name: name, Attr: a})
	}
	return ents, true
}

// leasedAttr returns the attributes n holds under Read, not predicted.
func (n *Node) leasedAttr() (session.Attr, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ls.state&LeaseRead == 0 || !n.freshValid || n.ls.wb.predicted {
		return session.Attr{}, false
	}
	return n.fresh, true
}

// listLeased lists directory n at p on a mount with leases: from what n
// holds when it can, else READDIR with a Read lease on n and its entries.
// leases[i] is ents[i]'s (nil: the entries' nodes already hold theirs);
// s0 is where the listing's request began. ok false: no leases here.
func (n *Node) listLeased(ctx context.Context, p string) (ents []session.DirEntry, leases []LeaseState, s0 uint64, ok bool, err error) {
	lc := n.fs.lease
	if !lc.on() {
		return nil, nil, 0, false, nil
	}
	s0 = n.gen()
	if ents, ok := n.cachedListing(); ok {
		return ents, nil, s0, true, nil
	}
	ents, leases, got, err := lc.tr.ReadDirLease(ctx, p, LeaseRead, LeaseRead)
	if err != nil {
		return nil, nil, s0, true, err
	}
	if ino := n.serverIno(); ino != 0 {
		lc.install(n, ino, got, s0)
	}
	if n.held(LeaseRead, s0) {
		names := make(map[string]struct{}, len(ents))
		for i := range ents {
			names[ents[i].Name] = struct{}{}
		}
		n.mu.Lock()
		n.ls.complete, n.ls.names, n.ls.unknown = true, names, nil
		n.mu.Unlock()
	}
	return ents, leases, s0, true, nil
}
