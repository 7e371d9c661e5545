package share

import (
	"errors"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

// Byte-range locks and flock, held on the server's disk so that they
// conflict with every other client and with local processes on the server
// host.
//
// A client's kernel names the holder of a lock with an opaque owner: its
// process (a POSIX fcntl lock: two descriptors of one process share its
// locks), or its open file description (an OFD lock, and flock). The server
// gives each (file, owner) of a session an open file description of its
// own, opened anew on the file, and holds that owner's locks there with
// F_OFD_SETLK and flock(2). OFD locks of different descriptions conflict as
// the owners' locks must, merge and split ranges as POSIX says for one
// owner, and conflict with local processes' fcntl locks (flock with theirs)
// — the kernel does all the lock arithmetic, and nothing the server
// process itself closes can drop them (classic POSIX locks die with any
// close of the inode in the process; OFD locks only with their own
// description). Releasing an owner's locks is closing its description.
//
// Nobody waits in the kernel: a blocked F_SETLKW is a Waiter that retries
// a non-blocking attempt when a lock on that file is released through any
// session's LockSpace (the server-wide LockTable says who waits for what),
// and on a timer that backs off to lockPollMax for holders the server
// cannot hear about — local processes. No thread is parked per waiter, and
// a wait ends at once when cancelled.

// Lock types, as fcntl(2) numbers them (the session channel carries these
// values).
const (
	LockRead  uint32 = unix.F_RDLCK
	LockWrite uint32 = unix.F_WRLCK
	Unlock    uint32 = unix.F_UNLCK
)

// LockToEOF as a lock's End means "to the end of the file, however far it
// grows": the kernel's OFFSET_MAX, which FUSE uses too.
const LockToEOF uint64 = 1<<63 - 1

// Lock is a lock request or a lock found: a range of one owner's, or with
// Flock a whole-file flock(2) lock.
type Lock struct {
	// Owner is the client's name for the holder: unique per process
	// (POSIX locks) or per open file (OFD locks, flock) within one
	// session.
	Owner uint64
	// Start and End are the first and last bytes, inclusive; End
	// LockToEOF runs to the end of the file. Ignored with Flock.
	Start, End uint64
	// Type is LockRead, LockWrite or Unlock.
	Type uint32
	// Flock says the lock is a flock(2) lock: shared (LockRead) or
	// exclusive (LockWrite) on the whole file, apart from fcntl locks.
	Flock bool
}

// check refuses what no kernel sends.
func (lk Lock) check() error {
	if lk.Type != LockRead && lk.Type != LockWrite && lk.Type != Unlock {
		return fail(unix.EINVAL)
	}
	if !lk.Flock && (lk.Start > LockToEOF || lk.End > LockToEOF || lk.End < lk.Start) {
		return fail(unix.EINVAL)
	}
	return nil
}

// flockT is lk as struct flock for F_OFD_SETLK and F_OFD_GETLK (whose
// l_pid must be 0).
func (lk Lock) flockT() unix.Flock_t {
	fl := unix.Flock_t{Type: int16(lk.Type), Whence: unix.SEEK_SET, Start: int64(lk.Start)}
	if lk.End != LockToEOF {
		fl.Len = int64(lk.End - lk.Start + 1)
	}
	return fl
}

// lockFound is the conflicting lock F_OFD_GETLK reported. Its owner is not
// told: it is another session's, or a local process's pid on the server
// host, meaningless to the client (whose kernel then reports pid 0).
func lockFound(fl *unix.Flock_t) Lock {
	if fl.Type == unix.F_UNLCK {
		return Lock{Type: Unlock}
	}
	end := LockToEOF
	if fl.Len > 0 {
		end = uint64(fl.Start + fl.Len - 1)
	}
	return Lock{Type: uint32(fl.Type), Start: uint64(fl.Start), End: end}
}

// IsLockConflict reports whether err says another holder has the lock
// (EAGAIN, STATUS_FILE_LOCK_CONFLICT), the one failure a wait retries.
func IsLockConflict(err error) bool { return errors.Is(err, ntstatus.FileLockConflict) }

// fileKey names a file by device and inode (locks, leases).
type fileKey struct{ dev, ino uint64 }

// keyOnce is an open file's fileKey, found once.
type keyOnce struct {
	once sync.Once
	key  fileKey
	err  error
}

func (f *OpenFile) fileKey() (fileKey, error) {
	f.lockKey.once.Do(func() {
		f.lockKey.err = f.withFd(func(fd int) error {
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				return err
			}
			f.lockKey.key = fileKey{uint64(st.Dev), st.Ino}
			return nil
		})
	})
	return f.lockKey.key, f.lockKey.err
}

// LockTable is the server's record of waiting lock requests, by file, so
// that a release through any session wakes the waiters of that file. One
// per server; every LockSpace shares it.
type LockTable struct {
	mu    sync.Mutex
	waits map[fileKey]map[*Waiter]struct{}
}

// NewLockTable returns an empty table.
func NewLockTable() *LockTable { return &LockTable{waits: map[fileKey]map[*Waiter]struct{}{}} }

// Waiting is how many lock requests wait now.
func (t *LockTable) Waiting() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, ws := range t.waits {
		n += len(ws)
	}
	return n
}

func (t *LockTable) add(k fileKey, w *Waiter) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ws := t.waits[k]
	if ws == nil {
		ws = map[*Waiter]struct{}{}
		t.waits[k] = ws
	}
	ws[w] = struct{}{}
}

func (t *LockTable) remove(k fileKey, w *Waiter) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.waits[k], w)
	if len(t.waits[k]) == 0 {
		delete(t.waits, k)
	}
}

// wake makes every waiter of the files keys name try again, each in a
// goroutine of its own that ends with the attempt.
func (t *LockTable) wake(keys ...fileKey) {
	t.mu.Lock()
	var ws []*Waiter
	for _, k := range keys {
		for w := range t.waits[k] {
			ws = append(ws, w)
		}
	}
	t.mu.Unlock()
	for _, w := range ws {
		go w.try()
	}
}

// LockSpace holds the locks of one session's owners: the owner names its
// client chose live here. A session's durable handles keep their space
// when the connection drops, and the session that reclaims them adopts it.
// Safe for concurrent use.
type LockSpace struct {
	tab *LockTable

	mu      sync.Mutex
	owners  map[ownerKey]*lockOwner
	waiters map[*Waiter]struct{}
}

type ownerKey struct {
	file  fileKey
	owner uint64
}

// lockOwner is an owner's open file description on one file, where its
// locks are held, and the handles its locks were taken through (whose
// close releases them: see Release).
type lockOwner struct {
	fd  int
	via map[*OpenFile]struct{}
}

// NewLockSpace returns a space whose waits are woken through tab.
func NewLockSpace(tab *LockTable) *LockSpace {
	return &LockSpace{tab: tab, owners: map[ownerKey]*lockOwner{}, waiters: map[*Waiter]struct{}{}}
}

// Empty reports whether the space holds no owner's description and no
// waiter: nothing in it would be lost by replacing it.
func (s *LockSpace) Empty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.owners) == 0 && len(s.waiters) == 0
}

// Lock sets or clears lk on f's file for lk.Owner without waiting:
// STATUS_FILE_LOCK_CONFLICT (EAGAIN) when another holder conflicts. An
// unlock of an owner that holds nothing on the file succeeds.
func (s *LockSpace) Lock(f *OpenFile, lk Lock) error {
	if err := lk.check(); err != nil {
		return err
	}
	key, err := f.fileKey()
	if err != nil {
		return err
	}
	s.mu.Lock()
	if f.lockGone {
		s.mu.Unlock()
		return protocol.StatusFileClosed
	}
	o := s.owners[ownerKey{key, lk.Owner}]
	if o == nil && lk.Type == Unlock {
		s.mu.Unlock()
		return nil
	}
	if o == nil {
		if o, err = s.newOwner(f, key, lk.Owner); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	o.via[f] = struct{}{}
	if lk.Flock {
		how := map[uint32]int{LockRead: unix.LOCK_SH, LockWrite: unix.LOCK_EX, Unlock: unix.LOCK_UN}[lk.Type]
		err = unix.Flock(o.fd, how|unix.LOCK_NB)
	} else {
		fl := lk.flockT()
		err = unix.FcntlFlock(uintptr(o.fd), unix.F_OFD_SETLK, &fl)
	}
	s.mu.Unlock()
	if err == unix.EWOULDBLOCK || err == unix.EACCES && !lk.Flock {
		err = unix.EAGAIN // POSIX allows EACCES for a conflict
	}
	if err == nil && lk.Type != LockWrite {
		// Something may have been released (an unlock, a downgrade to
		// a read lock): whoever waits for this file tries again.
		s.tab.wake(key)
	}
	return fail(err)
}

// newOwner opens the owner's description on f's file, with f's access —
// a write-only handle's read-write where the file's permissions allow, so
// that its owner can take read locks too. A read-only handle's is never
// opened for writing: closing it would tell inotify watchers (and other
// clients' leases) that the file was written. An owner whose first lock on
// a file comes through a read-only handle can therefore not take a write
// lock through a writable one later (EBADF). The description is opened as
// the tree's user (Tree.as), so the kernel decides by the file's
// permissions whether a write-only handle's owner may read. Called with
// s.mu held.
func (s *LockSpace) newOwner(f *OpenFile, key fileKey, owner uint64) (*lockOwner, error) {
	var fd int
	err := f.tree.asFd(f, func(hfd int) error {
		acc, err := unix.FcntlInt(uintptr(hfd), unix.F_GETFL, 0)
		if err != nil {
			return err
		}
		acc &= unix.O_ACCMODE
		if acc == unix.O_WRONLY {
			if fd, err = f.tree.reopenFd(hfd, unix.O_RDWR); err == nil {
				return nil
			}
		}
		fd, err = f.tree.reopenFd(hfd, acc)
		return err
	})
	if err != nil {
		return nil, err
	}
	o := &lockOwner{fd: fd, via: map[*OpenFile]struct{}{}}
	s.owners[ownerKey{key, owner}] = o
	return o, nil
}

// reopenFd opens the file an open descriptor holds once more, as a new
// open file description with access acc (O_RDONLY, O_WRONLY, O_RDWR),
// through its /proc/self/fd magic link: the very inode, whatever its name
// is now. The open checks the permissions as an open(2) by the caller
// does: callers run it as the Tree's user (Tree.as), so that it is the
// user's permissions that decide.
func (t *Tree) reopenFd(fd, acc int) (int, error) {
	for {
		nfd, err := unix.Open(procPath(fd), acc|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
		if err != unix.EINTR {
			return nfd, err
		}
	}
}

// Test reports the first lock that would conflict with lk (F_OFD_GETLK),
// or Type Unlock when none would. The owner's own locks never conflict
// with it.
func (s *LockSpace) Test(f *OpenFile, lk Lock) (Lock, error) {
	if err := lk.check(); err != nil || lk.Flock || lk.Type == Unlock {
		return Lock{}, fail(unix.EINVAL)
	}
	key, err := f.fileKey()
	if err != nil {
		return Lock{}, err
	}
	fl := lk.flockT()
	s.mu.Lock()
	defer s.mu.Unlock()
	if o := s.owners[ownerKey{key, lk.Owner}]; o != nil {
		err = unix.FcntlFlock(uintptr(o.fd), unix.F_OFD_GETLK, &fl)
	} else {
		// The handle's own description holds no lock: everything held
		// conflicts as it would with the owner's.
		err = f.withFd(func(fd int) error { return unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &fl) })
	}
	if err != nil {
		return Lock{}, fail(err)
	}
	return lockFound(&fl), nil
}

// UnlockOwner releases every lock owner holds on f's file, fcntl and
// flock: what the client's kernel asks when the owner closes a descriptor
// of the file (POSIX: any close drops the process's locks on the file).
func (s *LockSpace) UnlockOwner(f *OpenFile, owner uint64) error {
	key, err := f.fileKey()
	if err != nil {
		return err
	}
	s.mu.Lock()
	o := s.owners[ownerKey{key, owner}]
	delete(s.owners, ownerKey{key, owner})
	s.mu.Unlock()
	if o != nil {
		unix.Close(o.fd)
		s.tab.wake(key)
	}
	return nil
}

// Release ends what f held in the space when its handle closes: the locks
// of every owner that took locks through f (an OFD or flock owner is that
// open file itself; a POSIX owner has closed it by now, which released its
// locks already), and the waits on f, which end with STATUS_FILE_CLOSED.
func (s *LockSpace) Release(f *OpenFile) {
	key, err := f.fileKey()
	s.mu.Lock()
	f.lockGone = true // no lock is taken through f after this
	var closed []int
	for k, o := range s.owners {
		if _, ok := o.via[f]; ok {
			closed = append(closed, o.fd)
			delete(s.owners, k)
		}
	}
	var ended []*Waiter
	for w := range s.waiters {
		if w.f == f {
			ended = append(ended, w)
		}
	}
	s.mu.Unlock()
	for _, w := range ended {
		w.end(protocol.StatusFileClosed)
	}
	for _, fd := range closed {
		unix.Close(fd)
	}
	if len(closed) > 0 && err == nil {
		s.tab.wake(key)
	}
}

// Poll intervals of a waiting lock: first retry after lockPollMin,
// doubling to lockPollMax. They bound how late a waiter notices that a
// local process released its lock; releases through the server wake
// waiters at once.
const (
	lockPollMin = 10 * time.Millisecond
	lockPollMax = 250 * time.Millisecond
)

// Waiter is a lock request that waits while another holder conflicts
// (F_SETLKW, a blocking flock). It ends once, through done: nil when the
// lock is taken, the error of a failed attempt other than a conflict,
// STATUS_CANCELLED (Cancel) or STATUS_FILE_CLOSED (the handle's Release).
type Waiter struct {
	s    *LockSpace
	f    *OpenFile
	lk   Lock
	key  fileKey
	done func(error)

	mu    sync.Mutex
	over  bool
	timer *time.Timer
	delay time.Duration
}

// NewWaiter prepares a wait for lk on f; Start begins it. done is called
// exactly once, from any goroutine — possibly Start's own.
func (s *LockSpace) NewWaiter(f *OpenFile, lk Lock, done func(error)) *Waiter {
	return &Waiter{s: s, f: f, lk: lk, done: done, delay: lockPollMin}
}

// Start registers the wait and makes the first attempt.
func (w *Waiter) Start() {
	key, err := w.f.fileKey()
	if err == nil {
		err = w.lk.check()
	}
	if err == nil && w.lk.Type == Unlock {
		err = fail(unix.EINVAL)
	}
	if err != nil {
		w.end(err)
		return
	}
	w.mu.Lock()
	if w.over {
		w.mu.Unlock()
		return
	}
	w.key = key
	w.s.mu.Lock()
	w.s.waiters[w] = struct{}{}
	w.s.mu.Unlock()
	w.s.tab.add(key, w)
	w.mu.Unlock()
	w.try()
}

// try makes one non-blocking attempt; on a conflict it arms the poll timer.
// An attempt that took the lock ends the wait before anything can cancel
// it, so a granted lock is always reported as granted.
func (w *Waiter) try() {
	w.mu.Lock()
	if w.over {
		w.mu.Unlock()
		return
	}
	err := w.s.Lock(w.f, w.lk)
	if IsLockConflict(err) {
		if w.timer != nil {
			w.timer.Stop()
		}
		w.timer = time.AfterFunc(w.delay, w.try)
		w.delay = min(2*w.delay, lockPollMax)
		w.mu.Unlock()
		return
	}
	w.stopLocked()
	w.mu.Unlock()
	w.finish(err)
}

// Cancel ends the wait with STATUS_CANCELLED, and reports whether it was
// still waiting (false: done has been or is being called with its own
// outcome).
func (w *Waiter) Cancel() bool { return w.end(protocol.StatusCancelled) }

// end finishes the wait with err unless it is over already.
func (w *Waiter) end(err error) bool {
	w.mu.Lock()
	if w.over {
		w.mu.Unlock()
		return false
	}
	w.stopLocked()
	w.mu.Unlock()
	w.finish(err)
	return true
}

// stopLocked marks the wait over; called with w.mu held.
func (w *Waiter) stopLocked() {
	w.over = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

// finish unregisters the ended wait and reports its outcome.
func (w *Waiter) finish(err error) {
	w.s.mu.Lock()
	_, registered := w.s.waiters[w]
	delete(w.s.waiters, w)
	w.s.mu.Unlock()
	if registered {
		w.s.tab.remove(w.key, w)
	}
	w.done(err)
}
