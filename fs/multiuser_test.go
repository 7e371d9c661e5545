package fs

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// fakeUsers hands out sessions over local directories, one per local uid,
// and counts logons and closes.
type fakeUsers struct {
	mu       sync.Mutex
	dirs     map[uint32]string
	accounts map[uint32]Account
	versions map[uint32]string
	fail     map[uint32]error
	dials    map[uint32]int
	closed   map[uint32]int
}

func newFakeUsers() *fakeUsers {
	return &fakeUsers{dirs: map[uint32]string{}, accounts: map[uint32]Account{}, versions: map[uint32]string{},
		fail: map[uint32]error{}, dials: map[uint32]int{}, closed: map[uint32]int{}}
}

func (f *fakeUsers) Credentials(_ context.Context, uid uint32) (Dialer, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dir, ok := f.dirs[uid]
	if !ok {
		return nil, "", ErrNoCredentials
	}
	return func(context.Context) (*Session, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.dials[uid]++
		if err := f.fail[uid]; err != nil {
			return nil, err
		}
		dt := newDirTree(dir)
		acct := f.accounts[uid]
		return &Session{Tree: dt, Data: SessionDataPath(dt), Done: make(chan struct{}), Account: &acct,
			Close: func() error { f.mu.Lock(); f.closed[uid]++; f.mu.Unlock(); return nil }}, nil
	}, f.versions[uid], nil
}

func (f *fakeUsers) count(m map[uint32]int, uid uint32) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m[uid]
}

func (f *fakeUsers) set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

// as is a context of a FUSE request made by uid.
func as(uid uint32) context.Context {
	return fuse.NewContext(context.Background(), &fuse.Caller{Owner: fuse.Owner{Uid: uid, Gid: uid + 100}})
}

func TestMultiUserRoutesByCaller(t *testing.T) {
	f := newFakeUsers()
	for uid, name := range map[uint32]string{1: "a", 2: "b"} {
		dir := t.TempDir()
		mustWriteFile(t, filepath.Join(dir, name), name+"'s data")
		f.dirs[uid] = dir
		f.accounts[uid] = Account{Name: name, Uid: 500 + uid, Gid: 600 + uid}
	}
	ids := NewIDMap(IDMapNames, nil, fakeAccounts{}, nil)
	m := NewMultiUser(MultiUserConfig{Credentials: f.Credentials, Owners: ids})
	defer m.Close()

	if _, err := m.GetAttr(as(1), "a"); err != nil {
		t.Fatalf("user 1 stats its file: %v", err)
	}
	if _, err := m.GetAttr(as(1), "b"); err != syscall.ENOENT {
		t.Errorf("user 1 sees user 2's session: %v", err)
	}
	if _, err := m.GetAttr(as(2), "b"); err != nil {
		t.Errorf("user 2 stats its file: %v", err)
	}
	if f.count(f.dials, 1) != 1 || f.count(f.dials, 2) != 1 {
		t.Errorf("logons: %v, want one per user", f.dials)
	}
	// Each session's account shows as its user.
	if got := owner(ids, 501, 601); got != [2]uint32{1, 101} {
		t.Errorf("user 1's account shows as %v, want 1:101", got)
	}

	// Handles are the mount's: both sessions number theirs from 1, and a
	// handle goes to its opener's session whoever uses it (no caller).
	h1, _, err := m.Open(as(1), "a", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	h2, _, err := m.Open(as(2), "b", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if h1 == h2 {
		t.Fatalf("two users' handles collide: %d", h1)
	}
	buf := make([]byte, 64)
	if n, _ := m.ReadAt(context.Background(), h1, buf, 0); string(buf[:n]) != "a's data" {
		t.Errorf("read through user 1's handle: %q", buf[:n])
	}
	df, err := m.Attach(as(1), h2, os.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := df.ReadAt(context.Background(), buf, 0); string(buf[:n]) != "b's data" {
		t.Errorf("user 2's handle attached by user 1 reads %q, want user 2's file", buf[:n])
	}
	if _, err := m.WriteAt(as(1), h2, []byte("B"), 0); err != nil {
		t.Errorf("write through user 2's handle: %v", err)
	}
	if _, err := m.SetAttr(as(1), "", h2, session.SetAttrIn{Valid: session.SetSize, Size: 3}); err != nil {
		t.Errorf("ftruncate through user 2's handle: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(f.dirs[2], "b")); string(b) != "B's" {
		t.Errorf("user 2's file: %q", b)
	}
	for _, h := range []session.Handle{h1, h2} {
		if err := m.CloseHandle(context.Background(), h); err != nil {
			t.Errorf("close %d: %v", h, err)
		}
	}
	if err := m.CloseHandle(context.Background(), h1); err != syscall.EBADF {
		t.Errorf("second close: %v, want EBADF", err)
	}
	if err := m.Fsync(as(1), 999, false); err != syscall.EBADF {
		t.Errorf("fsync of an unknown handle: %v, want EBADF", err)
	}
	// No caller: refused.
	if _, err := m.GetAttr(context.Background(), "a"); err != syscall.EACCES {
		t.Errorf("no caller: %v, want EACCES", err)
	}
}

func TestMultiUserWithoutCredentials(t *testing.T) {
	f := newFakeUsers()
	m := NewMultiUser(MultiUserConfig{Credentials: f.Credentials})
	defer m.Close()
	for range 3 {
		if _, err := m.GetAttr(as(3), ""); err != syscall.EACCES {
			t.Fatalf("user without credentials: %v, want EACCES", err)
		}
	}
	// Credentials appear (a new file, `lwio login`): the next operation
	// logs on, without waiting out the remembered failure.
	dir := t.TempDir()
	f.set(func() { f.dirs[3], f.versions[3] = dir, "v1" })
	if _, err := m.GetAttr(as(3), ""); err != nil {
		t.Errorf("after credentials appeared: %v", err)
	}
}

func TestMultiUserFailedLogonRemembered(t *testing.T) {
	f := newFakeUsers()
	f.dirs[4], f.versions[4], f.fail[4] = t.TempDir(), "v1", session.ErrLogonFailure
	m := NewMultiUser(MultiUserConfig{Credentials: f.Credentials})
	defer m.Close()
	for range 5 {
		_, err := m.GetAttr(as(4), "")
		if translateError(m.log, "getattr", "", err) != syscall.EACCES {
			t.Fatalf("wrong password: %v, want it to mean EACCES", err)
		}
	}
	if n := f.count(f.dials, 4); n != 1 {
		t.Errorf("a failed logon was tried %d times in a row, want once (the server throttles failures)", n)
	}
	// The user fixes the file: a new version is tried at once.
	f.set(func() { f.versions[4], f.fail[4] = "v2", nil })
	if _, err := m.GetAttr(as(4), ""); err != nil {
		t.Errorf("after fixing the credentials: %v", err)
	}
	if n := f.count(f.dials, 4); n != 2 {
		t.Errorf("logons: %d, want 2", n)
	}
}

func TestMultiUserIdleSessionsClose(t *testing.T) {
	f := newFakeUsers()
	for uid := uint32(1); uid <= 3; uid++ {
		f.dirs[uid] = t.TempDir()
		mustWriteFile(t, filepath.Join(f.dirs[uid], "f"), "x")
	}
	m := NewMultiUser(MultiUserConfig{Credentials: f.Credentials, IdleTimeout: 40 * time.Millisecond})
	defer m.Close()
	// User 3 is the mounting user: pinned, never closed for idleness.
	r, err := NewReconnector(context.Background(), func(ctx context.Context) (*Session, error) {
		d, _, _ := f.Credentials(ctx, 3)
		return d(ctx)
	}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Pin(3, 3, r)
	h, _, err := m.Open(as(1), "f", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.GetAttr(as(2), "f"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "user 2's idle session to close", func() bool { return f.count(f.closed, 2) == 1 })
	time.Sleep(100 * time.Millisecond)
	if f.count(f.closed, 1) != 0 || f.count(f.closed, 3) != 0 {
		t.Errorf("closed a session with a file open (%d) or the pinned one (%d)", f.count(f.closed, 1), f.count(f.closed, 3))
	}
	if err := m.CloseHandle(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "user 1's session to close once its file is closed", func() bool { return f.count(f.closed, 1) == 1 })
	// The next operation logs on again.
	if _, err := m.GetAttr(as(2), "f"); err != nil || f.count(f.dials, 2) != 2 {
		t.Errorf("after idling out: %v, logons %d (want 2)", err, f.count(f.dials, 2))
	}
	m.Close()
	if f.count(f.closed, 3) != 1 || f.count(f.closed, 2) != 2 {
		t.Errorf("Close left sessions open: %v", f.closed)
	}
}

func TestMultiUserForget(t *testing.T) {
	f := newFakeUsers()
	f.dirs[1] = t.TempDir()
	m := NewMultiUser(MultiUserConfig{Credentials: f.Credentials})
	defer m.Close()
	hd, _, err := m.Open(as(1), "", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	m.Forget(1) // a file is open: kept
	if m.Sessions() != 1 || f.count(f.closed, 1) != 0 {
		t.Fatalf("Forget closed a session with a file open")
	}
	m.CloseHandle(context.Background(), hd)
	m.Forget(1)
	if m.Sessions() != 0 || f.count(f.closed, 1) != 1 {
		t.Errorf("Forget kept an unused session: %d sessions, %d closes", m.Sessions(), f.count(f.closed, 1))
	}
}

func mustWriteFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
