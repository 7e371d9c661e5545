package fs

import (
	"context"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// Handle leases: a read-only handle released while its node holds Read
// and Handle stays open on the server, with its data path attached, and
// the next compatible open of the node takes it — an open(2) of a cached
// file then costs no round trip at all. Only read handles are kept: a
// kept write handle would count as a writer on the server and deny the
// other clients' Read leases.

// maxCachedHandles bounds the handles one mount keeps; the oldest is
// closed first. maxNodeHandles bounds them per file.
const (
	maxCachedHandles = 256
	maxNodeHandles   = 2
)

// cachedHandle is a server handle kept after its release.
type cachedHandle struct {
	node   *Node
	h      session.Handle
	flags  int
	data   *dataBox // the attached data path; nil when none
	closed atomic.Bool
}

// handleFlags are the open flags a kept handle must match to be reused:
// they shaped the server open or the data path.
const handleFlags = syscall.O_ACCMODE | syscall.O_DIRECT | syscall.O_SYNC | syscall.O_DSYNC | syscall.O_NOFOLLOW

// keepHandle keeps f's server handle for the next open instead of closing
// it, when f only read and its node holds Read and Handle.
func (f *fileHandle) keepHandle() bool {
	n := f.node
	lc := n.fs.lease
	if lc == nil || f.flags&syscall.O_ACCMODE != syscall.O_RDONLY || f.locked.Load() {
		return false // a handle that locked: its close releases the flock and OFD locks on the server
	}
	n.mu.Lock()
	if n.ls.state&(LeaseRead|LeaseHandle) != LeaseRead|LeaseHandle || len(n.ls.handles) >= maxNodeHandles {
		n.mu.Unlock()
		return false
	}
	ch := &cachedHandle{node: n, h: f.h, flags: f.flags, data: f.data.Load()}
	n.ls.handles = append(n.ls.handles, ch)
	n.mu.Unlock()
	lc.mu.Lock()
	lc.cached = append(lc.cached, ch)
	var evict *cachedHandle
	if len(lc.cached) > maxCachedHandles {
		evict = lc.cached[0]
		lc.cached = lc.cached[1:]
	}
	lc.mu.Unlock()
	if evict != nil {
		evict.node.mu.Lock()
		evict.node.ls.handles = slices.DeleteFunc(evict.node.ls.handles, func(c *cachedHandle) bool { return c == evict })
		evict.node.mu.Unlock()
		evict.close()
	}
	return true
}

// reuseHandle takes a kept handle for an open of n with flags, if one
// matches and n still holds Read and Handle.
func (n *Node) reuseHandle(flags int) (*fileHandle, bool) {
	lc := n.fs.lease
	if lc == nil || flags&(syscall.O_TRUNC|syscall.O_CREAT) != 0 {
		return nil, false
	}
	n.mu.Lock()
	if n.ls.state&(LeaseRead|LeaseHandle) != LeaseRead|LeaseHandle {
		n.mu.Unlock()
		return nil, false
	}
	i := slices.IndexFunc(n.ls.handles, func(c *cachedHandle) bool { return c.flags&handleFlags == flags&handleFlags })
	if i < 0 {
		n.mu.Unlock()
		return nil, false
	}
	ch := n.ls.handles[i]
	n.ls.handles = slices.Delete(n.ls.handles, i, i+1)
	n.mu.Unlock()
	lc.mu.Lock()
	lc.cached = slices.DeleteFunc(lc.cached, func(c *cachedHandle) bool { return c == ch })
	lc.mu.Unlock()
	if ch.closed.Load() {
		return nil, false
	}
	fh := n.newHandle(n.path(), ch.h, flags)
	if ch.data != nil {
		fh.data.Store(ch.data)
	}
	return fh, true
}

// forgetHandles closes kept handles (their lease lost Handle, or their
// node is forgotten).
func (lc *leaseCtl) forgetHandles(hs []*cachedHandle) {
	if len(hs) == 0 {
		return
	}
	lc.mu.Lock()
	lc.cached = slices.DeleteFunc(lc.cached, func(c *cachedHandle) bool { return slices.Contains(hs, c) })
	lc.mu.Unlock()
	for _, ch := range hs {
		ch.close()
	}
}

// close closes a kept handle on the server, once, in the background.
func (ch *cachedHandle) close() {
	if ch.closed.Swap(true) {
		return
	}
	go func() {
		if ch.data != nil {
			ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			ch.data.Close(ctx)
			cancel()
		}
		ch.node.fs.lease.closeLater(pendingClose{ch.h, ch.node})
	}()
}

// closeDelay gathers the CLOSEs of released handles: `tar -x` releases a
// file every few hundred microseconds, and closing them in one BATCH
// each closeDelay (or maxBatchCloses) spares the server and this mount a
// request and a response per file. Nobody waits for a CLOSE — but an
// open handle on the server is an open the others' leases must respect:
// a handle that wrote is put off only while its file holds Write (nobody
// else is interested), and closed at once when that lease is recalled
// (closeNow), before the recall is acknowledged.
const (
	closeDelay     = 20 * time.Millisecond
	maxBatchCloses = 64
)

// pendingClose is a released handle not closed yet, and its node.
type pendingClose struct {
	h session.Handle
	n *Node
}

// closeLater closes f's handle on the server with the next gathered BATCH
// when it may wait (see closeDelay), else now, in the background.
func (f *fileHandle) closeLater() {
	n, lc := f.node, f.node.fs.lease
	if f.flags&syscall.O_ACCMODE != syscall.O_RDONLY && !n.holdsWrite() {
		go lc.close([]session.Handle{f.h})
		return
	}
	lc.closeLater(pendingClose{f.h, n})
}

// closeLater queues a close for the next gathered BATCH.
func (lc *leaseCtl) closeLater(pc pendingClose) {
	lc.mu.Lock()
	lc.closes = append(lc.closes, pc)
	now := len(lc.closes) >= maxBatchCloses
	arm := !lc.closing && !now
	if arm {
		lc.closing = true
	}
	lc.mu.Unlock()
	if now {
		go lc.sendCloses()
	} else if arm {
		time.AfterFunc(closeDelay, lc.sendCloses)
	}
}

// sendCloses closes the gathered handles.
func (lc *leaseCtl) sendCloses() {
	lc.mu.Lock()
	pcs := lc.closes
	lc.closes = nil
	lc.closing = false
	lc.mu.Unlock()
	hs := make([]session.Handle, len(pcs))
	for i, pc := range pcs {
		hs[i] = pc.h
	}
	lc.close(hs)
}

// closeNow closes n's handles waiting in the gathered BATCH, and returns
// once they are closed: n's Write lease is being recalled for another
// client, whose open or lease the server decides once this mount
// acknowledges.
func (lc *leaseCtl) closeNow(n *Node) {
	var hs []session.Handle
	lc.mu.Lock()
	lc.closes = slices.DeleteFunc(lc.closes, func(pc pendingClose) bool {
		if pc.n == n {
			hs = append(hs, pc.h)
			return true
		}
		return false
	})
	lc.mu.Unlock()
	lc.close(hs)
}

// close closes handles on the server, several per round trip.
func (lc *leaseCtl) close(hs []session.Handle) {
	if len(hs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := lc.tr.CloseHandles(ctx, hs); err != nil {
		lc.log.WithError(err).WithField("handles", len(hs)).Debug("fs: closing released handles")
	}
}
