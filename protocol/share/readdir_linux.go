package share

import (
	"os"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// dirListing is a tree's most recent sorted directory listing, reused for
// the continuation pages of the same directory while it is unchanged (same
// inode, mtime and ctime), so that paging a big directory does not re-read
// and re-sort it for every page. A listing taken within racyWindow of the
// directory's last change is not trusted: timestamps are as coarse as a
// clock tick, so a change in the same tick would not show (git's "racy
// clean" problem).
type dirListing struct {
	mu sync.Mutex
	dirListingData
}

type dirListingData struct {
	path  string
	dev   uint64
	ino   uint64
	mtime unix.Timespec
	ctime unix.Timespec
	racy  bool
	names []string
}

const racyWindow = 100 * time.Millisecond

// list returns the sorted names of the directory p open at f, from the
// cache when the listing continues (after is not "") one of an unchanged
// directory.
func (l *dirListing) list(p, after string, f *os.File) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if after != "" && !l.racy && l.path == p && l.dev == st.Dev && l.ino == st.Ino &&
		l.mtime == st.Mtim && l.ctime == st.Ctim {
		return l.names, nil
	}
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	changed := time.Unix(st.Ctim.Unix())
	if m := time.Unix(st.Mtim.Unix()); m.After(changed) {
		changed = m
	}
	l.dirListingData = dirListingData{path: p, dev: st.Dev, ino: st.Ino, mtime: st.Mtim, ctime: st.Ctim,
		racy: time.Since(changed) < racyWindow, names: names}
	return names, nil
}

// ReadDir lists directory p, "." and ".." left out, sorted by name (bytes),
// each entry with its attributes (lstat): the entries after the name after
// ("" from the start), as many as budget holds when each costs cost(name)
// — always at least one — and whether more follow. An entry removed since
// the listing is skipped. It runs as the tree's user: listing needs read
// permission on the directory, the attributes search permission.
func (t *Tree) ReadDir(p, after string, budget int, cost func(name string) int) (ents []DirEntry, more bool, err error) {
	err = t.as(func() (err error) {
		ents, more, err = t.readDir(p, after, budget, cost, nil, t.listedRecall)
		return err
	})
	return ents, more, err
}

// readDir is ReadDir on a thread acting as the tree's user, calling
// opened with the directory's descriptor before it is read and listed
// with the entries and their stat after.
func (t *Tree) readDir(p, after string, budget int, cost func(name string) int,
	opened func(fd int), listed func(fd int, ents []DirEntry, sts []unix.Stat_t)) (ents []DirEntry, more bool, err error) {
	fd, err := t.sh.root.open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, false, err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if opened != nil {
		opened(fd)
	}
	names, err := t.listing.list(p, after, f)
	if err != nil {
		return nil, false, err
	}
	i := sort.SearchStrings(names, after)
	if after != "" && i < len(names) && names[i] == after {
		i++
	}
	var sts []unix.Stat_t
	used := 0
	for ; i < len(names); i++ {
		n := names[i]
		c := cost(n)
		if used+c > budget && len(ents) > 0 {
			more = true
			break
		}
		st, err := statAt(fd, n)
		if err != nil {
			continue // removed since the listing
		}
		ents = append(ents, DirEntry{Name: n, Attr: attrFromStat(&st)})
		sts = append(sts, st)
		used += c
	}
	if listed != nil {
		listed(fd, ents, sts)
	}
	return ents, more, nil
}
