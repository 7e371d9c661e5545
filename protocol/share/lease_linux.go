package share

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Leases let a client cache what it read and keep a server handle after
// close, on the promise that the server tells it, before that promise is
// false, that something changed (SMB2/3 leases: MS-SMB2 2.2.13.2.8,
// 3.3.4.7 "Object Store Indicates a Lease Break", 2.2.23.2 lease break
// notification, 2.2.24.2 acknowledgment; seed 004's directory leasing).
// docs/session.md, "Leases", is the contract; this file is the server's
// table of who holds what, the rules for granting, and the breaks.
//
// A lease belongs to a Tree (one tree connect of one session: one client's
// cache of the share) and names an object by device and inode:
//
//   - Read on a file: its data and attributes may be cached. Granted while
//     no other tree has the file open for writing or holds Write.
//   - Handle on a file (with Read): a closed handle may be kept open and
//     reused for the next compatible open.
//   - Write on a file (with Read and Handle): writes and attribute changes
//     may be held back until close; granted with an open for writing when
//     no other tree has the file open or holds any lease on it.
//   - Read on a directory: its attributes and entries (names, absent names,
//     the listing) may be cached.
//
// Another tree's change breaks the leases it invalidates, the actor's own
// never: a write-open or truncate removes Read; an attribute change keeps
// Read (the holder drops its attributes and handles); an open or stat by
// another tree recalls Write first (the holder sends what it held back); a
// name created, removed or renamed in a directory keeps the directory's
// Read and names the entries. A file's breaks wait for the holder's
// acknowledgement, at most the break timeout; a directory's do not — see
// breakObj for why. Local processes' changes arrive through the watcher
// (watch_linux.go) and break every holder.

// LeaseState is a set of caching rights: MS-SMB2's lease state bits.
type LeaseState uint32

// Lease states (SMB2_LEASE_READ_CACHING, _HANDLE_CACHING, _WRITE_CACHING).
const (
	LeaseRead   LeaseState = 0x1
	LeaseHandle LeaseState = 0x2
	LeaseWrite  LeaseState = 0x4
	// LeaseAll is every right.
	LeaseAll = LeaseRead | LeaseHandle | LeaseWrite
)

// String names the rights, "R", "RH", "RWH", or "none".
func (s LeaseState) String() string {
	if s == 0 {
		return "none"
	}
	var b strings.Builder
	for _, r := range []struct {
		bit LeaseState
		c   byte
	}{{LeaseRead, 'R'}, {LeaseWrite, 'W'}, {LeaseHandle, 'H'}} {
		if s&r.bit != 0 {
			b.WriteByte(r.c)
		}
	}
	return b.String()
}

// LeaseBreak is what a tree's client is told when a lease it holds no
// longer holds as it was (LEASE_BREAK on the session channel).
type LeaseBreak struct {
	// ID names the break in its acknowledgement.
	ID uint64
	// Ino is the object (its inode number, as Attr.Ino); 0 means every
	// lease the tree holds.
	Ino uint64
	// Ack says the server waits for the acknowledgement.
	Ack bool
	// Current is what the tree held; New what it holds now.
	Current, New LeaseState
	// Names are a directory's entries that were created, removed or
	// renamed (New keeps Read); none for a change of the object itself.
	Names []string
}

// BreakSender delivers a break to a tree's client. It must not block: the
// session channel queues the frame.
type BreakSender func(LeaseBreak)

// DefaultLeaseBreakTimeout is how long a change waits for a holder's
// acknowledgement before it revokes every lease of that holder and goes on.
// A client only has to tell its kernel to drop caches (and send data it
// held back, at most 128 KiB, fs.leaseHoldMax) before it acknowledges: that takes
// milliseconds, so this bounds what a hung or vanished client costs the
// others. SMB waits 35 s, for clients that flush whole write-back caches.
const DefaultLeaseBreakTimeout = 5 * time.Second

// maxWatchedDirs bounds the directories one share watches at once: each
// holds an O_PATH descriptor (to remove its mark later). Beyond it, leases
// that need a new watch are refused.
const maxWatchedDirs = 8192

// maxTreeLeases bounds the leases one tree holds (a client listing huge
// directories, or a hostile one): beyond it, new ones are refused.
const maxTreeLeases = 1 << 18

func keyOf(st *unix.Stat_t) fileKey { return fileKey{uint64(st.Dev), st.Ino} }

// leaseTable is a share's leases and the open counts they depend on.
type leaseTable struct {
	timeout time.Duration
	w       *watcher

	mu      sync.Mutex
	objs    map[fileKey]*leaseObj
	byFID   map[string]*leaseObj
	waits   map[uint64]pending // breaks waiting for an acknowledgement
	fsids   map[uint64]string  // filesystem ids by device (fidOf)
	nextID  uint64
	watched int // directories with a mark

	changes     atomic.Uint64 // every change seen: hooks and local events
	leaseCounts               // leases held, all trees
}

// leaseCounts is how many leases are held, and how many of them Write: a
// share's (leaseTable) and one tree's (treeLeases), so that a tree can ask
// whether others hold any (othersHold, othersWrite).
type leaseCounts struct {
	held   atomic.Int64
	writes atomic.Int64 // of them Write
}

// leaseObj is one file or directory the table knows: held, open, or a
// directory watched for its leased children.
type leaseObj struct {
	key     fileKey
	dir     bool
	fid     string
	holders map[*Tree]LeaseState
	opens   map[*Tree]*openCount
	parent  *leaseObj // a file's watched directory
	kids    int       // a directory's leased files watched through its mark
	markFd  int       // a watched directory's O_PATH descriptor; -1 when not watched
}

type openCount struct{ all, write int }

// treeLeases is a tree's side: how to reach its client, and what it holds.
type treeLeases struct {
	send BreakSender
	leaseCounts
	// Guarded by leaseTable.mu.
	objs      map[*leaseObj]struct{}
	suspended bool   // an acknowledgement timed out: no grants until resumeID is acknowledged
	resumeID  uint64 // the "every lease" break that ended the suspension's leases
	closed    bool
}

// openLeases starts the share's lease table, or leaves the share without
// leases (sh.leases nil, the reason in sh.leaseErr) when the kernel cannot
// watch for local changes.
func (s *Share) openLeases(timeout time.Duration) {
	if timeout <= 0 {
		timeout = DefaultLeaseBreakTimeout
	}
	lt := &leaseTable{timeout: timeout, objs: map[fileKey]*leaseObj{}, byFID: map[string]*leaseObj{}, waits: map[uint64]pending{}, fsids: map[uint64]string{}}
	w, err := newWatcher(lt.local)
	if err != nil {
		s.leaseErr = err
		return
	}
	lt.w = w
	s.leases = lt
}

// closeLeases stops the watcher and closes the marks' descriptors.
func (s *Share) closeLeases() {
	lt := s.leases
	if lt == nil {
		return
	}
	lt.w.close()
	lt.mu.Lock()
	defer lt.mu.Unlock()
	for _, o := range lt.objs {
		if o.markFd >= 0 {
			unix.Close(o.markFd)
			o.markFd = -1
		}
	}
}

// Leasing reports whether the share grants leases, and if not, why.
func (s *Share) Leasing() (bool, error) { return s.leases != nil, s.leaseErr }

// EnableLeases lets the tree hold leases, which its client hears about
// through send. Until it is called the tree is granted none (its client
// may not handle unsolicited frames).
func (t *Tree) EnableLeases(send BreakSender) {
	if t.sh.leases == nil {
		return
	}
	t.sh.leases.mu.Lock()
	defer t.sh.leases.mu.Unlock()
	if t.lease == nil {
		t.lease = &treeLeases{send: send, objs: map[*leaseObj]struct{}{}}
	}
}

// Disconnect ends the tree's leases (TREE_DISCONNECT, the session's end):
// they are dropped without a break, and breaks still waiting for its
// acknowledgement stop waiting.
func (t *Tree) Disconnect() {
	lt := t.sh.leases
	if lt == nil || t.lease == nil {
		return
	}
	lt.mu.Lock()
	defer lt.mu.Unlock()
	tl := t.lease
	tl.closed = true
	for o := range tl.objs {
		lt.dropHolder(o, t)
	}
	for id, p := range lt.waits {
		if p.t == t {
			delete(lt.waits, id)
			close(p.done)
		}
	}
}

// othersHold reports whether any tree but t holds a lease on the share:
// when none does, a change of t's breaks nothing. Callers ask after the
// change (see grant for why that order is safe).
func (t *Tree) othersHold() bool {
	return t.othersCount(func(c *leaseCounts) *atomic.Int64 { return &c.held })
}

// othersCount reports whether the share's count (which of leaseCounts) is
// above t's own: some other tree holds what it counts.
func (t *Tree) othersCount(which func(*leaseCounts) *atomic.Int64) bool {
	lt := t.sh.leases
	if lt == nil {
		return false
	}
	own := int64(0)
	if t.lease != nil {
		own = which(&t.lease.leaseCounts).Load()
	}
	return which(&lt.leaseCounts).Load() > own
}

// obj returns the object for key, making it; lt.mu held.
func (lt *leaseTable) obj(key fileKey, dir bool) *leaseObj {
	o := lt.objs[key]
	if o == nil {
		o = &leaseObj{key: key, dir: dir, holders: map[*Tree]LeaseState{}, opens: map[*Tree]*openCount{}, markFd: -1}
		lt.objs[key] = o
	}
	return o
}

// tidy forgets o when nothing refers to it any more; lt.mu held.
func (lt *leaseTable) tidy(o *leaseObj) {
	if len(o.holders) > 0 || len(o.opens) > 0 || o.kids > 0 {
		return
	}
	if o.markFd >= 0 {
		lt.w.unmarkDir(o.markFd)
		unix.Close(o.markFd)
		o.markFd = -1
		lt.watched--
	}
	if o.fid != "" && lt.byFID[o.fid] == o {
		delete(lt.byFID, o.fid)
	}
	if p := o.parent; p != nil {
		o.parent = nil
		p.kids--
		lt.tidy(p)
	}
	if lt.objs[o.key] == o {
		delete(lt.objs, o.key)
	}
}

// setHolder records that t holds s on o (none: drops it); lt.mu held.
func (lt *leaseTable) setHolder(o *leaseObj, t *Tree, s LeaseState) {
	old, had := o.holders[t]
	if had && old&LeaseWrite != 0 {
		lt.writes.Add(-1)
		t.lease.writes.Add(-1)
	}
	if s == 0 {
		if had {
			delete(o.holders, t)
			delete(t.lease.objs, o)
			t.lease.held.Add(-1)
			lt.held.Add(-1)
		}
		lt.tidy(o)
		return
	}
	if !had {
		t.lease.objs[o] = struct{}{}
		t.lease.held.Add(1)
		lt.held.Add(1)
	}
	if s&LeaseWrite != 0 {
		lt.writes.Add(1)
		t.lease.writes.Add(1)
	}
	o.holders[t] = s
}

func (lt *leaseTable) dropHolder(o *leaseObj, t *Tree) { lt.setHolder(o, t, 0) }

// allowed is what t may hold on o, of want, given the other trees' opens
// and leases; writer says t has it open for writing (or is opening it so,
// or already holds Write). lt.mu held.
func (o *leaseObj) allowed(t *Tree, want LeaseState, writer bool) LeaseState {
	if o.dir {
		return want & LeaseRead
	}
	otherWriter, otherOpen, otherLease, otherW := false, false, false, false
	for ot, c := range o.opens {
		if ot != t {
			otherOpen = true
			otherWriter = otherWriter || c.write > 0
		}
	}
	for ot, s := range o.holders {
		if ot != t {
			otherLease = true
			otherW = otherW || s&LeaseWrite != 0
		}
	}
	if otherWriter || otherW {
		return 0
	}
	got := want & (LeaseRead | LeaseHandle)
	if want&LeaseWrite != 0 && writer && !otherOpen && !otherLease {
		got |= LeaseWrite
	}
	if got&LeaseRead == 0 {
		return 0 // Handle and Write only come with Read
	}
	return got
}

// grant gives t what it may hold of want on the object st describes, at
// (dirfd, base) — base "" when dirfd is the object, a directory —, and
// makes sure the watcher sees local changes to it. The caller then reads
// the state the client will cache (a stat, a listing) and sends that:
// registered first, read second, so that any change after the read finds
// t among the holders. A change between the key's stat and the
// registration is in the read too. openWrite: t is opening it for writing.
func (t *Tree) grant(dirfd int, base string, st *unix.Stat_t, want LeaseState, openWrite bool) LeaseState {
	return t.grantWith(dirfd, base, st, want, openWrite, nil)
}

// grantWith is grant of a file whose kernel handle h the caller already
// took (nil: grant takes it).
func (t *Tree) grantWith(dirfd int, base string, st *unix.Stat_t, want LeaseState, openWrite bool, h *unix.FileHandle) LeaseState {
	lt := t.sh.leases
	if lt == nil || t.lease == nil || want == 0 {
		return 0
	}
	typ := st.Mode & unix.S_IFMT
	dir := typ == unix.S_IFDIR
	if !dir && (typ != unix.S_IFREG && typ != unix.S_IFLNK || st.Nlink > 1) {
		// A hard-linked file can change through a directory nobody
		// watches.
		return 0
	}
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if t.lease.closed || t.lease.suspended || lt.w.failed.Load() {
		return 0
	}
	if t.lease.held.Load() >= maxTreeLeases {
		if o := lt.objs[keyOf(st)]; o == nil || o.holders[t] == 0 {
			return 0
		}
	}
	o := lt.obj(keyOf(st), dir)
	got := o.allowed(t, want|o.holders[t], openWrite || o.holders[t]&LeaseWrite != 0)
	if got != 0 && !lt.watch(o, dirfd, base, h) {
		got = 0
	}
	lt.setHolder(o, t, got)
	return got
}

// watch makes sure local changes to o are seen: a directory through its
// own mark, a file through its directory's (dirfd) mark and its file
// identifier (h, the file's kernel handle, when the caller has it). lt.mu
// held.
func (lt *leaseTable) watch(o *leaseObj, dirfd int, base string, h *unix.FileHandle) bool {
	if o.dir {
		if o.markFd >= 0 {
			return true
		}
		return lt.markDir(o, dirfd, base)
	}
	// Each time: an inode number freed and used again by a new file
	// (ext4 does that at once) must not keep the old file's identifier,
	// which the new file's events do not carry.
	return lt.watchIn(o, dirfd, base, h)
}

// watchIn watches file o as base in directory dirfd: through the
// directory's mark, by its file identifier (from h, its kernel handle,
// when not nil). lt.mu held.
func (lt *leaseTable) watchIn(o *leaseObj, dirfd int, base string, h *unix.FileHandle) bool {
	if base == "" {
		return false
	}
	var pst unix.Stat_t
	if unix.Fstat(dirfd, &pst) != nil {
		return false
	}
	p := lt.obj(keyOf(&pst), true)
	if p.markFd < 0 && !lt.markDir(p, dirfd, "") {
		lt.tidy(p)
		return false
	}
	fid, err := fidOf(dirfd, base, p.key.dev, lt.fsids, h)
	if err != nil {
		lt.tidy(p)
		return false
	}
	lt.attach(o, p, fid)
	return true
}

// attach makes p's mark watch file o, known by fid; lt.mu held.
func (lt *leaseTable) attach(o, p *leaseObj, fid string) {
	if o.parent != p {
		if old := o.parent; old != nil {
			old.kids--
			o.parent = nil
			lt.tidy(old)
		}
		o.parent = p
		p.kids++
	}
	if o.fid != fid {
		if o.fid != "" && lt.byFID[o.fid] == o {
			delete(lt.byFID, o.fid)
		}
		o.fid = fid
	}
	lt.byFID[fid] = o
}

// markDir marks directory o, reached as (dirfd, base); lt.mu held.
func (lt *leaseTable) markDir(o *leaseObj, dirfd int, base string) bool {
	if lt.watched >= maxWatchedDirs {
		return false
	}
	var fd int
	var err error
	if base == "" {
		fd, err = unix.Openat(dirfd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	} else {
		fd, err = unix.Openat(dirfd, base, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return false
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || keyOf(&st) != o.key {
		unix.Close(fd)
		return false
	}
	fid, err := fidOf(fd, "", o.key.dev, lt.fsids, nil)
	if err == nil {
		err = lt.w.markDir(fd)
	}
	if err != nil {
		unix.Close(fd)
		return false
	}
	o.markFd = fd
	o.fid = fid
	lt.byFID[fid] = o
	lt.watched++
	return true
}

// ReleaseLeases gives up the tree's leases on the objects with these inode
// numbers (its client forgot them).
func (t *Tree) ReleaseLeases(inos []uint64) {
	lt := t.sh.leases
	if lt == nil || t.lease == nil || len(inos) == 0 {
		return
	}
	want := make(map[uint64]bool, len(inos))
	for _, ino := range inos {
		want[ino] = true
	}
	lt.mu.Lock()
	defer lt.mu.Unlock()
	for o := range t.lease.objs {
		if want[o.key.ino] {
			lt.dropHolder(o, t)
		}
	}
}

// AckLease is the client's acknowledgement of break id.
func (t *Tree) AckLease(id uint64) {
	lt := t.sh.leases
	if lt == nil || t.lease == nil {
		return
	}
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if p, ok := lt.waits[id]; ok && p.t == t {
		delete(lt.waits, id)
		close(p.done)
	}
	if t.lease.suspended && t.lease.resumeID == id {
		t.lease.suspended = false
	}
}

// pending is one break to send, and its waiter when it needs an ack.
type pending struct {
	t    *Tree
	b    LeaseBreak
	done chan struct{}
}

// breakObj breaks the leases other trees than actor (nil: a local process)
// hold on o after a change to it: each holder keeps cur&keep and is told,
// with names for a directory's entries. lt.mu held; the caller sends and
// waits (deliver) after unlocking.
//
// A directory's breaks are not waited for. A client turns one into an
// invalidation of its kernel's entries, which waits for the directory's
// lock; when two clients change one directory at once, each holds that
// lock in its own kernel for its own change while the server waits for the
// other's acknowledgement — a deadlock only the timeout would end. So a
// name created or removed on one mount shows on another a break's delivery
// later (milliseconds), not before the change returns; a file's data
// (whose invalidation takes no directory lock) is coherent when the
// writer's call returns.
func (lt *leaseTable) breakObj(o *leaseObj, actor *Tree, keep LeaseState, names []string) []pending {
	return lt.breakHolders(o, actor, keep, names, false)
}

// recall takes Write from the other trees holding it on o, before actor
// reads or opens it: each sends what it held back (and keeps keep) before
// the acknowledgement. lt.mu held.
func (lt *leaseTable) recall(o *leaseObj, actor *Tree, keep LeaseState) []pending {
	return lt.breakHolders(o, actor, keep&^LeaseWrite, nil, true)
}

func (lt *leaseTable) breakHolders(o *leaseObj, actor *Tree, keep LeaseState, names []string, onlyChanged bool) []pending {
	if o == nil {
		return nil
	}
	var out []pending
	for ht, cur := range o.holders {
		nw := cur & keep
		if ht == actor || onlyChanged && nw == cur {
			continue
		}
		lt.nextID++
		p := pending{t: ht, b: LeaseBreak{ID: lt.nextID, Ino: o.key.ino, Current: cur, New: nw, Names: names}}
		if actor != nil && !o.dir {
			p.b.Ack = true
			p.done = make(chan struct{})
			lt.waits[p.b.ID] = p
		}
		out = append(out, p)
		lt.setHolder(o, ht, nw)
	}
	return out
}

// deliver sends breaks and waits for the acknowledgements they need, at
// most the break timeout; a holder that does not answer in time loses
// every lease it holds on the share (suspend). The wait is afterRun's:
// on an identity thread it happens once the operation is handed back, off
// the thread, still before the operation returns — except for a break
// that takes Write, which is waited for here: its holder sends the data it
// held back before it acknowledges, and what the operation does next
// (read attributes, grant a lease) must see that data.
func (lt *leaseTable) deliver(ps []pending) {
	var waits []pending
	takesWrite := false
	for _, p := range ps {
		p.t.lease.send(p.b)
		if p.done != nil {
			waits = append(waits, p)
			takesWrite = takesWrite || p.b.Current&^p.b.New&LeaseWrite != 0
		}
	}
	if len(waits) == 0 {
		return
	}
	deadline := time.Now().Add(lt.timeout)
	if takesWrite {
		lt.await(waits, deadline)
		return
	}
	afterRun(func() { lt.await(waits, deadline) })
}

// await waits for breaks' acknowledgements until deadline, suspending the
// holders that do not answer by then.
func (lt *leaseTable) await(ps []pending, deadline time.Time) {
	tm := time.NewTimer(time.Until(deadline))
	defer tm.Stop()
	expired := false
	for _, p := range ps {
		if !expired {
			select {
			case <-p.done:
				continue
			case <-tm.C:
				expired = true
			}
		}
		select {
		case <-p.done:
		default:
			lt.suspend(p.t, p.b.ID)
		}
	}
}

// suspend revokes every lease of a tree that did not acknowledge break id
// in time, tells it so with one break for all of them, and grants it
// nothing until it acknowledges that one.
func (lt *leaseTable) suspend(t *Tree, id uint64) {
	lt.mu.Lock()
	if p, ok := lt.waits[id]; ok {
		delete(lt.waits, id)
		close(p.done)
	}
	if t.lease.suspended || t.lease.closed {
		lt.mu.Unlock()
		return
	}
	for o := range t.lease.objs {
		lt.dropHolder(o, t)
	}
	lt.nextID++
	t.lease.suspended, t.lease.resumeID = true, lt.nextID
	b := LeaseBreak{ID: lt.nextID, Ack: true, Current: LeaseAll}
	lt.mu.Unlock()
	t.lease.send(b)
}

// local handles the watcher's events: changes made on the server host by
// other processes. Nobody waits for these breaks; a process on the server
// host is not held up by clients. It reports whether any lease was broken
// or revoked.
func (lt *leaseTable) local(evs []watchEvent) bool {
	var ps []pending
	lt.mu.Lock()
	for _, ev := range evs {
		lt.changes.Add(1)
		if ev.overflow {
			ps = append(ps, lt.revokeAll()...)
			continue
		}
		d := lt.byFID[ev.dir]
		switch {
		case ev.name == ".":
			// The watched directory itself.
			keep := LeaseRead
			if ev.mask&unix.FAN_DELETE_SELF != 0 {
				keep = 0
			}
			ps = append(ps, lt.breakObj(d, nil, keep, nil)...)
		case ev.mask&(unix.FAN_CREATE|unix.FAN_DELETE|unix.FAN_MOVED_FROM|unix.FAN_MOVED_TO) != 0:
			ps = append(ps, lt.breakObj(d, nil, LeaseRead, []string{ev.name})...)
			if c := lt.byFID[ev.fid]; c != nil && c != d && ev.mask&(unix.FAN_DELETE|unix.FAN_MOVED_FROM) != 0 {
				// Gone from the watched directory: a file is no
				// longer watched there; a directory keeps its mark.
				keep := LeaseRead
				if !c.dir {
					keep = 0
				}
				ps = append(ps, lt.breakObj(c, nil, keep, nil)...)
			}
		default:
			// A child's data or attributes. A local change drops
			// everything cached of a file: the table does not know
			// what an attribute change did to it (a new hard link,
			// say).
			if c := lt.byFID[ev.fid]; c != nil && c != d {
				keep := LeaseState(0)
				if c.dir {
					keep = LeaseRead
				}
				ps = append(ps, lt.breakObj(c, nil, keep, nil)...)
			}
		}
	}
	lt.mu.Unlock()
	lt.deliver(ps)
	return len(ps) > 0
}

// revokeAll drops every lease of every tree (events were lost); lt.mu
// held.
func (lt *leaseTable) revokeAll() []pending {
	seen := map[*Tree]bool{}
	for _, o := range lt.objs {
		for t := range o.holders {
			seen[t] = true
		}
	}
	var ps []pending
	for t := range seen {
		for o := range t.lease.objs {
			lt.dropHolder(o, t)
		}
		lt.nextID++
		ps = append(ps, pending{t: t, b: LeaseBreak{ID: lt.nextID, Current: LeaseAll}})
	}
	return ps
}

// othersWrite reports whether any tree but t holds Write on the share: a
// read or change by t may then have to recall it.
func (t *Tree) othersWrite() bool {
	return t.othersCount(func(c *leaseCounts) *atomic.Int64 { return &c.writes })
}

// OthersHold reports whether another tree holds a lease on the share: a
// change by t may then wait for acknowledgements.
func (t *Tree) OthersHold() bool { return t.othersHold() }
