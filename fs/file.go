package fs

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// releaseTimeout bounds LWIO CLOSE and the session close at release: the
// kernel does not wait for RELEASE, so nothing would notice a hang.
const releaseTimeout = 30 * time.Second

// sessionOpenFlags are the open(2) flags passed on to the server. O_APPEND
// is left out on purpose: each O_APPEND write asks the server to append
// (append.go), and a server file opened O_APPEND would append positional
// writes too (a shared mapping's writeback through that handle). O_DIRECT
// is not an open flag on the wire: the Tree turns it into the LWIO
// registration's FILE_NO_INTERMEDIATE_BUFFERING.
const sessionOpenFlags = syscall.O_ACCMODE | syscall.O_CREAT | syscall.O_EXCL | syscall.O_TRUNC |
	syscall.O_NOFOLLOW | syscall.O_SYNC | syscall.O_DSYNC | syscall.O_DIRECT

// fileHandle is one open file: a session handle and the data file attached
// to it (an LWIO Fid, or the session fallback). The open itself registers
// the file with LWIO and answers its Fid (session.Tree.RegisterOnOpen), so
// attaching on the first read or write costs no round trip; only a handle
// the server could not register that way pays a resume key and a REGISTER
// then.
type fileHandle struct {
	node  *Node
	h     session.Handle
	flags int
	log   logrus.FieldLogger
	watch *watchList // the mount's (watch.go)

	data     atomic.Pointer[dataBox] // nil until attached
	attachMu sync.Mutex
	released atomic.Bool
	locked   atomic.Bool // a lock was taken through it (lock.go)
	// heldBack counts the bytes a Write lease held back of this handle's
	// writes (writebehind.go).
	heldBack atomic.Int64
}

type dataBox struct{ DataFile }

var (
	_ = (gofs.FileReader)((*fileHandle)(nil))
	_ = (gofs.FileWriter)((*fileHandle)(nil))
	_ = (gofs.FileWritever)((*fileHandle)(nil))
	_ = (gofs.FileFlusher)((*fileHandle)(nil))
	_ = (gofs.FileReleaser)((*fileHandle)(nil))
)

func (n *Node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	n.settle(ctx) // a closed handle's held-back changes land first (asyncclose.go)
	if fh, ok := n.reuseHandle(int(flags)); ok {
		if a, ok := n.freshAttr(); ok {
			return fh, n.openFlags(a, int(flags)), 0
		}
		fh.Release(ctx) // (kept again, or closed)
	}
	req := ctx // the FUSE request's own: what rawFS kept of it is found by it
	ctx, cancel := detach(ctx)
	defer cancel()
	n.fs.wb.barrier() // the open's attributes decide close-to-open
	p := n.path()
	g := n.dropAttr()
	h, a, got, err := n.openTree(ctx, p, int(flags), int(flags)&sessionOpenFlags, 0)
	if err != nil {
		if errno := n.errno("open", p, err); errno != syscall.ENOENT {
			return nil, 0, errno
		}
		// The kernel had the name cached; another client has removed it
		// since. ESTALE makes the VFS look it up afresh and retry once
		// (LOOKUP_REVAL), as for NFS: an O_CREAT open then creates the
		// file instead of failing (sqlite's journal, made and removed by
		// every transaction on another mount).
		return nil, 0, syscall.ESTALE
	}
	n.fs.lease.install(n, a.Ino, got, g)
	n.rememberAt(g, a)
	n.brokenDuring(a.Ino, g)
	fh := n.newHandle(p, h, int(flags))
	if flags&syscall.O_TRUNC != 0 {
		if err := n.killSetIDWrite(req, h); err != nil { // killpriv.go
			fh.Release(ctx)
			return nil, 0, n.errno("open", p, err)
		}
	}
	fh.writable()
	return fh, n.openFlags(a, int(flags)), 0
}

func (n *Node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	req := ctx
	ctx, cancel := detach(ctx)
	defer cancel()
	p := n.childPath(name)
	n.settleChild(ctx, name) // an existing file: its held-back changes land before an O_TRUNC
	n.dropAttr()
	defer n.dropAttr()
	g := n.gen()
	h, a, got, err := n.openTree(ctx, p, int(flags), int(flags)&sessionOpenFlags|syscall.O_CREAT, mode)
	if err != nil {
		n.nameUnknown(name)
		return nil, nil, 0, n.errno("create", p, err)
	}
	child := n.newChild(ctx, name, a, out, g)
	n.created(child, name, got, g, false, out)
	cn := child.Operations().(*Node)
	fh := cn.newHandle(p, h, int(flags))
	if flags&syscall.O_TRUNC != 0 {
		if err := cn.killSetIDWrite(req, h); err != nil { // an existing file (killpriv.go)
			fh.Release(ctx)
			return nil, nil, 0, n.errno("create", p, err)
		}
	}
	fh.writable()
	var fl uint32
	if !cn.freshNode(a) || flags&syscall.O_APPEND != 0 {
		fl = cn.openFlags(a, int(flags)) // appends are direct I/O whatever the node (append.go)
	}
	return child, fh, fl, 0
}

func (n *Node) newHandle(p string, h session.Handle, flags int) *fileHandle {
	n.fs.open.opened(n, flags)
	return &fileHandle{node: n, h: h, flags: flags, watch: &n.fs.watch,
		log: n.fs.log.WithFields(logrus.Fields{"path": p, "handle": uint64(h)})}
}

// dataFile returns the attached data file, attaching it on first use
// (resume key + REGISTER for LWIO). Registration runs to completion even if
// the request that needed it is interrupted: a half-done REGISTER would
// leave a Fid nobody closes.
func (f *fileHandle) dataFile(ctx context.Context) (DataFile, error) {
	if b := f.data.Load(); b != nil {
		return b.DataFile, nil
	}
	f.attachMu.Lock()
	defer f.attachMu.Unlock()
	if b := f.data.Load(); b != nil {
		return b.DataFile, nil
	}
	if f.released.Load() {
		return nil, syscall.EBADF
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	if err := f.node.flushDeferred(ctx, false); err != nil {
		return nil, err // what was held back goes first
	}
	d, err := f.node.fs.data.Attach(ctx, f.h, f.flags)
	if err != nil {
		return nil, err
	}
	f.data.Store(&dataBox{d})
	return d, nil
}

// openFlags applies close-to-open: the kernel keeps its cached pages only
// if the file is as it was when they were cached. Otherwise the pages are
// dropped (no FOPEN_KEEP_CACHE) and the cached attributes too, so the new
// size is fetched before a read trusts the old one.
func (n *Node) openFlags(fresh session.Attr, flags int) uint32 {
	keep := n.keepCache(fresh)
	if flags&syscall.O_APPEND != 0 {
		return appendDirect // append.go
	}
	if keep {
		return fuse.FOPEN_KEEP_CACHE
	}
	// Attributes only (offset < 0): safe from inside OPEN, as it takes no
	// page locks.
	n.NotifyContent(-1, 0)
	return 0
}

// keepCache decides close-to-open for an open that found fresh attributes
// and records them as the validator of what the kernel caches next.
func (n *Node) keepCache(fresh session.Attr) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	keep := keepCache(n.cache, fresh)
	n.cache = validatorOf(fresh)
	return keep
}

// dirty records that this mount changed the file's data, so its server
// mtime no longer matches the validator: the next open drops the cache.
func (f *fileHandle) dirty() {
	n := f.node
	n.mu.Lock()
	n.cache = validator{}
	n.freshValid = false // size and mtime move
	n.freshGen = n.fs.seq.Add(1)
	n.mu.Unlock()
}

func (f *fileHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.node.fs.wb.barrier() // the bytes of every write answered so far
	f.node.settle(ctx)     // and what another handle held back: f's data path may be attached (asyncclose.go)
	if !f.node.holdsRead() {
		f.node.dropAttr() // the server may move the atime (a Read lease covers all else)
	}
	data, err := f.dataFile(ctx)
	if err != nil {
		return nil, f.errno("register", err)
	}
	var b Buffer
	_, err = f.run(ctx, func(ctx context.Context) (int, error) {
		var err error
		b, err = data.ReadBuf(ctx, dest, off)
		return 0, err
	})
	if err != nil && !isEOF(err) {
		return nil, f.errno("read", err)
	}
	if b == nil {
		return fuse.ReadResultData(nil), 0
	}
	if s, ok := b.(*client.SplitBuf); ok {
		at := off
		for _, p := range s.Slices() {
			f.node.fs.open.keepTwins(f.node, p, at) // twin.go
			at += int64(len(p))
		}
	} else {
		f.node.fs.open.keepTwins(f.node, b.Bytes(), off)
	}
	return &bufResult{b}, 0
}

func (f *fileHandle) Write(ctx context.Context, buf []byte, off int64) (_ uint32, errno syscall.Errno) {
	switch x := f.node.fs.writeKind(ctx); {
	case x.appending, x.writeback:
		// Behind the writes in flight (writeasync.go) and what a Write
		// lease held back (writebehind.go): an append lands after them,
		// and a diff is taken against what they wrote.
		if err := f.node.flushAll(ctx, false); err != nil {
			return 0, f.errno("write", err)
		}
		if x.writeback {
			// What the program wrote to the files beside before it
			// stored to the mapping lands first (lock.go).
			f.node.drainBeside()
		}
		if err := f.node.killSetIDWrite(ctx, f.h); err != nil {
			return 0, f.errno("write", err)
		}
		if x.appending {
			return f.append(ctx, buf, off)
		}
		return f.writeBack(ctx, buf, off) // twin.go
	}
	defer func() {
		if errno == 0 {
			f.node.fs.open.wrote(f.node, buf, off) // the server has (or is sent) these bytes now, or they are held back in order
		}
	}()
	if done, errno := f.deferWrite(ctx, buf, off); done {
		return uint32(len(buf)), errno
	}
	if err := f.node.killSetIDWrite(ctx, f.h); err != nil { // killpriv.go
		return 0, f.errno("write", err)
	}
	f.dirty()
	defer f.dirty() // and attributes fetched during the write predate it
	data, err := f.dataFile(ctx)
	if err != nil {
		return 0, f.errno("register", err)
	}
	if aw, ok := f.writeBehind(data, len(buf)); ok {
		if err := f.node.queue().post(ctx, aw, buf, off); err != nil {
			return 0, f.errno("write", err)
		}
		return uint32(len(buf)), 0
	}
	// Written through (O_DIRECT, O_SYNC, or no write-behind): a posted
	// write of another handle overlapping it must not land after it.
	f.node.settleWrites(off, off+int64(len(buf)))
	vec := f.flags&syscall.O_DIRECT != 0 && len(buf) > pageSize && len(buf)%pageSize == 0
	n, err := f.run(ctx, func(ctx context.Context) (int, error) {
		if vec {
			// O_DIRECT writes of whole pages go as VEC_WRITE, which the
			// engine collapses to one page when all pages are the same.
			return data.WriteV(ctx, pages(buf), off)
		}
		return data.WriteAt(ctx, buf, off)
	})
	if err != nil {
		return uint32(n), f.errno("write", err)
	}
	return uint32(n), 0
}

func (f *fileHandle) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	if x := f.node.fs.writeKind(ctx); len(data) > 1 && (x.appending || x.writeback) {
		return f.Write(ctx, bytes.Join(data, nil), off) // one append, or one diff, whole
	}
	var total int
	for _, b := range data {
		n, errno := f.Write(ctx, b, off+int64(total))
		total += int(n)
		if errno != 0 {
			return uint32(total), errno
		}
	}
	return uint32(total), 0
}

// pageSize is the unit of a vectored write.
const pageSize = 4096

func pages(b []byte) [][]byte {
	out := make([][]byte, 0, len(b)/pageSize)
	for len(b) > 0 {
		n := min(pageSize, len(b))
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}

// cancelTimeout bounds the LWIO CANCEL sent for an interrupted request.
const cancelTimeout = 5 * time.Second

// interruptGrace is how long a request may go on after a FUSE INTERRUPT
// before it is given up.
const interruptGrace = time.Second

// interruptWatch is how long a request runs before it starts watching for
// a FUSE INTERRUPT. Watching costs a goroutine: go-fuse's request context
// is not one of package context's own, so context.AfterFunc must start one
// to wait on its Done channel, and wake it again at the end — two
// goroutine switches per 4 KiB read, on a machine whose two CPUs run fio,
// the mount and the server (docs/bench.md, "Where a 4K read's time
// goes"). Nearly every request is over long before; an interrupted one
// still gets at least interruptGrace from the INTERRUPT. The mount's one
// watchList (watch.go) starts the watches, between interruptWatch and twice
// that after the request began.
const interruptWatch = 20 * time.Millisecond

// run runs one data request. The kernel sends a FUSE INTERRUPT whenever the
// caller has a signal pending — including signals whose handler was
// installed with SA_RESTART, and Go's preemption signals — and an EINTR
// from a regular file breaks applications that rightly never expect one.
// So an interrupted request is given interruptGrace to finish normally;
// only one still outstanding after that (a hung server, a stuck disk) is
// abandoned, cancelled on the server with LWIO CANCEL on the Fid, and
// fails with EINTR. A CANCEL is per Fid, so it can also hit another
// caller's queued request on the same file: that one comes back
// STATUS_CANCELLED without having been interrupted, and is retried (reads
// and writes at an explicit offset are safe to repeat).
func (f *fileHandle) run(ctx context.Context, op func(context.Context) (int, error)) (int, error) {
	rctx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon() // last: it also ends a watch started below
	var interrupted atomic.Bool
	w := &watchReq{watch: func() {
		stop := context.AfterFunc(ctx, func() {
			t := time.NewTimer(interruptGrace)
			defer t.Stop()
			select {
			case <-t.C:
				interrupted.Store(true)
				abandon()
				f.cancel()
			case <-rctx.Done(): // finished in time
			}
		})
		context.AfterFunc(rctx, func() { stop() }) // rctx is package context's: no goroutine until it ends
	}}
	f.watch.add(w) // watch.go: one timer for the mount, not one per request
	defer f.watch.remove(w)
	for attempt := 0; ; attempt++ {
		n, err := op(rctx)
		if err == nil || isEOF(err) || interrupted.Load() {
			return n, err
		}
		if attempt < 3 && errors.Is(err, protocol.StatusCancelled) {
			continue
		}
		return n, err
	}
}

// cancel sends LWIO CANCEL for the file, in the background: the kernel is
// not waiting for it.
func (f *fileHandle) cancel() {
	b := f.data.Load()
	if b == nil {
		return
	}
	go func() {
		ctx, done := context.WithTimeout(context.Background(), cancelTimeout)
		defer done()
		if err := b.Cancel(ctx); err != nil {
			f.log.WithField("op", "cancel").WithError(err).Debug("fs: LWIO CANCEL")
		}
	}()
}

// Flush is close(2): the file's writes still in flight (writeasync.go)
// land on the server before it returns, so the file is consistent there
// for the next open anywhere, and a failure among them is close's error;
// then the closing process's locks on the file go (lock.go). What a Write
// lease held back (writebehind.go) goes with the RELEASE that follows, in
// the background, and whoever looks at the file next waits for it — but
// when close(2) must wait for it too (closeAsync, asyncclose.go), it is
// sent here with the rest.
func (f *fileHandle) Flush(ctx context.Context) syscall.Errno {
	f.closing() // a chmod after close(2) must not wait for the release
	if f.closeAsync() {
		return f.releaseLocks(ctx)
	}
	errno := f.errno("flush", f.node.flushAll(ctx, false))
	if e := f.releaseLocks(ctx); errno == 0 {
		errno = e
	}
	return errno
}

// Release is the last close. It is answered at once — the kernel does not
// wait for it anyway — and the rest happens in the background: what a
// Write lease held back is sent, then a read handle under a Handle lease
// is kept for the next open, or LWIO CLOSE of the Fid and the session
// handle's CLOSE go out — but for a handle a lock was taken through,
// closed before the answer and not gathered with others (its locks go
// with it).
func (f *fileHandle) Release(context.Context) syscall.Errno {
	if f.released.Swap(true) {
		return 0
	}
	f.closing()
	if !f.node.holding() && f.keepHandle() {
		f.node.fs.open.closed(f.node, f.flags)
		return 0 // kept, now: the next open may come at once
	}
	if f.locked.Load() {
		// A lock taken through it (flock, OFD) is released with the
		// server handle: closed before the answer, as it always was.
		f.release()
		return 0
	}
	if f.node.holding() {
		// Changes to send: they wait for the next exclusive create
		// (asyncclose.go).
		f.node.fs.paced(f.node, f.release)
		return 0
	}
	f.node.fs.background(f.release)
	return 0
}

func (f *fileHandle) release() {
	defer f.node.fs.open.closed(f.node, f.flags)
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := f.node.flushAll(ctx, true); err != nil {
		// After an asynchronous close(2), or a last close that raced
		// Flush: kept for the file's next write, close or fsync.
		f.log.WithField("op", "release").WithError(err).Warn("fs: a posted or held-back write failed")
	}
	if f.locked.Load() {
		// Its OFD locks and flocks go with the handle: after the
		// writes beside, as at an unlock (lock.go).
		f.node.drainBeside()
	}
	if f.keepHandle() {
		return
	}
	f.attachMu.Lock() // no attach after this
	b := f.data.Load()
	f.attachMu.Unlock()
	var derr error
	if b != nil {
		if derr = b.Close(ctx); derr != nil {
			f.log.WithField("op", "release").WithError(derr).Warn("fs: closing data path")
		}
	}
	if lc := f.node.fs.lease; lc.on() && !f.locked.Load() {
		f.closeLater()
		return
	}
	err := f.node.fs.tree.CloseHandle(ctx, f.h)
	if err == nil {
		err = derr
	}
	f.errno("release", err)
}

func (f *fileHandle) errno(op string, err error) syscall.Errno {
	return translateError(f.log, op, f.node.path(), err)
}

// bufResult hands the kernel an engine's registered buffer without a copy
// and gives the buffer back once go-fuse has written it to /dev/fuse.
// Slices makes go-fuse write it with one writev, after which it calls
// Done; without it go-fuse would try splicing first, or (splice disabled)
// call Done before writing the bytes out. A split read's pieces
// (client.SplitBuf, one registered buffer per connection) go in the same
// writev, uncopied.
type bufResult struct{ b Buffer }

func (r *bufResult) Bytes(buf []byte) ([]byte, fuse.Status) { return r.b.Bytes(), fuse.OK }
func (r *bufResult) Slices() ([][]byte, fuse.Status)        { return bufSlices(r.b), fuse.OK }
func (r *bufResult) Done()                                  { r.b.Release() }

func (r *bufResult) Size() int {
	if s, ok := r.b.(*client.SplitBuf); ok {
		return s.Len()
	}
	return len(r.b.Bytes())
}

// bufSlices are b's bytes: a split read's pieces, or its one slice.
func bufSlices(b Buffer) [][]byte {
	if s, ok := b.(*client.SplitBuf); ok {
		return s.Slices()
	}
	return [][]byte{b.Bytes()}
}
