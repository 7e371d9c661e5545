package fs

import (
	"context"
	"io"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lwiofs/lwiofs/protocol/client"
)

// Asynchronous writes (issue 16 item 3's write-behind; writebehind.go is
// the other mechanism, what a Write lease holds back and sends as one
// BATCH): a buffered writer's WRITE is answered once its bytes are posted
// over LWIO, not once the server has written them, so a sequential writer
// keeps several requests in flight instead of one. The rules that keep it
// invisible:
//
//   - close(2) (FLUSH), fsync, the last close (RELEASE) and releasing a
//     lock (lock.go) wait until the file's posted writes are on the
//     server, and report a failure among them: close-to-open holds — what
//     a close returned from is what the next open anywhere sees — and so
//     do fsync's promise and a lock's (the next holder reads what this one
//     wrote, a shared mapping's write-back included). Releasing a lock
//     also waits for the posted writes of the files open beside the
//     locked one (lock.go's drainBeside), whose failures stay with those
//     files. The lock goes even when one failed; the unlock reports the
//     failure, and close(2) and fsync report it again.
//   - Anything that reads data or attributes from the server (READ,
//     GETATTR, SETATTR, LOOKUP, a directory listing, OPEN) first waits for
//     every posted write of the mount, so it never sees a size or bytes
//     from before a write it has already been told succeeded.
//   - A write overlapping one still in flight on the same file waits for
//     it first (the two could otherwise land in either order).
//   - A failure is kept and returned by the next write, close or fsync of
//     the file (as NFS and SMB clients report write-behind errors); a lost
//     connection is not a failure: the write is sent again on the next
//     session, as every write at an explicit offset is.
//   - O_DIRECT, O_SYNC and O_DSYNC handles write through, as before,
//     after the posted writes (of other handles) they overlap; so do
//     fallocate, SEEK_DATA/HOLE and copy_file_range, after all of the
//     file's.
//
// Another client still sees a file's new bytes only after the writer's
// close (close-to-open), as before; a lease break, which lets another
// client see more, waits for them first, and so does the BATCH of what a
// Write lease held back (writebehind.go), which must land after them.

// DefaultWriteBehind is how many writes a file keeps in flight by default.
const DefaultWriteBehind = 8

// drainTimeout bounds the wait for one posted write. The connection's own
// liveness ends it much sooner when the server is gone.
const drainTimeout = 2 * time.Minute

// PendingWrite is a write posted and not yet waited for (a data file's
// WriteAsync; *client.PendingWrite through the Reconnector).
type PendingWrite interface {
	Wait(ctx context.Context) (int, error)
}

// postWrite posts a write of p at off and returns without waiting for it.
type postWrite func(ctx context.Context, p []byte, off int64) (PendingWrite, error)

// asyncWriter is a data file that can post a write and wait for it later
// (the Reconnector's); *client.File has the same method returning its
// own PendingWrite.
type asyncWriter interface {
	WriteAsync(ctx context.Context, p []byte, off int64) (PendingWrite, error)
}

type engineAsyncWriter interface {
	WriteAsync(ctx context.Context, p []byte, off int64) (*client.PendingWrite, error)
}

// posted is one write in flight: its range and how to learn its outcome.
// taken: a goroutine is waiting for it (it stays listed, for overlaps,
// until done).
type posted struct {
	pw       PendingWrite
	off, end int64
	taken    bool
}

// wbQueue is one file's writes in flight.
type wbQueue struct {
	wb   *asyncWrites
	mu   sync.Mutex
	cond sync.Cond
	q    []*posted
	err  error // the first failure, until reported
}

// asyncWrites is the mount's writes in flight, for the barriers.
type asyncWrites struct {
	max     int          // writes a file keeps in flight; 0: write through
	pending atomic.Int64 // posted and not yet done (the barriers' fast path)
	mu      sync.Mutex
	files   map[*wbQueue]struct{} // those with writes in flight
}

func newAsyncWrites(max int) *asyncWrites {
	return &asyncWrites{max: max, files: map[*wbQueue]struct{}{}}
}

// queue returns n's queue, making it on first use.
func (n *Node) queue() *wbQueue {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.wbq == nil {
		n.wbq = &wbQueue{wb: n.fs.wb}
		n.wbq.cond.L = &n.wbq.mu
	}
	return n.wbq
}

// writeBehind returns f's data file as an asyncWriter when a write of n
// bytes on f is posted rather than waited for: a buffered handle on a data
// path that can.
func (f *fileHandle) writeBehind(data DataFile, n int) (postWrite, bool) {
	if f.node.fs.wb.max <= 0 || f.flags&(syscall.O_DIRECT|syscall.O_SYNC|syscall.O_DSYNC) != 0 || n == 0 {
		return nil, false
	}
	switch d := data.(type) {
	case asyncWriter:
		return d.WriteAsync, true
	case engineAsyncWriter:
		return func(ctx context.Context, p []byte, off int64) (PendingWrite, error) {
			pw, err := d.WriteAsync(ctx, p, off)
			if err != nil {
				return nil, err
			}
			return pw, nil
		}, true
	}
	return nil, false
}

// post writes buf at off behind: it waits for room (and for writes
// overlapping this one), posts it and returns. An earlier failure of the
// file is returned instead, once.
func (q *wbQueue) post(ctx context.Context, write postWrite, buf []byte, off int64) error {
	end := off + int64(len(buf))
	q.mu.Lock()
	for q.overlaps(off, end) || len(q.q) >= q.wb.max {
		q.waitOne()
	}
	if err := q.err; err != nil {
		q.err = nil
		q.mu.Unlock()
		return err
	}
	q.mu.Unlock()
	pw, err := write(ctx, buf, off)
	if err != nil {
		return err
	}
	q.mu.Lock()
	if len(q.q) == 0 {
		q.wb.mu.Lock()
		q.wb.files[q] = struct{}{}
		q.wb.mu.Unlock()
	}
	q.q = append(q.q, &posted{pw: pw, off: off, end: end})
	q.wb.pending.Add(1)
	q.mu.Unlock()
	return nil
}

// overlaps reports whether a write in flight touches [off, end); under mu.
func (q *wbQueue) overlaps(off, end int64) bool {
	for _, p := range q.q {
		if p.off < end && off < p.end {
			return true
		}
	}
	return false
}

// waitOne waits for the oldest write nobody waits for yet, with mu
// released meanwhile, or, when every one is being waited for, for one of
// those to finish; under mu, with writes in flight.
func (q *wbQueue) waitOne() {
	var p *posted
	for _, x := range q.q {
		if !x.taken {
			p = x
			break
		}
	}
	if p == nil {
		q.cond.Wait()
		return
	}
	p.taken = true
	q.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	n, err := p.pw.Wait(ctx)
	cancel()
	if err == nil && int64(n) < p.end-p.off {
		err = io.ErrShortWrite
	}
	q.wb.pending.Add(-1)
	q.mu.Lock()
	for i, x := range q.q {
		if x == p {
			q.q = append(q.q[:i], q.q[i+1:]...)
			break
		}
	}
	if err != nil && q.err == nil {
		q.err = err
	}
	if len(q.q) == 0 {
		q.wb.mu.Lock()
		delete(q.wb.files, q)
		q.wb.mu.Unlock()
	}
	q.cond.Broadcast()
}

// drain waits until no write of the file is in flight; under mu.
func (q *wbQueue) drain() {
	for len(q.q) > 0 {
		q.waitOne()
	}
}

// flush waits until every write of the file in flight is done and returns
// the first failure among them (or an earlier one not yet reported); keep:
// it stays to be reported again.
func (q *wbQueue) flush(keep bool) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.drain()
	err := q.err
	if !keep {
		q.err = nil
	}
	return err
}

// barrier waits until no write of the mount is in flight (failures stay
// with their files, for their next write, close or fsync).
func (wb *asyncWrites) barrier() {
	if wb.pending.Load() == 0 {
		return
	}
	wb.mu.Lock()
	qs := slices.Collect(maps.Keys(wb.files))
	wb.mu.Unlock()
	for _, q := range qs {
		q.mu.Lock()
		q.drain()
		q.mu.Unlock()
	}
}

// flushWrites waits for the node's writes in flight and returns a failure
// among them, once (keep: again later too): FLUSH, FSYNC and RELEASE call
// it, and so must anything that lets another client see the file before
// this one closes it (a lease break's acknowledgement, an unlock).
func (n *Node) flushWrites(keep bool) error {
	n.mu.Lock()
	q := n.wbq
	n.mu.Unlock()
	if q == nil {
		return nil
	}
	return q.flush(keep)
}

// keepWriteErr keeps err as a failure of the node's writes, for its next
// write, close or fsync to report, unless one is kept already.
func (n *Node) keepWriteErr(err error) {
	q := n.queue()
	q.mu.Lock()
	if q.err == nil {
		q.err = err
	}
	q.mu.Unlock()
}

// drainWrites waits until no write of the node is in flight, leaving a
// failure among them for the next write, close or fsync: what a Write
// lease held back (writebehind.go) goes after them, and a lease break is
// answered only once they are on the server.
func (n *Node) drainWrites() { n.settleWrites(0, math.MaxInt64) }

// settleWrites waits until no write of the node in flight overlaps [off,
// end), leaving a failure among them for the next write, close or fsync:
// a write sent through, not posted, goes after them.
func (n *Node) settleWrites(off, end int64) {
	if n.fs.wb.pending.Load() == 0 { // nothing of the mount's in flight (barrier's test)
		return
	}
	n.mu.Lock()
	q := n.wbq
	n.mu.Unlock()
	if q == nil {
		return
	}
	q.mu.Lock()
	for q.overlaps(off, end) {
		q.waitOne()
	}
	q.mu.Unlock()
}

// flushAll sends everything the node holds — its posted writes, then what
// a Write lease held back — and returns the first failure: close(2),
// fsync and the last release. keep: the failure stays, to be reported
// again by the next write, close or fsync (an unlock's).
func (n *Node) flushAll(ctx context.Context, keep bool) error {
	err := n.flushWrites(keep)
	if e := n.flushDeferred(ctx, keep); err == nil {
		err = e
	}
	return err
}
