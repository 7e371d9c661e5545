package fs

import (
	"context"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// Write leases: while a node holds Write — the server granted it because
// no other client has the file open or holds any lease on it, typically a
// file this mount just created — its small writes and attribute changes
// through an open handle are answered at once and held back, and go to
// the server as one BATCH when the file is closed (or synced, read,
// written further, broken, or after wbMaxAge). `tar -x`'s "create, write,
// utimens, chown, chmod, close" then costs two round trips instead of
// eight (one, with the next file's OPEN carrying the BATCH: asyncclose.go,
// "Pacing") — and close(2) does not wait for the BATCH: the kernel's
// RELEASE, which follows in the background, sends it, and whatever
// on this mount looks at the file next waits for it first (settle). The
// kernel is answered with predicted attributes meanwhile. A failure of
// the held-back requests is logged and reported by the file's next write,
// close(2) or fsync (the close itself with -o sync_close, and for 30 s
// after any failure), as NFS and local filesystems report write-back
// errors. Another client's open or stat recalls Write first: this mount
// sends what it held back (or waits for the BATCH in flight) before the
// server lets that client see the file, so nobody else ever sees it
// stale. Only the first
// leaseHoldMax bytes of a handle are held back, and only before its LWIO
// data path is attached; never appends, O_DIRECT or O_SYNC. Writes posted
// over LWIO (writeasync.go) are waited for before a BATCH goes, so the
// held-back writes land after them.

// leaseHoldMax is how many bytes of a handle's first writes a Write lease
// may hold back (what a small file's writer sends: tar -x, a compiler's
// output, an editor's save).
const leaseHoldMax = 128 << 10

// wbMaxAge bounds how long a change is held back.
const wbMaxAge = time.Second

// maxDeferredOps bounds the requests held back per file (BATCH takes 256,
// one is the closing fstat).
const maxDeferredOps = 200

// writeBehind is what a node holds back; guarded by Node.mu, but flushMu.
type writeBehind struct {
	ops       []session.BatchOp
	bytes     int
	predicted bool  // Node.fresh is predicted, not the server's
	err       error // a kept failure (a background flush's, an unlock's), for the next write, close or fsync
	timer     *time.Timer
	fh        *fileHandle // an open handle that may hold back: fchmod and utimens come without one
	sending   bool        // a BATCH is in flight
	tracked   bool        // in the mount's held set (asyncclose.go): ops held or sending
	flushMu   sync.Mutex  // one flush at a time, in order
}

// writable records that f, a handle of n that may hold changes back, is
// open: setattrs the kernel sends without a handle (fchmod, fchown,
// futimens and their path forms) go through it.
func (f *fileHandle) writable() {
	n := f.node
	if n.fs.lease == nil || !f.mayDefer() {
		return
	}
	n.mu.Lock()
	n.ls.wb.fh = f
	n.mu.Unlock()
}

// closing forgets f as n's handle for setattrs: f is being closed (the
// kernel's RELEASE comes in the background, after close(2) returned).
func (f *fileHandle) closing() {
	n := f.node
	n.mu.Lock()
	if n.ls.wb.fh == f {
		n.ls.wb.fh = nil
	}
	n.mu.Unlock()
}

// holding reports whether n holds changes back.
func (n *Node) holding() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.ls.wb.ops) > 0 || n.ls.wb.err != nil
}

// mayDefer reports whether f's changes may be held back (its node holding
// Write checked by the caller).
func (f *fileHandle) mayDefer() bool {
	return f.node.fs.lease != nil && f.flags&syscall.O_ACCMODE != syscall.O_RDONLY &&
		f.flags&(syscall.O_APPEND|syscall.O_DIRECT|syscall.O_SYNC|syscall.O_DSYNC) == 0 &&
		f.data.Load() == nil
}

// deferWrite holds a write back when it may; otherwise it sends what the
// node held back first, so that writes reach the server in order. done
// says the write is answered (with errno).
func (f *fileHandle) deferWrite(ctx context.Context, buf []byte, off int64) (done bool, errno syscall.Errno) {
	n := f.node
	if n.fs.lease == nil {
		return false, 0
	}
	kill, serverClears, mayHold := n.killSetIDHold(ctx)
	n.mu.Lock()
	if mayHold && n.ls.state&LeaseWrite != 0 && f.mayDefer() && n.freshValid && n.ls.wb.err == nil &&
		n.ls.wb.bytes+len(buf) <= leaseHoldMax && len(n.ls.wb.ops) < maxDeferredOps &&
		f.heldBack.Load()+int64(len(buf)) <= leaseHoldMax {
		f.heldBack.Add(int64(len(buf)))
		n.killSetIDHeld(kill, f.h)
		n.hold(session.BatchOp{Command: session.CmdWrite, Handle: f.h, Offset: uint64(off), Data: append([]byte(nil), buf...)})
		a := n.fresh
		if end := uint64(off) + uint64(len(buf)); end > a.Size {
			a.Size = end
		}
		a.Blocks = (a.Size + 511) / 512
		now := time.Now()
		a.Mtime, a.Ctime = now, now
		if serverClears {
			a.Mode, _ = setIDCleared(a.Mode) // as the server's write will (killpriv.go)
		}
		n.predict(a)
		n.cache = validator{}
		n.mu.Unlock()
		return true, 0
	}
	// A BATCH in flight (a closed handle's, a timer's) too: this write
	// must not land under it (asyncclose.go).
	pending := len(n.ls.wb.ops) > 0 || n.ls.wb.err != nil || n.ls.wb.sending
	n.mu.Unlock()
	if pending {
		if err := n.flushDeferred(ctx, false); err != nil {
			return true, f.errno("write", err)
		}
	}
	return false, 0
}

// mayHoldSetattr reports whether a setattr through f (nil: by path) could
// be held back: an open handle of n may hold changes back.
func (n *Node) mayHoldSetattr(f gofs.FileHandle) bool {
	if fh, ok := f.(*fileHandle); ok && fh.mayDefer() {
		return true
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ls.wb.fh != nil
}

// deferSetattr holds back a setattr through handle f when it may, and
// returns the attributes predicted after it; serverClears: a truncate or
// chown in it clears the set-id bits on the server (killpriv.go).
func (n *Node) deferSetattr(f gofs.FileHandle, in session.SetAttrIn, serverClears bool) (session.Attr, bool) {
	if n.fs.lease == nil || in.Valid == 0 {
		return session.Attr{}, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	fh, ok := f.(*fileHandle)
	if !ok {
		fh = n.ls.wb.fh
	}
	if fh == nil || n.ls.state&LeaseWrite == 0 || !fh.mayDefer() || !n.freshValid || n.ls.wb.err != nil || len(n.ls.wb.ops) >= maxDeferredOps {
		return session.Attr{}, false
	}
	n.hold(session.BatchOp{Command: session.CmdSetAttr, Handle: fh.h, SetAttr: in})
	a, now := n.fresh, time.Now()
	if in.Valid&session.SetMode != 0 {
		a.Mode = a.Mode&^07777 | in.Mode&07777
	}
	if in.Valid&session.SetUid != 0 {
		a.Uid = in.Uid
	}
	if in.Valid&session.SetGid != 0 {
		a.Gid = in.Gid
	}
	if in.Valid&session.SetSize != 0 {
		a.Size, a.Mtime = in.Size, now
		a.Blocks = (a.Size + 511) / 512
		n.cache = validator{}
	}
	if in.Valid&session.SetAtime != 0 {
		a.Atime = pick(in.AtimeNow, now, in.Atime)
	}
	if in.Valid&session.SetMtime != 0 {
		a.Mtime = pick(in.MtimeNow, now, in.Mtime)
	}
	if serverClears && in.Valid&(session.SetSize|session.SetUid|session.SetGid) != 0 && in.Valid&session.SetMode == 0 {
		a.Mode, _ = setIDCleared(a.Mode)
	}
	a.Ctime = now
	n.predict(a)
	return a, true
}

func pick(now bool, t, given time.Time) time.Time {
	if now {
		return t
	}
	return given
}

// hold queues op; Node.mu held.
func (n *Node) hold(op session.BatchOp) {
	n.ls.wb.ops = append(n.ls.wb.ops, op)
	n.ls.wb.bytes += len(op.Data)
	n.noteHeld()
	if n.ls.wb.timer == nil {
		n.ls.wb.timer = time.AfterFunc(wbMaxAge, func() { n.flushDeferred(context.Background(), true) })
	}
}

// predict makes a the node's attributes until the held-back changes are
// sent; a reply to a request in flight must not replace them. Node.mu
// held.
func (n *Node) predict(a session.Attr) {
	n.sawMode(a.Mode)
	n.fresh, n.freshAt, n.freshValid = a, time.Now(), true
	n.freshGen = n.fs.seq.Add(1)
	n.ls.wb.predicted = true
}

// predictedAttr returns the attributes predicted for held-back changes.
func (n *Node) predictedAttr() (session.Attr, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fresh, n.ls.wb.predicted && n.freshValid
}

// flushDeferred sends what the node held back, as one BATCH ending with an
// fstat of the last handle (the attributes the prediction is replaced
// with), after the node's posted writes. Its failure is returned, and so
// is a failure kept earlier; keep (a flush nobody waits for — a timer, a
// break — or an unlock's) keeps it for the next close, fsync or write.
func (n *Node) flushDeferred(ctx context.Context, keep bool) error {
	// The writes posted over LWIO land first (writeasync.go) — without
	// leases too: fallocate, SEEK_DATA/HOLE and copy_file_range call this
	// so that the server acts on every earlier write.
	n.drainWrites()
	lc := n.fs.lease
	if lc == nil {
		return nil
	}
	n.ls.wb.flushMu.Lock()
	defer n.ls.wb.flushMu.Unlock()
	ops, kept := n.takeOps(keep)
	if len(ops) == 0 {
		return kept
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	res, err := lc.tr.Batch(ctx, ops)
	if err == nil {
		err = batchErr(res, len(ops))
	}
	if n.landed(res, err, keep) {
		n.NotifyContent(-1, 0)
	}
	if err != nil {
		return err
	}
	return kept
}

// takeOps takes what the node held back, with the closing fstat, and
// marks it in flight; kept is a failure kept earlier (left kept if keep).
// flushMu held.
func (n *Node) takeOps(keep bool) (ops []session.BatchOp, kept error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ops = n.ls.wb.ops
	n.ls.wb.ops, n.ls.wb.bytes = nil, 0
	if n.ls.wb.timer != nil {
		n.ls.wb.timer.Stop()
		n.ls.wb.timer = nil
	}
	kept = n.ls.wb.err
	if !keep {
		n.ls.wb.err = nil
	}
	n.ls.wb.sending = len(ops) > 0
	if len(ops) == 0 {
		return nil, kept
	}
	return append(ops, session.BatchOp{Command: session.CmdSetAttr, Handle: ops[len(ops)-1].Handle}), kept
}

// batchErr is the failure among a BATCH's results for want requests.
func batchErr(res []session.BatchResult, want int) error {
	for _, r := range res {
		if r.Status != protocol.StatusSuccess {
			return r.Status
		}
	}
	if len(res) != want {
		return protocol.StatusInvalidNetworkResp
	}
	return nil
}

// landed records the outcome of the node's BATCH (takeOps' ops; res its
// results, err its failure): the server's attributes replace the
// prediction unless more was held back meanwhile; a failure is logged,
// kept if keep, and turns asynchronous close off for a while. It reports
// whether the kernel should be told to drop the predicted attributes
// (NotifyContent, attributes only; not under a FUSE request of this
// file). flushMu held.
func (n *Node) landed(res []session.BatchResult, err error, keep bool) (replaced bool) {
	n.mu.Lock()
	replaced = len(n.ls.wb.ops) == 0
	if replaced {
		n.ls.wb.predicted = false
		if err == nil {
			n.fresh, n.freshAt, n.freshValid = res[len(res)-1].Attr, time.Now(), true
			n.sawMode(n.fresh.Mode)
		} else {
			n.freshValid = false
		}
		n.freshGen = n.fs.seq.Add(1)
	}
	if err != nil && keep {
		n.ls.wb.err = err
	}
	n.ls.wb.sending = false
	n.noteHeld()
	n.mu.Unlock()
	if err != nil {
		n.fs.failed() // the next files' close(2) wait, and report their own (asyncclose.go)
		n.fs.log.WithError(err).WithField("path", n.path()).Warn("fs: held-back writes failed")
	}
	return replaced
}

// batchOpener is a lease tree that sends changes held back and an OPEN as
// one BATCH (the Reconnector).
type batchOpener interface {
	OpenLeaseAfter(ctx context.Context, ops []session.BatchOp, path string, flags int, mode uint32, want LeaseState) (res []session.BatchResult, h session.Handle, a session.Attr, got LeaseState, ran bool, err error)
}

// heldSend is one node's changes inside an OPEN's BATCH (openAfter): its
// ops are all[from:from+len(ops)]; the node's flushMu is held.
type heldSend struct {
	n    *Node
	ops  []session.BatchOp
	from int
}

// takeHeld takes what n held back for an OPEN's BATCH, its flushMu held
// until the caller's landed or putBack: nothing when it holds nothing, a
// flush of it is under way (it goes on its own), a failure is kept (its
// release reports it) or its posted writes are still in flight (they land
// first: its release waits for them).
func (n *Node) takeHeld() []session.BatchOp {
	if n.fs.wb.pending.Load() != 0 {
		n.mu.Lock()
		q := n.wbq
		n.mu.Unlock()
		if q != nil && !q.idle() {
			return nil
		}
	}
	if !n.ls.wb.flushMu.TryLock() {
		return nil
	}
	n.mu.Lock()
	ok := len(n.ls.wb.ops) > 0 && n.ls.wb.err == nil
	n.mu.Unlock()
	if !ok {
		n.ls.wb.flushMu.Unlock()
		return nil
	}
	ops, _ := n.takeOps(true)
	return ops
}

// putBack gives the node back the changes takeHeld took, unsent (the
// BATCH stopped before them), ahead of any held since, and releases
// flushMu; its release, which runs next, sends them.
func (n *Node) putBack(ops []session.BatchOp) {
	ops = ops[:len(ops)-1] // the closing fstat
	n.mu.Lock()
	n.ls.wb.ops = append(ops, n.ls.wb.ops...)
	for _, op := range ops {
		n.ls.wb.bytes += len(op.Data)
	}
	n.ls.wb.sending = false
	if n.ls.wb.timer == nil {
		n.ls.wb.timer = time.AfterFunc(wbMaxAge, func() { n.flushDeferred(context.Background(), true) })
	}
	n.noteHeld()
	n.mu.Unlock()
	n.ls.wb.flushMu.Unlock()
}

// openAfter opens p as OpenLease does, taking the waiting releases w
// (asyncclose.go, "Pacing") with it: their nodes' held-back changes and the
// OPEN go as one BATCH, and the releases then go on in the background,
// finding nothing left to send. When a change fails the server stops
// there and never runs the OPEN: the failure is the node's as when its
// own BATCH fails (kept, logged, close(2) synchronous for a while), the
// changes after it go back to their nodes, and the OPEN is sent alone.
// A BATCH that fails as a whole gives every node its changes back: each
// release then sends its own, whose failure is its file's.
func (fs *filesystem) openAfter(ctx context.Context, w []pacedRelease, p string, flags int, mode uint32, want LeaseState) (session.Handle, session.Attr, LeaseState, error) {
	lc := fs.lease
	notify := map[*Node]bool{}
	defer func() {
		for _, r := range w {
			n, tell := r.n, notify[r.n]
			delete(notify, n)
			fs.dispatch(func() {
				if tell {
					n.NotifyContent(-1, 0)
				}
				r.run()
			})
		}
	}()
	bo, ok := lc.tr.(batchOpener)
	if !ok || want == 0 {
		return lc.tr.OpenLease(ctx, p, flags, mode, want)
	}
	var sends []heldSend
	var all []session.BatchOp
	for _, r := range w {
		if _, seen := notify[r.n]; seen {
			continue
		}
		notify[r.n] = false
		ops := r.n.takeHeld()
		if len(ops) == 0 {
			continue
		}
		if len(all)+len(ops) >= session.MaxBatchOps { // the OPEN takes one
			r.n.putBack(ops)
			continue
		}
		sends = append(sends, heldSend{r.n, ops, len(all)})
		all = append(all, ops...)
	}
	if len(sends) == 0 {
		return lc.tr.OpenLease(ctx, p, flags, mode, want)
	}
	res, h, a, got, ran, err := bo.OpenLeaseAfter(ctx, all, p, flags, mode, want)
	for _, s := range sends {
		end := s.from + len(s.ops)
		switch {
		case err != nil && !ran, len(res) <= s.from:
			// Not run: the BATCH failed as a whole (one file's handle
			// not reclaimed after a reconnect is not the others'
			// failure), or a change before failed. The release sends
			// them in a BATCH of their own, which tells whose failure
			// it is.
			s.n.putBack(s.ops)
			continue
		case len(res) < end || res[end-1].Status != protocol.StatusSuccess:
			notify[s.n] = s.n.landed(nil, batchErr(res[s.from:min(end, len(res))], len(s.ops)), true)
		default:
			notify[s.n] = s.n.landed(res[s.from:end], nil, true)
		}
		s.n.ls.wb.flushMu.Unlock()
	}
	if !ran {
		return lc.tr.OpenLease(ctx, p, flags, mode, want)
	}
	return h, a, got, err
}
