package share

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

// lockEnv is one share file opened by two sessions (two LockSpaces of one
// server's table): A and B, with two handles in A.
type lockEnv struct {
	tab    *LockTable
	a, b   *LockSpace
	a1, a2 *OpenFile
	b1     *OpenFile
	path   string
	e      *env
	t      *testing.T
}

func newLockEnv(t *testing.T) *lockEnv {
	t.Helper()
	e := newEnv(t, false)
	e.writeFile(t, "db", "0123456789")
	le := &lockEnv{e: e, t: t, tab: NewLockTable(), path: filepath.Join(e.share, "db")}
	le.a, le.b = NewLockSpace(le.tab), NewLockSpace(le.tab)
	le.a1, le.a2, le.b1 = le.open(os.O_RDWR), le.open(os.O_RDONLY), le.open(os.O_RDWR)
	return le
}

func (le *lockEnv) open(flags int) *OpenFile {
	le.t.Helper()
	f, _, err := le.e.tr.Open("db", flags, 0)
	if err != nil {
		le.t.Fatal(err)
	}
	le.t.Cleanup(func() { f.Close() })
	return f
}

func wr(owner, start, end uint64) Lock {
	return Lock{Owner: owner, Start: start, End: end, Type: LockWrite}
}
func rd(owner, start, end uint64) Lock {
	return Lock{Owner: owner, Start: start, End: end, Type: LockRead}
}
func un(owner, start, end uint64) Lock {
	return Lock{Owner: owner, Start: start, End: end, Type: Unlock}
}

func wantConflict(t *testing.T, what string, err error) {
	t.Helper()
	if !IsLockConflict(err) {
		t.Errorf("%s: %v, want a lock conflict (EAGAIN)", what, err)
	}
	wantErrno(t, what, err, syscall.EAGAIN)
}

func noErr(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

// TestLockOwners: one owner's locks never conflict with themselves, through
// any of its session's handles (a POSIX process with two descriptors);
// another owner of the same session, and any owner of another session,
// conflicts; F_GETLK-style Test reports the holder's range and type.
func TestLockOwners(t *testing.T) {
	le := newLockEnv(t)
	noErr(t, "A owner 1 write-locks 0-4", le.a.Lock(le.a1, wr(1, 0, 4)))
	noErr(t, "A owner 1 read-locks 2-3 through its other handle", le.a.Lock(le.a2, rd(1, 2, 3)))
	noErr(t, "A owner 1 write-locks 4-9 through the first", le.a.Lock(le.a1, wr(1, 4, 9)))
	wantConflict(t, "A owner 2", le.a.Lock(le.a1, wr(2, 9, 9)))
	wantConflict(t, "B owner 1", le.b.Lock(le.b1, rd(1, 0, 0)))
	noErr(t, "B owner 1 beyond the range", le.b.Lock(le.b1, wr(1, 10, LockToEOF)))

	got, err := le.b.Test(le.b1, wr(7, 0, LockToEOF))
	if err != nil || got.Type != LockRead && got.Type != LockWrite {
		t.Fatalf("Test = %+v %v, want a conflict", got, err)
	}
	if got.Start != 0 || got.End > 9 {
		t.Errorf("Test reports %d-%d, want a range within A's 0-9", got.Start, got.End)
	}
	if got, err := le.b.Test(le.b1, wr(1, 10, 30)); err != nil || got.Type != Unlock {
		t.Errorf("an owner's own lock conflicts with it in Test: %+v %v", got, err)
	}
	if got, err := le.a.Test(le.a1, rd(9, 10, 20)); err != nil || got.Type != LockWrite || got.Start != 10 || got.End != LockToEOF {
		t.Errorf("Test of B's 10-EOF from A = %+v %v", got, err)
	}

	// Unlocking part of a range splits it, as POSIX says.
	noErr(t, "A owner 1 unlocks 0-1", le.a.Lock(le.a1, un(1, 0, 1)))
	noErr(t, "B owner 1 takes 0-1", le.b.Lock(le.b1, wr(1, 0, 1)))
	wantConflict(t, "B owner 1 at 2", le.b.Lock(le.b1, wr(1, 2, 2)))
	noErr(t, "unlock of an owner holding nothing", le.a.Lock(le.a1, un(42, 0, LockToEOF)))
	if err := le.a.Lock(le.a1, Lock{Owner: 1, Start: 5, End: 4, Type: LockWrite}); err != protocol.StatusInvalidParameter {
		t.Errorf("End < Start: %v, want INVALID_PARAMETER", err)
	}
}

// TestLockLocalProcess: the server's locks are the kernel's, so a local
// process's fcntl and flock locks conflict with them both ways.
func TestLockLocalProcess(t *testing.T) {
	le := newLockEnv(t)
	local, err := os.OpenFile(le.path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	// An OFD lock of the test's own: a classic POSIX lock would conflict
	// just as well, but dies with any close of the file in this process.
	fl := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 3, Len: 1}
	if err := unix.FcntlFlock(local.Fd(), unix.F_OFD_SETLK, &fl); err != nil {
		t.Fatal(err)
	}
	wantConflict(t, "A against a local lock", le.a.Lock(le.a1, rd(1, 0, 9)))
	if got, err := le.a.Test(le.a1, rd(1, 0, 9)); err != nil || got.Type != LockWrite || got.Start != 3 || got.End != 3 {
		t.Errorf("Test against a local lock = %+v %v, want write 3-3", got, err)
	}
	fl.Type = unix.F_UNLCK
	unix.FcntlFlock(local.Fd(), unix.F_OFD_SETLK, &fl)
	noErr(t, "A after the local unlock", le.a.Lock(le.a1, wr(1, 0, 9)))
	fl = unix.Flock_t{Type: unix.F_RDLCK, Start: 0, Len: 1}
	if err := unix.FcntlFlock(local.Fd(), unix.F_OFD_SETLK, &fl); err == nil {
		t.Error("a local process read-locked what A holds")
	}

	// flock(2) is its own lock space, shared with local flock users.
	noErr(t, "A flock exclusive", le.a.Lock(le.a1, Lock{Owner: 5, Type: LockWrite, Flock: true}))
	if err := unix.Flock(int(local.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != unix.EWOULDBLOCK {
		t.Errorf("local flock against A's: %v, want EWOULDBLOCK", err)
	}
	wantConflict(t, "B flock shared", le.b.Lock(le.b1, Lock{Owner: 5, Type: LockRead, Flock: true}))
	noErr(t, "A flock unlock", le.a.Lock(le.a1, Lock{Owner: 5, Type: Unlock, Flock: true}))
	noErr(t, "B flock shared after", le.b.Lock(le.b1, Lock{Owner: 5, Type: LockRead, Flock: true}))
}

// TestLockRelease: closing an owner's locks (UnlockOwner, what a client's
// close asks) or the handle they were taken through (Release) frees them.
func TestLockRelease(t *testing.T) {
	le := newLockEnv(t)
	noErr(t, "A owner 1", le.a.Lock(le.a1, wr(1, 0, 0)))
	noErr(t, "A owner 2", le.a.Lock(le.a2, rd(2, 5, 5)))
	noErr(t, "UnlockOwner 1", le.a.UnlockOwner(le.a2, 1)) // any handle of the file
	noErr(t, "B after A's owner 1 closed", le.b.Lock(le.b1, wr(1, 0, 0)))
	wantConflict(t, "B against owner 2", le.b.Lock(le.b1, wr(1, 5, 5)))
	le.a.Release(le.a2)
	noErr(t, "B after A's handle 2 closed", le.b.Lock(le.b1, wr(1, 5, 5)))
	if err := le.a.Lock(le.a2, wr(2, 7, 7)); err != protocol.StatusFileClosed {
		t.Errorf("lock through a released handle: %v, want FILE_CLOSED", err)
	}
	if !le.a.Empty() {
		t.Error("A's space still holds something")
	}
}

// waitFor starts a wait and returns its outcome channel.
func (le *lockEnv) waitFor(s *LockSpace, f *OpenFile, lk Lock) (*Waiter, chan error) {
	ch := make(chan error, 1)
	w := s.NewWaiter(f, lk, func(err error) { ch <- err })
	w.Start()
	return w, ch
}

func wantOutcome(t *testing.T, what string, ch chan error, want error) {
	t.Helper()
	select {
	case err := <-ch:
		if err != want {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still waiting", what)
	}
}

func wantWaiting(t *testing.T, what string, ch chan error) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s: ended with %v while the conflict lasts", what, err)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestLockWait: a wait is granted when the holder releases — through the
// server, or a local process the server only polls — and ends on Cancel or
// when its handle closes, leaving nothing in the table.
func TestLockWait(t *testing.T) {
	le := newLockEnv(t)
	noErr(t, "A holds", le.a.Lock(le.a1, wr(1, 0, LockToEOF)))
	_, ch := le.waitFor(le.b, le.b1, wr(1, 0, 0))
	wantWaiting(t, "B's wait", ch)
	if n := le.tab.Waiting(); n != 1 {
		t.Errorf("Waiting = %d, want 1", n)
	}
	noErr(t, "A unlocks", le.a.Lock(le.a1, un(1, 0, LockToEOF)))
	wantOutcome(t, "B's wait after A's unlock", ch, nil)
	wantConflict(t, "A after B was granted", le.a.Lock(le.a1, rd(1, 0, 0)))

	// A local holder: found by polling.
	local, err := os.OpenFile(le.path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	fl := unix.Flock_t{Type: unix.F_WRLCK, Start: 100, Len: 1}
	if err := unix.FcntlFlock(local.Fd(), unix.F_OFD_SETLK, &fl); err != nil {
		t.Fatal(err)
	}
	_, ch = le.waitFor(le.a, le.a1, rd(1, 100, 100))
	wantWaiting(t, "A's wait on a local lock", ch)
	fl.Type = unix.F_UNLCK
	unix.FcntlFlock(local.Fd(), unix.F_OFD_SETLK, &fl)
	wantOutcome(t, "A's wait after the local unlock", ch, nil)

	// Cancelled, and closed.
	w, ch := le.waitFor(le.a, le.a2, rd(3, 0, 0))
	wantWaiting(t, "a wait to cancel", ch)
	if !w.Cancel() || w.Cancel() {
		t.Error("Cancel: want true once, then false")
	}
	wantOutcome(t, "cancelled wait", ch, protocol.StatusCancelled)
	_, ch = le.waitFor(le.a, le.a2, rd(3, 0, 0))
	wantWaiting(t, "a wait whose handle closes", ch)
	le.a.Release(le.a2)
	wantOutcome(t, "wait on a released handle", ch, protocol.StatusFileClosed)
	if n := le.tab.Waiting(); n != 0 {
		t.Errorf("Waiting = %d after every wait ended, want 0", n)
	}
}
