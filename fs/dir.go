package fs

import (
	"context"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// dirHandle is an open directory. It lists the directory once (the session
// READDIR already carries every entry's attributes) and answers READDIRPLUS
// lookups from that listing, so `ls -l` of 10,000 entries costs a few
// round trips rather than 10,000.
type dirHandle struct {
	node   *Node
	cached bool // opened with FOPEN_CACHE_DIR: the kernel fills its readdir cache from this handle

	mu      sync.Mutex
	loaded  bool
	entries []session.DirEntry
	leases  []LeaseState   // the entries' leases (nil: none, or their nodes hold theirs)
	g       uint64         // where the listing's request began
	attrs   map[string]int // name → index in entries
	pos     int            // next index into the listing, "." and ".." included
}

var (
	_ = (gofs.FileReaddirenter)((*dirHandle)(nil))
	_ = (gofs.FileLookuper)((*dirHandle)(nil))
	_ = (gofs.FileSeekdirer)((*dirHandle)(nil))
	_ = (gofs.FileFsyncdirer)((*dirHandle)(nil))
	_ = (gofs.FileReleasedirer)((*dirHandle)(nil))
)

func (n *Node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	fl, cached := n.dirOpenFlags()
	return &dirHandle{node: n, cached: cached}, fl, 0
}

// load lists the directory; called with d.mu held.
func (d *dirHandle) load(ctx context.Context) syscall.Errno {
	ctx, cancel := detach(ctx)
	defer cancel()
	d.node.fs.wb.barrier()     // the listing carries attributes (sizes)
	d.node.settleChildren(ctx) // and of what was held back (asyncclose.go)
	p := d.node.path()
	ents, leases, g, leased, err := d.node.listLeased(ctx, p)
	if !leased {
		g = d.node.gen()
		ents, err = d.node.fs.tree.ReadDir(ctx, p)
	}
	if err != nil {
		return d.node.errno("readdir", p, err)
	}
	if d.cached {
		d.node.filledKernelCache(g)
	}
	d.entries, d.leases, d.g = ents, leases, g
	d.attrs = make(map[string]int, len(ents))
	for i := range ents {
		d.attrs[ents[i].Name] = i
	}
	d.loaded = true
	return 0
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.loaded {
		if errno := d.load(ctx); errno != 0 {
			return nil, errno
		}
	}
	i := d.pos
	var de fuse.DirEntry
	switch {
	case i == 0:
		de = fuse.DirEntry{Name: ".", Mode: syscall.S_IFDIR, Ino: d.node.StableAttr().Ino}
	case i == 1:
		de = fuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR}
	case i-2 < len(d.entries):
		e := &d.entries[i-2]
		de = fuse.DirEntry{Name: e.Name, Mode: e.Attr.Mode & syscall.S_IFMT, Ino: e.Attr.Ino}
	default:
		return nil, 0
	}
	d.pos++
	de.Off = uint64(d.pos)
	return &de, 0
}

// Seekdir goes back to an offset handed out earlier; 0 is rewinddir(3),
// which lists the directory afresh.
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off == 0 {
		d.loaded = false
	}
	d.pos = int(off)
	return 0
}

// Lookup answers READDIRPLUS from the listing's attributes.
func (d *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	d.mu.Lock()
	i, ok := d.attrs[name]
	var a session.Attr
	var lease LeaseState
	leased := d.leases != nil
	if ok {
		a = d.entries[i].Attr
		if leased {
			lease = d.leases[i]
		}
	}
	g := d.g
	d.mu.Unlock()
	if !ok {
		return d.node.Lookup(ctx, name, out)
	}
	child := d.node.newChild(ctx, name, a, out, g)
	if cn, ok := child.Operations().(*Node); ok && d.node.fs.lease != nil {
		if leased {
			d.node.fs.lease.install(cn, a.Ino, lease, g)
		}
		d.node.leaseTimeouts(out, cn, g)
	}
	return child, 0
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.node.Fsync(ctx, nil, flags)
}

func (d *dirHandle) Releasedir(context.Context, uint32) {}
