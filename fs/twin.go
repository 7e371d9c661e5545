package fs

import (
	"context"
	"slices"
	"syscall"
)

// Twins: shared writable mappings kept coherent at lock boundaries.
//
// The kernel writes a shared mapping's dirty pages back whole, but the
// bytes of one page may be guarded by different locks — sqlite's WAL index
// (-shm) keeps its header, guarded by the write lock, on the same page as
// each reader's mark, guarded by that reader's lock. Written back whole, a
// page from this mount would put back its stale copy of the bytes another
// mount changed under another lock meanwhile: a lost commit. So, as
// software distributed shared memory does it (TreadMarks' twins and
// diffs), the mount keeps a copy — a twin — of each page of a small file
// opened read-write as the server had it when the kernel read it, and a
// page written back goes to the server only as the bytes that differ from
// its twin: what this mount's programs changed. Bytes nobody here touched
// keep whatever the server has.
//
// Twins are taken from READ answers, and kept only while the file is open
// read-write (a mapping keeps its file open) and the page lies within
// twinSmall bytes of the start of the file — or anywhere, up to twinMax
// pages, once the kernel has written back a page of the file. A page with
// no twin is written back whole, as before. Dropping the kernel's cache
// drops the twins with it.
//
// Order: another mount may read the file while this one's program holds
// its lock (sqlite's readers lock the -shm too, with locks of their own),
// so the changed bytes land from the end of the file to its start, each
// piece before the next (writeBack; the unlock's pushDirty, and a lock's
// dropForLock, take the pages highest first), and after the writes to the files beside that came
// before: a program that publishes by a store to the start — sqlite's
// header, after its hash tables — is seen in its own order.

// Limits of twin keeping.
const (
	twinPage  = 4096
	twinSmall = 1 << 20 // twins of the first 1 MiB of any file open read-write
	twinMax   = 4096    // pages per file (16 MiB), once it is known to be mapped
	// twinGap merges two changed runs of a page less than this apart
	// into one write.
	twinGap = 32
)

// twinSet is one open file's twins.
type twinSet struct {
	pages  map[int64][]byte // page index → the server's bytes as last seen
	mapped bool             // the kernel wrote pages of it back
}

// twinned reports whether pages at off should have twins; called with
// o.mu held.
func (on *openNode) twinned(off int64) bool {
	return on.rw > 0 && (off+twinPage <= twinSmall || on.tw.mapped && len(on.tw.pages) < twinMax)
}

// keepTwins records the pages of data, read at off from the server.
func (o *openNodes) keepTwins(n *Node, data []byte, off int64) {
	if off%twinPage != 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	on := o.m[n]
	if on == nil {
		return
	}
	for i := 0; i < len(data); i += twinPage {
		at := off + int64(i)
		if !on.twinned(at) {
			return
		}
		if on.tw.pages == nil {
			on.tw.pages = map[int64][]byte{}
		}
		on.tw.pages[at/twinPage] = append([]byte(nil), data[i:min(i+twinPage, len(data))]...)
	}
}

// wrote brings the twins of the pages a write covered up to date: the
// server has those bytes now.
func (o *openNodes) wrote(n *Node, data []byte, off int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	on := o.m[n]
	if on == nil || len(on.tw.pages) == 0 {
		return
	}
	for p := off / twinPage; p*twinPage < off+int64(len(data)); p++ {
		tw, ok := on.tw.pages[p]
		if !ok {
			continue
		}
		start := max(p*twinPage, off)
		end := min((p+1)*twinPage, off+int64(len(data)))
		if need := int(end - p*twinPage); need > len(tw) {
			tw = append(tw, make([]byte, need-len(tw))...)
		}
		copy(tw[start-p*twinPage:], data[start-off:end-off])
		on.tw.pages[p] = tw
	}
}

// dropTwins forgets the twins of the pages in [off, off+size) (size ≤ 0:
// to the end): the kernel's cached pages there are gone.
func (o *openNodes) dropTwins(n *Node, off, size int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	on := o.m[n]
	if on == nil {
		return
	}
	if off <= 0 && size <= 0 {
		on.tw.pages = nil
		return
	}
	for p := range on.tw.pages {
		if (p+1)*twinPage > off && (size <= 0 || p*twinPage < off+size) {
			delete(on.tw.pages, p)
		}
	}
}

// mappedPages returns the indexes of the pages of n that have twins — the
// pages the kernel read while the file was open read-write — highest first,
// once the kernel has written pages of n back (a shared writable mapping's);
// nil before.
func (o *openNodes) mappedPages(n *Node) []int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	on := o.m[n]
	if on == nil || !on.tw.mapped {
		return nil
	}
	ps := make([]int64, 0, len(on.tw.pages))
	for p := range on.tw.pages {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	slices.Reverse(ps)
	return ps
}

// span is a piece of a written-back page to send: the bytes at off.
type span struct {
	off  int64
	data []byte
}

// diff returns the pieces of a written-back range that differ from the
// twins (whole pages where there is none), marks the file as mapped and
// makes the twins the written bytes.
func (o *openNodes) diff(n *Node, data []byte, off int64) []span {
	o.mu.Lock()
	on := o.m[n]
	var runs []span
	for i := 0; i < len(data); {
		at := off + int64(i)
		p := at / twinPage
		end := min(len(data), i+int(twinPage-at%twinPage))
		var tw []byte
		if on != nil && at%twinPage == 0 {
			tw = on.tw.pages[p]
		}
		if tw == nil {
			runs = append(runs, span{at, data[i:end]})
		} else {
			runs = append(runs, changed(tw, data[i:end], at)...)
		}
		i = end
	}
	if on != nil {
		on.tw.mapped = true
	}
	o.mu.Unlock()
	o.wrote(n, data, off)
	return runs
}

// changed returns the runs of page that differ from its twin tw (page is
// at off); bytes past the twin's end count as changed, and fewer than
// twinGap equal bytes between two changes go along with them.
func changed(tw, page []byte, off int64) []span {
	same := func(i int) bool { return i < len(tw) && tw[i] == page[i] }
	var runs []span
	for i := 0; i < len(page); {
		if same(i) {
			i++
			continue
		}
		end := i + 1 // just past the run's last changed byte
		for k := end; k < len(page) && k-end < twinGap; k++ {
			if !same(k) {
				end = k + 1
			}
		}
		runs = append(runs, span{off + int64(i), page[i:end]})
		i = end
	}
	return runs
}

// writeBack writes a page range the kernel writes back from its cache (a
// shared mapping's dirty pages) as its changed bytes only.
func (f *fileHandle) writeBack(ctx context.Context, buf []byte, off int64) (uint32, syscall.Errno) {
	// A context rawFS kept nothing for: the pieces are plain writes.
	plain, cancel := context.WithCancel(ctx)
	defer cancel()
	// From the end of the range to its start, each piece on the server
	// before the next is sent: a program that publishes with a store to
	// the start (sqlite's -shm header, after its hash tables) has it
	// seen last, as in memory shared on one host — a reader on another
	// mount may read the file at any time.
	runs := f.node.fs.open.diff(f.node, buf, off)
	for i := len(runs) - 1; i >= 0; i-- {
		r := runs[i]
		_, errno := f.Write(plain, r.data, r.off)
		if errno == 0 && i > 0 {
			if err := f.node.flushWrites(true); err != nil {
				errno = f.errno("write", err)
			}
		}
		if errno != 0 {
			f.node.fs.open.dropTwins(f.node, 0, 0) // unknown what the server has now
			return 0, errno
		}
	}
	return uint32(len(buf)), 0
}
