package fs

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Asynchronous close: a close(2) of a file whose changes a Write lease
// held back (writebehind.go) is answered at once; the BATCH carrying them
// goes from the kernel's RELEASE, which the kernel sends in the background
// right after. Nobody can tell, but for a process on the server host
// reading the export directly:
//
//   - another client's open or stat recalls Write, and the recall waits
//     for a BATCH in flight (flushMu) before it is acknowledged;
//   - on this mount, what could observe the file's server state or
//     overtake the BATCH — an open of it (exec too), a read or write
//     through another handle (whose data path may be attached), a lookup or listing
//     that returns its attributes, a GETATTR not answered from the
//     prediction, a setattr, rename or link of it, its xattrs, a lock,
//     copy_file_range, fallocate, SEEK_DATA — waits for the BATCH first
//     (settle); and statfs (df) waits for every file the mount holds
//     changes of, so that the space they take is counted;
//   - a node the kernel forgets keeps its lease until its BATCH landed
//     (forgetLater);
//   - unmounting waits for releases in flight (sending those that wait
//     for the next open, below) and sends what is still held
//     (Server.Wait, Server.Unmount).
//
// A BATCH that fails after close(2) returned is logged and kept on the
// node for the next write, close or fsync of that file; and every
// failure turns asynchronous close off for syncCloseBackoff, so that the
// following files' close(2) report their own errors (a full disk stays
// full) rather than nothing. close(2) stays synchronous for a handle a
// lock was taken through (or while a process took POSIX locks on the file
// through this mount), for O_SYNC, O_DSYNC, O_DIRECT and O_APPEND handles, and on a
// mount with Options.SyncClose (-o sync_close, NFS's close-to-open to the
// letter). fsync(2) always waits.

// syncCloseBackoff is how long close(2) waits for the BATCH again after a
// BATCH failed.
const syncCloseBackoff = 30 * time.Second

// heldSet is the mount's nodes with changes held back or a BATCH in
// flight: what a listing, statfs and unmounting wait for.
type heldSet struct {
	n  atomic.Int64 // len(m): the barriers' fast path
	mu sync.Mutex
	m  map[*Node]struct{}
}

// noteHeld updates n's membership in the mount's held set: changes held
// back, or a BATCH in flight. Node.mu held.
func (n *Node) noteHeld() {
	lc := n.fs.lease
	in := len(n.ls.wb.ops) > 0 || n.ls.wb.sending
	if lc == nil || in == n.ls.wb.tracked {
		return
	}
	n.ls.wb.tracked = in
	h := &lc.held
	h.mu.Lock()
	if in {
		if h.m == nil {
			h.m = map[*Node]struct{}{}
		}
		h.m[n] = struct{}{}
	} else {
		delete(h.m, n)
	}
	h.n.Store(int64(len(h.m)))
	h.mu.Unlock()
}

// heldNodes returns the nodes with changes held back or in flight.
func (lc *leaseCtl) heldNodes() []*Node {
	if lc == nil || lc.held.n.Load() == 0 {
		return nil
	}
	lc.held.mu.Lock()
	defer lc.held.mu.Unlock()
	ns := make([]*Node, 0, len(lc.held.m))
	for n := range lc.held.m {
		ns = append(ns, n)
	}
	return ns
}

// settle waits until what n held back is on the server: it sends it, or
// waits for the BATCH in flight. A failure stays kept for the file's next
// write, close or fsync (and is logged); the caller goes on.
func (n *Node) settle(ctx context.Context) {
	lc := n.fs.lease
	if lc == nil || lc.held.n.Load() == 0 {
		return
	}
	n.mu.Lock()
	busy := n.ls.wb.tracked
	n.mu.Unlock()
	if busy {
		n.flushDeferred(ctx, true)
	}
}

// settleChild is settle for directory n's child name: the node the kernel
// knows by that name, and the nodes it forgot (below).
func (n *Node) settleChild(ctx context.Context, name string) {
	if lc := n.fs.lease; lc == nil || lc.held.n.Load() == 0 {
		return
	}
	if c := n.GetChild(name); c != nil {
		if cn, ok := c.Operations().(*Node); ok {
			cn.settle(ctx)
		}
	}
	n.settleHeld(ctx, func(string, *gofs.Inode) bool { return false })
}

// settleChildren settles every child of directory n that holds changes
// back, and the nodes the kernel forgot: a listing returns their
// attributes.
func (n *Node) settleChildren(ctx context.Context) {
	n.settleHeld(ctx, func(_ string, p *gofs.Inode) bool { return p == n.EmbeddedInode() })
}

// settleHeld settles the held nodes whose parent match accepts, and those
// with no parent: the kernel forgot them (a directory's lease that went
// made it drop their names) while their BATCH was still to come, and a
// lookup of their name makes a new node, which holds nothing back.
func (n *Node) settleHeld(ctx context.Context, match func(name string, parent *gofs.Inode) bool) {
	for _, c := range n.fs.lease.heldNodes() {
		if name, p := c.Parent(); p == nil || match(name, p) {
			c.settle(ctx)
		}
	}
}

// forgetLater puts OnForget off for a node the kernel forgot while its
// BATCH was still to come, until the BATCH has landed: given up now, its
// Write lease would let another client open the file unrecalled and read
// it as it was before the close. It reports whether it did.
func (n *Node) forgetLater() bool {
	n.mu.Lock()
	busy := n.ls.wb.tracked
	n.mu.Unlock()
	if !busy {
		return false
	}
	n.fs.background(func() {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		n.flushDeferred(ctx, true)
		lc := n.fs.lease
		lc.mu.Lock()
		n.mu.Lock()
		took := lc.nodes[n.ls.ino] != n
		hs := n.ls.handles
		if took {
			// A lookup made a new node of the file meanwhile: the
			// lease is that node's now.
			n.ls.state, n.ls.handles = 0, nil
		}
		n.mu.Unlock()
		lc.mu.Unlock()
		if took {
			lc.forgetHandles(hs)
			return
		}
		n.OnForget()
	})
	return true
}

// closeAsync reports whether f's close(2) may be answered before what its
// node held back is sent (see above).
func (f *fileHandle) closeAsync() bool {
	n := f.node
	if n.fs.lease == nil || n.fs.opts.SyncClose || f.locked.Load() || !f.mayDefer() ||
		time.Now().UnixNano() < n.fs.syncCloseUntil.Load() || n.fs.open.locked(n) {
		return false
	}
	n.mu.Lock()
	ok := n.ls.state&LeaseWrite != 0 && len(n.ls.wb.ops) > 0 && n.ls.wb.err == nil
	q := n.wbq
	n.mu.Unlock()
	return ok && (q == nil || q.idle())
}

// idle reports whether no write of the file is in flight and no failure
// waits to be reported.
func (q *wbQueue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.q) == 0 && q.err == nil
}

// failed turns asynchronous close off for syncCloseBackoff: a BATCH failed.
func (fs *filesystem) failed() {
	fs.syncCloseUntil.Store(time.Now().Add(syncCloseBackoff).UnixNano())
}

// locked reports whether a lock owner of this mount took a lock on n that
// FLUSH may have to release.
func (o *openNodes) locked(n *Node) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	on := o.m[n]
	return on != nil && len(on.owners) > 0
}

// Pacing: the kernel sends a file's RELEASE just before the process's
// next CREATE (tar -x), and each session message costs both processes
// their wake-ups, reads, checks and signatures. So a release with changes
// to send first waits, before it sends or locks anything, until this
// mount's next exclusive create is about to go — which then carries them:
// one BATCH of [the waiting releases' changes…, the OPEN] (openAfter,
// writebehind.go), SMB2's compound of the previous file's close with the
// next file's create — or until releasePace passed, when it sends them
// alone. Only an exclusive create carries them (carries, lease_node.go):
// another OPEN may wait for another mount's recall, which may wait for
// that mount's own compound. Meanwhile its node holds the changes back
// like any other, which every barrier above (settle, the lease recall,
// statfs, forgetLater) sends itself, the release then finding nothing left to send; unmounting
// sends the waiting releases at once (stopPacing).

// releasePace bounds how long a release waits for the next exclusive
// create.
const releasePace = time.Millisecond

// pacer holds the releases that wait for the next exclusive create.
type pacer struct {
	mu      sync.Mutex
	q       []pacedRelease // counted in filesystem.releases
	t       *time.Timer    // sends q when the first of them waited releasePace
	stopped bool           // unmounting: none waits
	waiting atomic.Int64   // len(q): takePaced's fast path
}

// pacedRelease is a release waiting for the next exclusive create: its
// node's held changes may go with that OPEN, and run (the release) goes
// on after.
type pacedRelease struct {
	n   *Node
	run func()
}

// paced runs release (of a handle of n) in the background once the
// mount's next exclusive create is sent (carries), or releasePace passed.
func (fs *filesystem) paced(n *Node, release func()) {
	d := setting(fs.opts.releasePace, releasePace)
	p := &fs.pacer
	fs.releases.Add(1)
	p.mu.Lock()
	if p.stopped || d <= 0 {
		p.mu.Unlock()
		fs.dispatch(release)
		return
	}
	p.q = append(p.q, pacedRelease{n, release})
	p.waiting.Store(int64(len(p.q)))
	if len(p.q) == 1 {
		if p.t == nil {
			p.t = time.AfterFunc(d, fs.sendPaced)
		} else {
			p.t.Reset(d)
		}
	}
	p.mu.Unlock()
}

// takePaced takes the waiting releases: an exclusive create is about to be
// sent. The
// caller hands each to dispatch.
func (fs *filesystem) takePaced() []pacedRelease {
	p := &fs.pacer
	if p.waiting.Load() == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.q
	p.q = nil
	p.waiting.Store(0)
	if p.t != nil {
		p.t.Stop()
	}
	return q
}

// sendPaced hands the waiting releases to workers, each to send its own
// BATCH: the first of them waited releasePace, or the mount is going.
func (fs *filesystem) sendPaced() {
	for _, r := range fs.takePaced() {
		fs.dispatch(r.run)
	}
}

// stopPacing sends the waiting releases and makes the next ones wait for
// nothing: the mount is going.
func (fs *filesystem) stopPacing() {
	fs.pacer.mu.Lock()
	fs.pacer.stopped = true
	fs.pacer.mu.Unlock()
	fs.sendPaced()
}

// background runs a release in the background, counted for unmounting:
// on a worker waiting for one, else on a new worker. A worker waits
// workerIdle for the next release before it ends, so that a burst of
// closes (tar -x) reuses a few goroutines whose stacks already grew
// rather than growing a new one's per file.
func (fs *filesystem) background(release func()) {
	fs.releases.Add(1)
	fs.dispatch(release)
}

// dispatch hands a counted release to a worker.
func (fs *filesystem) dispatch(release func()) {
	select {
	case fs.idle <- release:
	default:
		go fs.worker(release)
	}
}

// workerIdle is how long a background worker waits for another release.
const workerIdle = time.Second

// worker runs release, then the releases handed to it while it waits.
func (fs *filesystem) worker(release func()) {
	var t *time.Timer
	for {
		release()
		fs.releases.Done()
		if t == nil {
			t = time.NewTimer(workerIdle)
		} else {
			t.Reset(workerIdle)
		}
		select {
		case release = <-fs.idle:
		case <-t.C:
			return
		}
	}
}

// Server is a mount's FUSE server: go-fuse's, whose Wait and Unmount also
// wait until what the mount's closed files held back is on the server.
type Server struct {
	*fuse.Server
	fs *filesystem
}

// Wait waits until the mount is gone and what its files held back is on
// the server.
func (s *Server) Wait() {
	s.Server.Wait()
	s.fs.settleAll()
}

// Unmount unmounts and returns once what the mount's files held back is
// on the server.
func (s *Server) Unmount() error {
	err := s.Server.Unmount()
	if err == nil {
		s.fs.settleAll()
	}
	return err
}

// settleAll waits for the releases in flight and sends whatever is still
// held back: the kernel drops a RELEASE it had not handed over when the
// mount goes. The files go at once, not one after another: with the
// server gone each waits for it up to the reconnect timeout.
func (fs *filesystem) settleAll() {
	fs.stopPacing()
	fs.releases.Wait()
	var wg sync.WaitGroup
	for _, n := range fs.lease.heldNodes() {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			defer cancel()
			n.flushDeferred(ctx, true)
		})
	}
	wg.Wait()
}
