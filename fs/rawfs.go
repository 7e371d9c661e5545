package fs

import (
	"context"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// rawFS sits between the kernel and go-fuse's node tree to keep what the
// node API leaves out of two requests:
//
//   - WRITE's flags: the file's f_flags at the time of the write. O_APPEND
//     there means the kernel placed the write at its own idea of the end
//     of file, which another client may have moved; the server must place
//     it (append.go). The open flags are not enough — fcntl(F_SETFL) can
//     set O_APPEND later, and the kernel writes back a shared mapping's
//     pages through any writable handle of the file, an O_APPEND one
//     included, at their own offsets (FUSE_WRITE_CACHE, no O_APPEND).
//   - FLUSH's lock owner: every close(2) of a descriptor drops its
//     process's POSIX locks on the file, and the FLUSH it sends is the
//     only place FUSE says whose (lock.go).
//   - WRITE's WRITE_KILL_SUIDGID and OPEN's and CREATE's
//     OPEN_KILL_SUIDGID: the caller lacks CAP_FSETID, so the write (or
//     the O_TRUNC) must clear the file's set-id bits (killpriv.go).
//
// It also turns a LOOKUP's ENOENT into a negative entry the kernel keeps
// for the timeout the node set in the reply (Node.negative: under a
// directory's Read lease). go-fuse v2.12 caches absent names only with
// one mount-wide NegativeTimeout, which would hide files created by other
// clients for that long in every directory; the kernel caches a negative
// entry when LOOKUP succeeds with node id 0 and an entry timeout.
//
// go-fuse hands a node the request's fuse.Context, whose Cancel channel is
// the request's own while it runs; that channel is the key.
type rawFS struct {
	fuse.RawFileSystem
	x *requestExtras
}

// requestExtras holds, per request in flight, what rawFS kept of it.
type requestExtras struct {
	mu sync.Mutex
	m  map[<-chan struct{}]extra
}

type extra struct {
	appending bool   // a WRITE the kernel marked O_APPEND
	writeback bool   // a WRITE of cached pages (a shared mapping's)
	killSetID bool   // a WRITE, OPEN or CREATE flagged *_KILL_SUIDGID
	owner     uint64 // a FLUSH's lock owner
}

func newRequestExtras() *requestExtras {
	return &requestExtras{m: map[<-chan struct{}]extra{}}
}

func (x *requestExtras) put(key <-chan struct{}, e extra) func() {
	x.mu.Lock()
	x.m[key] = e
	x.mu.Unlock()
	return func() {
		x.mu.Lock()
		delete(x.m, key)
		x.mu.Unlock()
	}
}

// of returns what was kept for the request ctx belongs to.
func (x *requestExtras) of(ctx context.Context) (extra, bool) {
	fc, ok := ctx.(*fuse.Context)
	if x == nil || !ok || fc.Cancel == nil {
		return extra{}, false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	e, ok := x.m[fc.Cancel]
	return e, ok
}

// writeExtra is what a WRITE's flags say: an O_APPEND write (not a
// writeback, which is at the pages' own offsets), or a writeback of cached
// pages (twin.go); and whether the writer lacks CAP_FSETID.
func writeExtra(in *fuse.WriteIn) (extra, bool) {
	e := extra{killSetID: in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0}
	if in.WriteFlags&fuse.WRITE_CACHE != 0 {
		e.writeback = true
	} else {
		e.appending = in.Flags&syscall.O_APPEND != 0
	}
	return e, e != extra{}
}

func (r *rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if e, ok := writeExtra(in); ok {
		defer r.x.put(cancel, e)()
	}
	return r.RawFileSystem.Write(cancel, in, data)
}

func (r *rawFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if e, ok := writeExtra(in); ok {
		defer r.x.put(cancel, e)()
	}
	return r.RawFileSystem.Writev(cancel, in, data)
}

func (r *rawFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if in.Mode&fuse.OPEN_KILL_SUIDGID != 0 { // OpenIn.Mode holds the open_flags
		defer r.x.put(cancel, extra{killSetID: true})()
	}
	return r.RawFileSystem.Open(cancel, in, out)
}

func (r *rawFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	if in.OpenFlags&fuse.OPEN_KILL_SUIDGID != 0 {
		defer r.x.put(cancel, extra{killSetID: true})()
	}
	return r.RawFileSystem.Create(cancel, in, name, out)
}

func (r *rawFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	defer r.x.put(cancel, extra{owner: in.LockOwner})()
	return r.RawFileSystem.Flush(cancel, in)
}

// writeKind returns what rawFS kept of the WRITE ctx belongs to.
func (fs *filesystem) writeKind(ctx context.Context) extra {
	e, _ := fs.extras.of(ctx)
	return e
}

// flushOwner returns the lock owner of the FLUSH ctx belongs to.
func (fs *filesystem) flushOwner(ctx context.Context) (uint64, bool) {
	e, ok := fs.extras.of(ctx)
	return e.owner, ok
}

func (r *rawFS) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	st := r.RawFileSystem.Lookup(cancel, header, name, out)
	if st == fuse.ENOENT && out.EntryTimeout() > 0 {
		out.NodeId, out.Generation = 0, 0
		out.Attr = fuse.Attr{}
		return fuse.OK
	}
	return st
}
