package fs

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// Leases on the client (docs/usage.md, "Caching and consistency";
// docs/session.md, "Leases"). A lookup, open, mkdir or listing asks the
// server for a lease on what it returns; while a node holds one, what the
// lease covers is answered from the kernel's caches with long timeouts or
// from the node itself, with no round trip: a file's attributes and data
// (Read), a closed read handle kept for the next open (Handle), writes and
// attribute changes held back until close (Write, writebehind.go); a
// directory's attributes, its entries, the names absent from it and its
// listing (Read). A LEASE_BREAK from the server turns into go-fuse notify
// calls — entries, negative entries, attributes, pages — before it is
// acknowledged. Without a lease, the mount's attribute and entry timeouts
// apply as before.

// LeaseState is a set of lease rights (session.LeaseState).
type LeaseState = session.LeaseState

// Lease rights.
const (
	LeaseRead   = session.LeaseRead
	LeaseHandle = session.LeaseHandle
	LeaseWrite  = session.LeaseWrite
)

// leaseTimeout is how long the kernel may trust entries and attributes a
// lease covers. A break invalidates them at once; the timeout only bounds
// what a lost break (a bug) could cost.
const leaseTimeout = time.Hour

// predictedTimeout is the attribute timeout of attributes predicted for
// changes held back under a Write lease. They are what the file will be
// but for its ctime and block count, which the server decides: when the
// changes reach it, the kernel is told to drop them (flushDeferred).
const predictedTimeout = time.Second

// SessionLeaser is the lease half of a connected tree: *session.Tree, and
// the Reconnector over it.
type SessionLeaser interface {
	// Leases reports whether the share grants leases now.
	Leases() bool
	// OnLeaseBreak sets the handler of the tree's lease breaks.
	OnLeaseBreak(func(session.LeaseBreak) LeaseState)
	Lease(ctx context.Context, path string, want LeaseState) (session.Attr, LeaseState, error)
	ReleaseLeases(ctx context.Context, inos []uint64) error
	OpenLease(ctx context.Context, path string, flags int, mode uint32, want LeaseState) (session.Handle, session.Attr, LeaseState, error)
	MkdirLease(ctx context.Context, path string, mode uint32, want LeaseState) (session.Attr, LeaseState, error)
	ReadDirLease(ctx context.Context, path string, want, entryWant LeaseState) ([]session.DirEntry, []LeaseState, LeaseState, error)
	Batch(ctx context.Context, ops []session.BatchOp) ([]session.BatchResult, error)
	// CloseHandles closes handles, several per round trip.
	CloseHandles(ctx context.Context, hs []session.Handle) error
}

var _ SessionLeaser = (*session.Tree)(nil)

// maxBrokenMemory bounds the inode numbers whose last break is remembered;
// past it, every older grant is distrusted at once (floor).
const maxBrokenMemory = 4096

// leaseCtl is a mount's leases: which node holds which, and when each was
// last broken, so that a grant that a break may have overtaken is not
// trusted.
type leaseCtl struct {
	fs  *filesystem
	tr  SessionLeaser
	log logrus.FieldLogger

	mu        sync.Mutex
	floor     uint64            // grants from requests begun before it are not trusted
	broken    map[uint64]uint64 // inode → fs.seq at its last break
	nodes     map[uint64]*Node  // inode → its node, once a lease was asked for it
	release   []uint64          // leases of forgotten nodes, to give up
	releasing bool
	closes    []pendingClose // released handles, closed together (closeLater)
	closing   bool
	cached    []*cachedHandle // handles kept under Handle leases, oldest first
	held      heldSet         // nodes with changes held back or in flight (asyncclose.go)
}

func newLeaseCtl(fs *filesystem, tr SessionLeaser) *leaseCtl {
	lc := &leaseCtl{fs: fs, tr: tr, log: fs.log, broken: map[uint64]uint64{}, nodes: map[uint64]*Node{}}
	tr.OnLeaseBreak(lc.onBreak)
	return lc
}

// on reports whether leases may be asked for now.
func (lc *leaseCtl) on() bool { return lc != nil && lc.tr.Leases() }

// nodeLease is a node's lease state, guarded by Node.mu.
type nodeLease struct {
	state LeaseState
	ino   uint64 // the server's inode number (the root's is not 1)
	since uint64 // fs.seq when the lease was installed
	// Directories: the names present when complete (every entry known:
	// a lookup of any other name is answered ENOENT without asking),
	// names a break made unknown, names answered ENOENT to the kernel
	// with the lease timeout, and the kernel's readdir cache.
	complete bool
	names    map[string]struct{}
	unknown  map[string]struct{}
	negs     map[string]struct{}
	kcache   kernelDirCache
	// Files: read handles kept open (Handle), and what writebehind.go
	// holds back.
	handles []*cachedHandle
	wb      writeBehind
}

// kernelDirCache is what the kernel's readdir cache of a directory holds
// (FOPEN_CACHE_DIR, which go-fuse pairs with FOPEN_KEEP_CACHE).
type kernelDirCache uint8

const (
	kcacheEmpty   kernelDirCache = iota // dropped at the last open, or never filled
	kcacheValid                         // filled from a listing the lease still covers
	kcacheSuspect                       // filled from something a break may have made stale
)

// trusted reports whether a grant for ino from a request begun at s0 may
// be installed: no break of it (or of every lease) since. lc.mu held.
func (lc *leaseCtl) trusted(ino, s0 uint64) bool {
	return s0 >= lc.floor && lc.broken[ino] <= s0
}

// noteBreak records a break of ino (0: every lease). lc.mu held.
func (lc *leaseCtl) noteBreak(ino uint64) {
	seq := lc.fs.seq.Add(1)
	if ino == 0 || len(lc.broken) >= maxBrokenMemory {
		lc.floor = seq
		clear(lc.broken)
	}
	if ino != 0 {
		lc.broken[ino] = seq
	}
}

// install gives n the lease got on inode ino, granted in answer to a
// request begun at s0 — unless a break may have overtaken it. A grant
// that holds less than n held (the server took something back without a
// break) drops what it no longer covers. It returns what n now holds.
// The check and the node's new state are one step under lc.mu, which a
// break takes too: a grant can never land after a break that overtook it.
func (lc *leaseCtl) install(n *Node, ino uint64, got LeaseState, s0 uint64) LeaseState {
	if lc == nil {
		return 0
	}
	lc.mu.Lock()
	if got != 0 && !lc.trusted(ino, s0) {
		got = 0
	}
	// Known even without a lease: the server may think it granted one
	// (refused here, overtaken), and its break still says the node
	// changed.
	lc.nodes[ino] = n
	if got != 0 {
		lc.unrelease(ino)
	}
	n.mu.Lock()
	if got != 0 && (n.ls.state == 0 || n.ls.ino != ino) {
		// What the reply carried was read after the server registered
		// the lease: it is covered from the request's start.
		n.ls.since = s0
	}
	n.ls.ino = ino
	n.mu.Unlock()
	ch := n.changeLease(got, got, nil, false)
	lc.mu.Unlock()
	// Inside a FUSE request: what the grant no longer covers is told to
	// the kernel in the background.
	n.afterChange(ch, true)
	return got
}

// held reports whether n holds every right of want, installed before s0
// and not broken since: what a reply to a request begun at s0 says may be
// cached for the lease's time.
func (n *Node) held(want LeaseState, s0 uint64) bool {
	lc := n.fs.lease
	if lc == nil {
		return false
	}
	n.mu.Lock()
	ok := n.ls.state&want == want && n.ls.since <= s0
	ino := n.ls.ino
	n.mu.Unlock()
	if !ok {
		return false
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.trusted(ino, s0)
}

// brokenDuring makes the next open drop the kernel's pages of n when a
// break of it came while a request begun at g was out: what that request
// saw (size, mtime) may already be stale, and close-to-open's comparison
// cannot tell two changes in one timestamp tick apart.
func (n *Node) brokenDuring(ino, g uint64) {
	lc := n.fs.lease
	if lc == nil {
		return
	}
	lc.mu.Lock()
	broken := !lc.trusted(ino, g)
	lc.mu.Unlock()
	if broken {
		n.mu.Lock()
		n.cache = validator{}
		n.mu.Unlock()
	}
}

// holdsWrite reports whether n holds a Write lease now.
func (n *Node) holdsWrite() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ls.state&LeaseWrite != 0
}

// holdsRead reports whether n holds a Read lease now.
func (n *Node) holdsRead() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ls.state&LeaseRead != 0
}

// onBreak is the handler of the server's breaks: it runs on a goroutine
// of its own per break, and the session channel acknowledges the break
// with what it returns once it is done.
func (lc *leaseCtl) onBreak(b session.LeaseBreak) LeaseState {
	lc.mu.Lock()
	lc.noteBreak(b.Ino)
	var ns []*Node
	if b.Ino == 0 {
		for _, n := range lc.nodes {
			ns = append(ns, n)
		}
		clear(lc.nodes)
	} else if n := lc.nodes[b.Ino]; n != nil {
		ns = append(ns, n)
	}
	chs := make([]leaseChange, len(ns))
	for i, n := range ns {
		chs[i] = n.changeLease(b.New, 0, b.Names, true)
	}
	lc.mu.Unlock()
	for i, n := range ns {
		if b.Ino != 0 {
			// The break lets another client see the file: this
			// mount's posted writes reach the server first
			// (writeasync.go). (Ino 0 is the lost session's.)
			n.drainWrites()
		}
		n.afterChange(chs[i], false)
	}
	lc.log.WithFields(logrus.Fields{"ino": b.Ino, "from": b.Current, "to": b.New, "names": len(b.Names)}).Debug("lease break")
	return b.New
}

// revokeAll drops every lease (the session that held them is gone).
func (lc *leaseCtl) revokeAll() { lc.onBreak(session.LeaseBreak{}) }

// leaseChange is what changeLease changed, for afterChange.
type leaseChange struct {
	lost    LeaseState
	names   []string
	negs    []string
	handles []*cachedHandle
	dir     bool
	none    bool // nothing to do
}

// changeLease makes n hold what it held within keep, plus grant, and
// drops what that no longer covers from the node: its attributes, a
// directory's listing (or the named entries), a file's validator, the
// kept handles. A break keeps b.New and grants nothing; a grant keeps and
// grants what it gave (brk false). lc.mu held; afterChange does the rest.
func (n *Node) changeLease(keep, grant LeaseState, names []string, brk bool) leaseChange {
	n.mu.Lock()
	defer n.mu.Unlock()
	old := n.ls.state
	n.ls.state = old&keep | grant
	ch := leaseChange{lost: old &^ n.ls.state, names: names, dir: n.IsDir()}
	if !brk && ch.lost == 0 {
		ch.none = true // a grant that takes nothing away
		return ch
	}
	if old == 0 && brk && !ch.dir {
		// A break of a file this mount holds no lease on (the grant was
		// refused here, overtaken by an earlier break): the server says
		// it changed, which close-to-open's size and mtime may not show.
		ch.lost = LeaseRead
	}
	n.freshValid = false
	n.freshGen = n.fs.seq.Add(1)
	if ch.dir {
		n.ls.kcache = kcacheSuspect
		if ch.lost&LeaseRead != 0 || old == 0 {
			n.ls.complete, n.ls.names, n.ls.unknown = false, nil, nil
			for name := range n.ls.negs {
				ch.negs = append(ch.negs, name)
			}
			n.ls.negs = nil
		} else {
			for _, name := range names {
				delete(n.ls.negs, name)
				if n.ls.complete {
					delete(n.ls.names, name)
					if n.ls.unknown == nil {
						n.ls.unknown = map[string]struct{}{}
					}
					n.ls.unknown[name] = struct{}{}
				}
			}
		}
	} else if ch.lost&LeaseRead != 0 {
		n.cache = validator{}
	}
	if ch.lost&LeaseHandle != 0 {
		ch.handles, n.ls.handles = n.ls.handles, nil
	}
	return ch
}

// afterChange finishes a lease change: Write lost sends what was held
// back (and closes the handles that wrote) first, Handle lost closes the
// kept handles, and the kernel is told — a directory's named entries, or
// all it knows when Read goes; a file's attributes, and its pages when
// Read goes. async: inside a FUSE request, where the kernel's
// notifications must not wait for that request's locks.
func (n *Node) afterChange(ch leaseChange, async bool) {
	if ch.none {
		return
	}
	if ch.lost&LeaseWrite != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), nsTimeout)
		n.flushDeferred(ctx, true)
		cancel()
		n.fs.lease.closeNow(n)
	}
	n.fs.lease.forgetHandles(ch.handles)
	notify := func() {
		if !ch.dir {
			if ch.lost&LeaseRead != 0 {
				n.NotifyContent(0, 0)
			} else {
				n.NotifyContent(-1, 0)
			}
			return
		}
		for _, name := range ch.names {
			n.NotifyEntry(name)
		}
		if ch.lost&LeaseRead != 0 {
			for name := range n.Children() {
				if !slices.Contains(ch.names, name) {
					n.NotifyEntry(name)
				}
			}
			for _, name := range ch.negs {
				n.NotifyEntry(name)
			}
		}
		// Attributes and the readdir cache's pages.
		n.NotifyContent(0, 0)
	}
	if async {
		go notify()
	} else {
		notify()
	}
}

var _ = (interface{ OnForget() })((*Node)(nil))

// OnForget gives up the lease of a node the kernel forgot: nothing is
// cached of it any more (go-fuse calls this when the kernel's FORGET
// leaves the node unreachable).
func (n *Node) OnForget() {
	lc := n.fs.lease
	if lc == nil || n.forgetLater() {
		return
	}
	n.mu.Lock()
	st, ino, hs := n.ls.state, n.ls.ino, n.ls.handles
	n.ls.state, n.ls.handles = 0, nil
	n.mu.Unlock()
	lc.forgetHandles(hs)
	lc.mu.Lock()
	if lc.nodes[ino] == n {
		delete(lc.nodes, ino)
	}
	if st != 0 {
		lc.release = append(lc.release, ino)
		if !lc.releasing {
			lc.releasing = true
			time.AfterFunc(releaseDelay, lc.sendReleases)
		}
	}
	lc.mu.Unlock()
}

// releaseDelay gathers the releases of a burst of forgotten nodes (a
// drop_caches forgets thousands at once) into one LEASE request.
const releaseDelay = 50 * time.Millisecond

// maxReleases bounds the inode numbers of one LEASE request.
const maxReleases = 4096

// sendReleases gives up the leases of forgotten nodes. A lease of the same
// inode granted while the release is on its way may be the one released:
// grants from requests begun before the release came back are not trusted
// (the release counts as a break of each).
func (lc *leaseCtl) sendReleases() {
	for {
		lc.mu.Lock()
		inos := lc.release[:min(len(lc.release), maxReleases)]
		lc.release = lc.release[len(inos):]
		if len(inos) == 0 {
			lc.releasing = false
			lc.mu.Unlock()
			return
		}
		lc.mu.Unlock()
		lc.noteBreaks(inos)
		if lc.on() {
			ctx, cancel := context.WithTimeout(context.Background(), nsTimeout)
			if err := lc.tr.ReleaseLeases(ctx, inos); err != nil {
				lc.log.WithError(err).WithField("leases", len(inos)).Debug("fs: giving leases up")
			}
			cancel()
		}
		lc.noteBreaks(inos)
	}
}

// noteBreaks records breaks of inos.
func (lc *leaseCtl) noteBreaks(inos []uint64) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for _, ino := range inos {
		lc.noteBreak(ino)
	}
}

// unrelease takes ino off the releases not sent yet (its lease was granted
// again). lc.mu held.
func (lc *leaseCtl) unrelease(ino uint64) {
	if i := slices.Index(lc.release, ino); i >= 0 {
		lc.release = slices.Delete(lc.release, i, i+1)
	}
}
