package share

import "golang.org/x/sys/unix"

// The share's operations and leases: the grants a client asks for with an
// operation (LEASE, OPEN, MKDIR, READDIR), and the hooks every operation
// calls so that its change breaks the other trees' leases (lease_linux.go
// has the rules). Each hook is a no-op on a share without leases.

// openLease is what the table knows of an open file.
type openLease struct {
	key   fileKey
	write bool
	on    bool // counted in the table
}

// statAt is fstatat(dirfd, base, AT_SYMLINK_NOFOLLOW); base "" is dirfd.
func statAt(dirfd int, base string) (st unix.Stat_t, err error) {
	if base == "" {
		err = unix.Fstat(dirfd, &st)
	} else {
		err = unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	}
	return st, err
}

// Lease returns p's attributes (lstat) with the lease the tree may hold of
// want on it: LOOKUP and GETATTR for a client that caches.
func (t *Tree) Lease(p string, want LeaseState) (a Attr, got LeaseState, err error) {
	err = t.at(p, func(dirfd int, base string) error {
		st, err := statAt(dirfd, base)
		if err != nil {
			return err
		}
		t.recall(&st)
		if st.Mode&unix.S_IFMT == unix.S_IFDIR && !mayList(dirfd, base) {
			want = 0
		}
		got = t.grant(dirfd, base, &st, want, false)
		st2, err := statAt(dirfd, base)
		if err != nil {
			return err
		}
		if got != 0 && keyOf(&st2) != keyOf(&st) {
			t.ReleaseLeases([]uint64{st.Ino}) // replaced in between
			got = 0
		}
		a = attrFromStat(&st2)
		return nil
	})
	return a, got, err
}

// mayList reports whether the thread's user (Tree.as) may read the
// directory (dirfd, base): a directory's lease tells its holder the names
// created and removed in it, which only a user who may list it may learn.
func mayList(dirfd int, base string) bool {
	flags := unix.AT_EACCESS | unix.AT_SYMLINK_NOFOLLOW // AT_EACCESS: the fsuid, not the real uid
	if base == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	return unix.Faccessat2(dirfd, base, unix.R_OK, flags) == nil
}

// OpenLease is Open with a lease of want on the opened file (Write only
// with an open for writing). A final symlink opened through gets none:
// its target's directory is not the one the path names.
func (t *Tree) OpenLease(p string, flags int, mode uint32, want LeaseState) (*OpenFile, Attr, LeaseState, error) {
	f, a, err := t.Open(p, flags, mode)
	if err != nil || want == 0 || t.sh.leases == nil {
		return f, a, 0, err
	}
	var got LeaseState
	// The file's kernel handle, from its descriptor: the watch knows the
	// file by it, and its FileID seals it (one name_to_handle_at for
	// both, of this very file whatever its name now holds).
	h, hok := f.handle()
	t.at(p, func(dirfd int, base string) error {
		st, err := statAt(dirfd, base)
		if err != nil || keyOf(&st) != f.lease.key {
			return err
		}
		hp := (*unix.FileHandle)(nil)
		if hok {
			hp = &h
		}
		got = t.grantWith(dirfd, base, &st, want, f.lease.write, hp)
		return nil
	})
	if got != 0 {
		// Registered: what the client caches is read from here on.
		a, err = f.Stat()
	}
	return f, a, got, err
}

// MkdirLease is Mkdir with a lease of want on the new, empty directory.
func (t *Tree) MkdirLease(p string, mode uint32, want LeaseState) (Attr, LeaseState, error) {
	a, err := t.Mkdir(p, mode)
	if err != nil || want == 0 || t.sh.leases == nil {
		return a, 0, err
	}
	la, got, lerr := t.Lease(p, want)
	if lerr != nil || la.Ino != a.Ino {
		return a, 0, nil
	}
	return la, got, nil
}

// ReadDirLease is ReadDir with a lease of want on the directory (asked on
// the first page: after "") and of entryWant on each entry: ents[i] is
// granted leases[i]. The directory is registered before it is read; the
// entries after, and only if nothing changed on the share meanwhile.
func (t *Tree) ReadDirLease(p, after string, budget int, cost func(name string) int,
	want, entryWant LeaseState) (ents []DirEntry, more bool, got LeaseState, leases []LeaseState, err error) {
	lt := t.sh.leases
	if lt == nil || t.lease == nil || want|entryWant == 0 {
		ents, more, err = t.ReadDir(p, after, budget, cost)
		return ents, more, 0, make([]LeaseState, len(ents)), err
	}
	var sts []unix.Stat_t
	var c0 uint64
	opened := func(fd int) {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil {
			got = t.grant(fd, "", &st, want, false)
		}
		c0 = lt.changes.Load()
	}
	listed := func(fd int, ents []DirEntry, st []unix.Stat_t) {
		sts = st
		leases = make([]LeaseState, len(ents))
		if entryWant == 0 {
			return
		}
		for i := range ents {
			leases[i] = t.grant(fd, ents[i].Name, &sts[i], entryWant, false)
		}
		if lt.changes.Load() != c0 {
			// Something changed while the entries were read: their
			// attributes may predate it.
			var drop []uint64
			for i := range leases {
				if leases[i] != 0 {
					drop = append(drop, ents[i].Attr.Ino)
					leases[i] = 0
				}
			}
			t.ReleaseLeases(drop)
		}
	}
	// As the user: the listing needs read permission on the directory,
	// which is also what its lease tells (the names changed in it).
	err = t.as(func() (err error) {
		ents, more, err = t.readDir(p, after, budget, cost, opened, listed)
		return err
	})
	return ents, more, got, leases, err
}

// recall takes Write from the other trees holding it on the object st
// describes, and waits until they sent what they held back: before t
// reads its attributes, or changes it. It reports whether anything was
// recalled (the caller then reads the object again). Cheap when no tree
// holds Write.
func (t *Tree) recall(st *unix.Stat_t) bool {
	lt := t.sh.leases
	if !t.othersWrite() {
		return false
	}
	lt.mu.Lock()
	ps := lt.recall(lt.objs[keyOf(st)], t, LeaseAll)
	lt.mu.Unlock()
	lt.deliver(ps)
	return len(ps) > 0
}

// recallFor is recall for attributes a of (dirfd, base), read again when
// something was recalled.
func (t *Tree) recallFor(st *unix.Stat_t, a *Attr, dirfd int, base string) {
	if t.recall(st) {
		if st2, err := statAt(dirfd, base); err == nil {
			*a = attrFromStat(&st2)
		}
	}
}

// recallFd is recall before a change through fd (a setattr).
func (t *Tree) recallFd(fd int) {
	if !t.othersWrite() {
		return
	}
	if st, err := statAt(fd, ""); err == nil {
		t.recall(&st)
	}
}

// recallPath is recall before an open that truncates p (following a final
// symlink, as the open does).
func (t *Tree) recallPath(p string) {
	if !t.othersWrite() {
		return
	}
	t.at(p, func(dirfd int, base string) error {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, base, &st, 0) == nil {
			t.recall(&st)
		}
		return nil
	})
}

// noteChange counts a change t made and reports whether another tree holds
// a lease it may break. Asked after the change: see grant.
func (t *Tree) noteChange() bool {
	lt := t.sh.leases
	if lt == nil {
		return false
	}
	lt.changes.Add(1)
	return t.othersHold()
}

// changed breaks the other trees' leases on the object st describes after
// t changed it: down to keep (a directory always keeps Read unless keep
// is 0 and it is gone).
func (t *Tree) changed(st *unix.Stat_t, keep LeaseState) {
	if t.noteChange() {
		t.breakKey(keyOf(st), keep, nil)
	}
}

// breakKey breaks the other trees' leases on key down to keep, naming a
// directory's changed entries.
func (t *Tree) breakKey(key fileKey, keep LeaseState, names []string) {
	lt := t.sh.leases
	lt.mu.Lock()
	ps := lt.breakObj(lt.objs[key], t, keep, names)
	lt.mu.Unlock()
	lt.deliver(ps)
}

// changedFd is changed for the object fd refers to.
func (t *Tree) changedFd(fd int, keep LeaseState) {
	if !t.noteChange() {
		return
	}
	if st, err := statAt(fd, ""); err == nil {
		t.breakKey(keyOf(&st), keep, nil)
	}
}

// namesChanged breaks the other trees' leases on directory dirfd after t
// created, removed or renamed names in it.
func (t *Tree) namesChanged(dirfd int, names ...string) {
	if !t.noteChange() {
		return
	}
	if st, err := statAt(dirfd, ""); err == nil {
		t.breakKey(keyOf(&st), LeaseRead, names)
	}
}

// victim is the object (dirfd, base) before a change removes or replaces
// it (unlink, rmdir, rename), for gone.
func (t *Tree) victim(dirfd int, base string) *unix.Stat_t {
	if t.sh.leases == nil || base == "" {
		return nil
	}
	st, err := statAt(dirfd, base)
	if err != nil {
		return nil
	}
	return &st
}

// gone breaks the leases on an object that lost a name: a file drops
// everything (its directory no longer watches it), a directory that was
// removed too.
func (t *Tree) gone(st *unix.Stat_t) {
	if st != nil {
		t.changed(st, 0)
	}
}

// moved breaks the other trees' leases on an object t renamed to (nd, nb)
// (its attributes changed) and moves a file's watch to its new directory;
// a file that cannot be watched there keeps no lease.
func (t *Tree) moved(st *unix.Stat_t, nd int, nb string) {
	lt := t.sh.leases
	if lt == nil || st == nil {
		return
	}
	t.changed(st, LeaseRead)
	lt.mu.Lock()
	defer lt.mu.Unlock()
	o := lt.objs[keyOf(st)]
	if o == nil || o.dir || o.parent == nil {
		return
	}
	if !lt.watchIn(o, nd, nb, nil) {
		for ht := range o.holders {
			lt.dropHolder(o, ht)
		}
	}
}

// linked breaks every lease on a file that gained a hard link — the
// actor's too, silently (its client drops it when LINK succeeds): it can
// now change through a directory nobody watches.
func (t *Tree) linked(st *unix.Stat_t) {
	lt := t.sh.leases
	if lt == nil || st == nil {
		return
	}
	t.changed(st, 0)
	lt.mu.Lock()
	if o := lt.objs[keyOf(st)]; o != nil && t.lease != nil {
		lt.dropHolder(o, t)
	}
	lt.mu.Unlock()
}

// leaseOpened counts an open of f (flags as Open got them; st is f's
// stat, read by its open) and breaks what it conflicts with: an open for
// writing (or truncating) ends the other trees' leases; any other open
// recalls their Write. It reports whether it took another tree's Write
// and waited for what that tree sent: st may predate it.
func (t *Tree) leaseOpened(f *OpenFile, flags int, st *unix.Stat_t) (recalled bool) {
	lt := t.sh.leases
	if lt == nil {
		return false
	}
	write := flags&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_TRUNC != 0
	f.lease = openLease{key: keyOf(st), write: write, on: true}
	lt.mu.Lock()
	o := lt.obj(f.lease.key, st.Mode&unix.S_IFMT == unix.S_IFDIR)
	c := o.opens[t]
	if c == nil {
		c = &openCount{}
		o.opens[t] = c
	}
	c.all++
	var ps []pending
	if write {
		c.write++
		lt.changes.Add(1)
		ps = lt.breakObj(o, t, 0, nil)
	} else {
		ps = lt.recall(o, t, LeaseAll)
	}
	lt.mu.Unlock()
	lt.deliver(ps)
	for _, p := range ps {
		recalled = recalled || p.b.Current&^p.b.New&LeaseWrite != 0
	}
	return recalled
}

// leaseClosed uncounts f's open.
func (f *OpenFile) leaseClosed() {
	lt := f.tree.sh.leases
	if lt == nil || !f.lease.on {
		return
	}
	lt.mu.Lock()
	defer lt.mu.Unlock()
	f.lease.on = false
	o := lt.objs[f.lease.key]
	if o == nil {
		return
	}
	if c := o.opens[f.tree]; c != nil {
		c.all--
		if f.lease.write {
			c.write--
		}
		if c.all <= 0 {
			delete(o.opens, f.tree)
		}
	}
	lt.tidy(o)
}

// createdPath breaks the other trees' leases on p's directory after an
// open with O_CREAT (which may have made p).
func (t *Tree) createdPath(p string) {
	if !t.noteChange() {
		return
	}
	t.at(p, func(dirfd int, base string) error {
		if st, err := statAt(dirfd, ""); err == nil && base != "" {
			t.breakKey(keyOf(&st), LeaseRead, []string{base})
		}
		return nil
	})
}

// listedRecall takes Write from other trees on listed entries (st[i] is
// ents[i]'s), re-reading those entries' attributes. Only when some tree
// holds Write.
func (t *Tree) listedRecall(fd int, ents []DirEntry, sts []unix.Stat_t) {
	if !t.othersWrite() {
		return
	}
	for i := range ents {
		t.recallFor(&sts[i], &ents[i].Attr, fd, ents[i].Name)
	}
}

// setattrBreaking is setattrFd between the lease hooks: other trees' Write
// recalled before (what they held back lands first), their leases broken
// after (a new size ends Read; other attributes keep it). typ is fd's
// file type when known (setattrFd).
func (t *Tree) setattrBreaking(fd int, typ uint32, in SetAttrIn, a *Attr) error {
	if in.Valid == 0 {
		// Changes nothing (a client's fstat of a handle).
		r, err := t.sh.setattrFd(fd, typ, in)
		*a = r
		return err
	}
	t.recallFd(fd)
	r, err := t.sh.setattrFd(fd, typ, in)
	if err != nil {
		return err
	}
	keep := LeaseRead
	if in.Valid&SetSize != 0 {
		keep = 0
	}
	t.changedFd(fd, keep)
	*a = r
	return nil
}

// renamed breaks the other trees' leases after a rename of (od, ob) to
// (nd, nb): both directories' names, the moved object's attributes (and
// its watch follows it), and a replaced object — or, exchanged, the other
// moved one.
func (t *Tree) renamed(od int, ob string, nd int, nb string, moving, replaced *unix.Stat_t, exchange bool) {
	if t.sh.leases == nil {
		return
	}
	var ost, nst unix.Stat_t
	if unix.Fstat(od, &ost) == nil && unix.Fstat(nd, &nst) == nil && keyOf(&ost) == keyOf(&nst) {
		t.namesChanged(od, ob, nb)
	} else {
		t.namesChanged(od, ob)
		t.namesChanged(nd, nb)
	}
	t.moved(moving, nd, nb)
	if exchange {
		t.moved(replaced, od, ob)
	} else {
		t.gone(replaced)
	}
}
