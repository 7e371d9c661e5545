package share

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
)

// Two accounts that need no passwd entry: the kernel takes any uid.
var (
	acctA = Account{Name: "lwt-a", Uid: 61001, Gid: 61001, Groups: []uint32{61001, 61100}}
	acctB = Account{Name: "lwt-b", Uid: 61002, Gid: 61002, Groups: []uint32{61002}}
)

// needPerUser skips unless the process can change a thread's credentials.
func needPerUser(t testing.TB) {
	t.Helper()
	if !PerUser() {
		t.Skipf("SKIP: per-user identity needs CAP_SETUID and CAP_SETGID (run as root); this process has uid %d without them", os.Geteuid())
	}
}

// threadIDs is the calling thread's fsuid, fsgid, groups and effective
// capabilities, from /proc/thread-self/status (the fourth field of Uid and
// Gid is the filesystem id). The goroutine stays on its thread between
// the open, which names the thread, and the read, which reports it: else
// it could read the status of a thread it left, which another goroutine
// may have switched to a user since.
type threadIDs struct {
	fsuid, fsgid uint32
	groups       string
	capEff       string
}

func readThreadIDs() (threadIDs, error) {
	runtime.LockOSThread()
	b, err := os.ReadFile("/proc/thread-self/status")
	runtime.UnlockOSThread()
	if err != nil {
		return threadIDs{}, err
	}
	var ids threadIDs
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		f := strings.Fields(v)
		switch k {
		case "Uid", "Gid":
			if len(f) != 4 {
				return ids, fmt.Errorf("%s line %q", k, line)
			}
			n, err := strconv.ParseUint(f[3], 10, 32)
			if err != nil {
				return ids, err
			}
			if k == "Uid" {
				ids.fsuid = uint32(n)
			} else {
				ids.fsgid = uint32(n)
			}
		case "Groups":
			ids.groups = strings.Join(f, " ")
		case "CapEff":
			ids.capEff = strings.TrimSpace(v)
		}
	}
	return ids, nil
}

func groupsString(gs []uint32) string {
	s := make([]string, len(gs))
	for i, g := range gs {
		s[i] = strconv.Itoa(int(g))
	}
	return strings.Join(s, " ")
}

// sharedDir is a share directory every account may write into.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	// t.TempDir's parents are 0700: let the test accounts through.
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// connectAs connects acct to a share of dir.
func connectAs(t *testing.T, dir string, acct Account, c Config) *Tree {
	t.Helper()
	c.Path = dir
	if c.Name == "" {
		c.Name = "s"
	}
	sh, err := Open(c, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	tr, err := sh.Connect(Identity{User: acct.Name, Account: acct})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func owner(t *testing.T, path string) (uint32, uint32) {
	t.Helper()
	st := testutil.Lstat(t, path)
	return st.Uid, st.Gid
}

// TestRunSetsThreadCredentials: inside run the thread has the account's
// fsuid, fsgid, groups and no effective capabilities; after it the
// server's own again. An account with uid 0 keeps the capabilities.
func TestRunSetsThreadCredentials(t *testing.T) {
	needPerUser(t)
	before, err := readThreadIDs()
	if err != nil {
		t.Fatal(err)
	}
	var inside threadIDs
	err = newCred(acctA).run(func() error {
		inside, err = readThreadIDs()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if inside.fsuid != acctA.Uid || inside.fsgid != acctA.Gid || inside.groups != groupsString(acctA.Groups) {
		t.Errorf("inside run: fsuid %d fsgid %d groups %q, want %d %d %q", inside.fsuid, inside.fsgid, inside.groups,
			acctA.Uid, acctA.Gid, groupsString(acctA.Groups))
	}
	if inside.capEff != "0000000000000000" {
		t.Errorf("inside run: CapEff %s, want none", inside.capEff)
	}
	after, err := readThreadIDs() // whichever thread this is: the server's
	if err != nil || after != before {
		t.Errorf("after run: %+v (%v), want %+v", after, err, before)
	}
	root := Account{Name: "root", Uid: 0, Gid: 0}
	err = newCred(root).run(func() error {
		inside, err = readThreadIDs()
		return err
	})
	if err != nil || inside.fsuid != 0 || inside.capEff != before.capEff {
		t.Errorf("as root: %+v (%v), want fsuid 0 and CapEff %s", inside, err, before.capEff)
	}
	if n := RestoreFailures(); n != 0 {
		t.Errorf("RestoreFailures = %d", n)
	}
}

// TestOwnershipAndPermissions: what each account creates is its own on
// disk, and the kernel's checks decide between them: B cannot read A's
// 0600 file, remove it from A's directory or give it away, and neither
// can chown to a stranger.
func TestOwnershipAndPermissions(t *testing.T) {
	needPerUser(t)
	dir := sharedDir(t)
	a := connectAs(t, dir, acctA, Config{})
	b := connectAs(t, dir, acctB, Config{})

	if _, err := a.Mkdir("adir", 0o755); err != nil {
		t.Fatal(err)
	}
	f, _, err := a.Open("adir/secret", os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("a's"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := a.Symlink("secret", "adir/link"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Mkdir("bdir", 0o700); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]Account{"adir": acctA, "adir/secret": acctA, "adir/link": acctA, "bdir": acctB} {
		if uid, gid := owner(t, filepath.Join(dir, p)); uid != want.Uid || gid != want.Gid {
			t.Errorf("%s owned by %d:%d on disk, want %d:%d", p, uid, gid, want.Uid, want.Gid)
		}
	}

	if _, _, err := b.Open("adir/secret", os.O_RDONLY, 0); !errors.Is(err, protocol.StatusAccessDenied) {
		t.Errorf("B opens A's 0600 file: %v, want ACCESS_DENIED", err)
	}
	wantErrno(t, "B unlinks in A's 0755 directory", b.Unlink("adir/secret"), syscall.EACCES)
	wantErrno(t, "A lists B's 0700 directory", func() error { _, err := readDir(a, "bdir"); return err }(), syscall.EACCES)
	_, err = b.SetAttr("adir/secret", SetAttrIn{Valid: SetMode, Mode: 0o644})
	wantErrno(t, "B chmods A's file", err, syscall.EPERM)
	// Through a handle the chmod is fchmod(2) on the descriptor, not a
	// path: B may write A's 0666 file, never change its mode.
	shared, _, err := a.Open("adir/shared", os.O_CREATE|os.O_WRONLY, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	shared.Close()
	if _, err := a.SetAttr("adir/shared", SetAttrIn{Valid: SetMode, Mode: 0o666}); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if bf, _, err := b.Open("adir/shared", os.O_WRONLY, 0); err != nil {
		t.Errorf("B opens A's 0666 file for writing: %v", err)
	} else {
		_, err = bf.SetAttr(SetAttrIn{Valid: SetMode, Mode: 0o4777})
		wantErrno(t, "B chmods A's file through its own handle", err, syscall.EPERM)
		bf.Close()
		if st, err := os.Stat(filepath.Join(dir, "adir/shared")); err != nil || st.Mode().Perm() != 0o666 || st.Mode()&os.ModeSetuid != 0 {
			t.Errorf("A's file after B's chmod through a handle: %v (%v), want 0666", st.Mode(), err)
		}
	}
	_, err = a.SetAttr("adir/secret", SetAttrIn{Valid: SetUid, Uid: 4321})
	wantErrno(t, "A gives its file to uid 4321", err, syscall.EPERM)
	_, err = a.SetAttr("adir/secret", SetAttrIn{Valid: SetGid, Gid: 61100})
	if err != nil {
		t.Errorf("A chgrps to a group it is in: %v", err)
	}
	_, err = a.SetAttr("adir/secret", SetAttrIn{Valid: SetGid, Gid: 61002})
	wantErrno(t, "A chgrps to B's group", err, syscall.EPERM)
	if uid, gid := owner(t, filepath.Join(dir, "adir/secret")); uid != acctA.Uid || gid != 61100 {
		t.Errorf("after the refusals A's file is %d:%d, want %d:61100", uid, gid, acctA.Uid)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "adir/secret")); err != nil || string(b) != "a's" {
		t.Errorf("A's file on disk: %q %v", b, err)
	}
}

// TestWriteClearsSetuid: a write through an open file (the LWIO data
// path's WriteAt) runs as the user, so the kernel clears a set-user-ID bit
// as it does for a local writer; a write as root would keep it.
func TestWriteClearsSetuid(t *testing.T) {
	needPerUser(t)
	dir := sharedDir(t)
	p, _, f := openOwned(t, dir, "prog", "#!/bin/sh\n", acctA, 0o4777)
	if _, err := f.WriteAt([]byte("x"), 20); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_ISUID != 0 {
		t.Errorf("after a write by its owner the file is mode %o: the set-user-ID bit survived", st.Mode)
	}
}

// TestRootRefused: an identity with uid 0 connects only to a share that
// allows root.
func TestRootRefused(t *testing.T) {
	needPerUser(t)
	root := Account{Name: "root"}
	sh, err := Open(Config{Name: "s", Path: t.TempDir()}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	_, err = sh.Connect(Identity{User: "admin", Account: root})
	var refused *RootRefused
	if !errors.As(err, &refused) || !errors.Is(err, protocol.StatusAccessDenied) || refused.User != "admin" {
		t.Errorf("root on a share without allow_root: %v", err)
	}
	sh.AllowRoot = true
	if _, err := sh.Connect(Identity{User: "admin", Account: root}); err != nil {
		t.Errorf("root on a share with allow_root: %v", err)
	}
}

// fakeDB is an account database for Accounts tests.
type fakeDB struct {
	mu    sync.Mutex
	accts map[string]Account
	calls int
}

func (db *fakeDB) lookup(name string) (Account, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.calls++
	a, ok := db.accts[name]
	if !ok {
		return Account{}, fmt.Errorf("%w: %q", ErrNoAccount, name)
	}
	a.Groups = append([]uint32(nil), a.Groups...)
	return a, nil
}

func (db *fakeDB) set(name string, a Account) {
	db.mu.Lock()
	db.accts[name] = a
	db.mu.Unlock()
}

// TestAccountsResolve: the account of the same name, a mapped one, the
// guest, or a refusal; lookups are cached for the TTL.
func TestAccountsResolve(t *testing.T) {
	needPerUser(t)
	db := &fakeDB{accts: map[string]Account{"lwt-a": acctA, "lwt-b": acctB, "nobody": {Name: "nobody", Uid: 65534, Gid: 65534}}}
	accts := NewAccounts(AccountsConfig{Map: map[string]string{"Boss": "lwt-b"}, Lookup: db.lookup})
	for logon, want := range map[string]string{"lwt-a": "lwt-a", "boss": "lwt-b", "BOSS": "lwt-b"} {
		id, guest, err := accts.Identity(logon)
		if err != nil || guest || id.Account.Name != want || id.User != logon {
			t.Errorf("Identity(%q) = %+v guest %v %v, want account %s", logon, id, guest, err, want)
		}
	}
	if _, _, err := accts.Identity("stranger"); !errors.Is(err, ErrNoAccount) {
		t.Errorf("unknown user without a guest account: %v, want ErrNoAccount", err)
	}
	calls := db.calls
	accts.Identity("lwt-a")
	if db.calls != calls {
		t.Errorf("a second Identity within the TTL looked the account up again")
	}
	withGuest := NewAccounts(AccountsConfig{Guest: "nobody", Lookup: db.lookup})
	if id, guest, err := withGuest.Identity("stranger"); err != nil || !guest || id.Account.Uid != 65534 {
		t.Errorf("unknown user with guest_account: %+v %v %v", id, guest, err)
	}
}

// TestGroupChangeTakesEffect: a tree looks its account up again once the
// TTL has passed, so a user added to a group reaches the group's files
// without a reconnect, and a removed account is refused.
func TestGroupChangeTakesEffect(t *testing.T) {
	needPerUser(t)
	dir := sharedDir(t)
	const staff = 61200
	p := filepath.Join(dir, "staff-only")
	if err := os.WriteFile(p, []byte("for staff"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 0, staff); err != nil {
		t.Fatal(err)
	}
	db := &fakeDB{accts: map[string]Account{"lwt-b": acctB}}
	accts := NewAccounts(AccountsConfig{Lookup: db.lookup, TTL: time.Minute})
	now := time.Now()
	var clock atomic.Pointer[time.Time]
	clock.Store(&now)
	accts.now = func() time.Time { return *clock.Load() }
	sh, err := Open(Config{Name: "s", Path: dir}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	id, _, err := accts.Identity("lwt-b")
	if err != nil {
		t.Fatal(err)
	}
	tr, err := sh.Connect(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tr.Open("staff-only", os.O_RDONLY, 0); !errors.Is(err, protocol.StatusAccessDenied) {
		t.Fatalf("before joining staff: %v, want ACCESS_DENIED", err)
	}
	joined := acctB
	joined.Groups = append(joined.Groups, staff)
	db.set("lwt-b", joined)
	if _, _, err := tr.Open("staff-only", os.O_RDONLY, 0); !errors.Is(err, protocol.StatusAccessDenied) {
		t.Errorf("within the TTL the old groups still apply: %v", err)
	}
	later := now.Add(time.Minute + time.Second)
	clock.Store(&later)
	f, _, err := tr.Open("staff-only", os.O_RDONLY, 0)
	if err != nil {
		t.Fatalf("after the TTL, as a member of staff: %v", err)
	}
	f.Close()
	db.mu.Lock()
	delete(db.accts, "lwt-b")
	db.mu.Unlock()
	evenLater := later.Add(2 * time.Minute)
	clock.Store(&evenLater)
	if _, err := tr.GetAttr("staff-only"); !errors.Is(err, protocol.StatusAccessDenied) {
		t.Errorf("after the account was removed: %v, want ACCESS_DENIED", err)
	}
}

// TestIdentityStress: goroutines of two accounts create files at once —
// on the namespace path (Open with O_CREAT, Mkdir) and the data path
// (WriteAt) — while others run as the server and watch their own thread's
// credentials. No file is ever owned by the other account, no data write
// clears a bit it should not, and no goroutine outside an identity ever
// finds a user's credentials on its thread.
func TestIdentityStress(t *testing.T) {
	needPerUser(t)
	dir := sharedDir(t)
	trees := map[*Account]*Tree{&acctA: connectAs(t, dir, acctA, Config{}), &acctB: connectAs(t, dir, acctB, Config{})}
	self, err := readThreadIDs()
	if err != nil {
		t.Fatal(err)
	}
	const workers, files = 8, 60
	var wg sync.WaitGroup
	errs := make(chan error, 4*workers)
	stop := make(chan struct{})
	var watched atomic.Int64
	// Watchers: plain goroutines that never take an identity.
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ids, err := readThreadIDs()
				if err != nil || ids.fsuid != self.fsuid || ids.fsgid != self.fsgid || ids.capEff != self.capEff {
					errs <- fmt.Errorf("a goroutine outside any identity runs with %+v (%v), want the server's %+v", ids, err, self)
					return
				}
				watched.Add(1)
				runtime.Gosched()
			}
		})
	}
	var creators sync.WaitGroup
	for acct, tr := range trees {
		for w := range workers {
			creators.Go(func() {
				for i := range files {
					name := fmt.Sprintf("%s-%d-%d", acct.Name, w, i)
					f, _, err := tr.Open(name, os.O_CREATE|os.O_RDWR|os.O_EXCL, 0o644)
					if err != nil {
						errs <- fmt.Errorf("%s: %v", name, err)
						return
					}
					_, err = f.WriteAt([]byte(name), 0)
					f.Close()
					if err != nil {
						errs <- fmt.Errorf("%s: write: %v", name, err)
						return
					}
					if _, err := tr.Mkdir(name+".d", 0o755); err != nil {
						errs <- fmt.Errorf("%s.d: %v", name, err)
						return
					}
				}
			})
		}
	}
	creators.Wait()
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2*2*workers*files {
		t.Errorf("%d entries on disk, want %d", len(ents), 2*2*workers*files)
	}
	for _, e := range ents {
		want := acctA
		if strings.HasPrefix(e.Name(), acctB.Name) {
			want = acctB
		}
		if uid, gid := owner(t, filepath.Join(dir, e.Name())); uid != want.Uid || gid != want.Gid {
			t.Errorf("%s owned by %d:%d, want %d:%d", e.Name(), uid, gid, want.Uid, want.Gid)
		}
	}
	if watched.Load() == 0 {
		t.Error("the watchers never looked")
	}
}

// BenchmarkRun is the cost of acting as a user once: lock the thread,
// switch groups, fsgid, fsuid (and capabilities), and back. "capset" is a
// server holding capabilities beyond the systemd unit's (as root started
// by hand), "unit" one that does not.
func BenchmarkRun(b *testing.B) {
	needPerUser(b)
	fn := func() error { return nil }
	for _, caps := range []bool{true, false} {
		b.Run(map[bool]string{true: "capset", false: "unit"}[caps], func(b *testing.B) {
			c := newCred(acctA)
			c.dropCaps = caps
			for b.Loop() {
				if err := c.run(fn); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGetAttr is one GETATTR on the share, as the server's own
// account (as before per-user identity) and as a user.
func BenchmarkGetAttr(b *testing.B) {
	needPerUser(b)
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		acct Account
		id   bool
	}{{"server", Account{}, false}, {"user", acctA, true}} {
		b.Run(tc.name, func(b *testing.B) {
			sh, err := Open(Config{Name: "s", Path: dir, AllowRoot: true}, false)
			if err != nil {
				b.Fatal(err)
			}
			defer sh.Close()
			tr, err := sh.Connect(Identity{User: "u", Account: tc.acct})
			if err != nil {
				b.Fatal(err)
			}
			if !tc.id {
				tr.acct.Store(&accountEntry{expires: farFuture}) // no credential switch at all
			}
			for b.Loop() {
				if _, err := tr.GetAttr("f"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestRunLeavesCallerThread: an operation for a user never changes the
// credentials of the thread that asked for it — while it runs, that
// thread still has the server's fsuid, and afterwards the caller's thread
// is not one that ever acted for a user. A thread whose credentials were
// changed and changed back is refused by the RDMA verbs device's write(2)
// (Soft-RoCE's post path: EACCES), so the engine's threads must never be
// one (identity_linux.go).
func TestRunLeavesCallerThread(t *testing.T) {
	needPerUser(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	caller := unix.Gettid()
	status := fmt.Sprintf("/proc/self/task/%d/status", caller)
	fsuidOf := func(path string) (uint32, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, _ := strings.Cut(line, ":"); k == "Uid" {
				f := strings.Fields(v)
				n, err := strconv.ParseUint(f[len(f)-1], 10, 32)
				return uint32(n), err
			}
		}
		return 0, fmt.Errorf("%s: no Uid line", path)
	}
	before, err := fsuidOf(status)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		acct := acctA
		if i%2 == 1 {
			acct = acctB
		}
		var during uint32
		var ran int
		err := newCred(acct).run(func() error {
			ran = unix.Gettid()
			var err error
			during, err = fsuidOf(status)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if ran == caller || during != before {
			t.Fatalf("operation %d ran on thread %d (caller %d); the caller's fsuid during it %d, want %d",
				i, ran, caller, during, before)
		}
	}
	if n := RestoreFailures(); n != 0 {
		t.Errorf("RestoreFailures = %d", n)
	}
}

// TestRunPanicReachesCaller: a panic in an operation is raised again on
// the caller's goroutine, and the identity thread goes on serving.
func TestRunPanicReachesCaller(t *testing.T) {
	needPerUser(t)
	c := newCred(acctA)
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want boom", v)
			}
		}()
		c.run(func() error { panic("boom") })
	}()
	if err := c.run(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	// The panic left the thread's credentials as they were: nothing to
	// restore, so no restore failure counted (a bug's alarm otherwise).
	if n := restoreFailures.Load(); n != 0 {
		t.Errorf("RestoreFailures = %d after a panic in fn, want 0", n)
	}
}

// TestRunInPlaceUnsortedGroups: an account's groups come in its own order
// (the primary group first, then /etc/group's), the kernel keeps them
// sorted; Tree.Run's in-place check must still recognise its thread —
// one hand-off for the whole Run whatever the order.
func TestRunInPlaceUnsortedGroups(t *testing.T) {
	needPerUser(t)
	uringOff.Store(true) // the write counts as a hand-off too
	t.Cleanup(func() { uringOff.Store(false) })
	dir := sharedDir(t)
	for i, groups := range [][]uint32{{acctA.Gid, acctB.Gid}, {acctB.Gid, acctA.Gid}} {
		acct := acctA
		acct.Groups = groups
		a := connectAs(t, dir, acct, Config{})
		before := handoffs.Load()
		err := a.Run(func() error {
			if _, err := a.Mkdir(fmt.Sprintf("d%d", i), 0o755); err != nil {
				return err
			}
			return createAndWrite(a, fmt.Sprintf("f%d", i))
		})
		if err != nil {
			t.Fatal(err)
		}
		if n := handoffs.Load() - before; n != 1 {
			t.Errorf("groups %v: %d hand-offs for one Run, want 1", groups, n)
		}
	}
}

// TestRunNested: the tree operations inside Tree.Run run on Run's identity
// thread (one hand-off in all) with the tree's credentials; an operation
// of another account's tree inside it is handed to a thread of that
// account's; one of a tree with the server's credentials runs as the
// server; and while a Run is in progress, goroutines that are not inside
// it still hand every operation off, their files owned by the right
// account (a goroutine that took itself for Run's thread would create
// root's).
func TestRunNested(t *testing.T) {
	needPerUser(t)
	uringOff.Store(true) // writes count as hand-offs too
	t.Cleanup(func() { uringOff.Store(false) })
	dir := sharedDir(t)
	a := connectAs(t, dir, acctA, Config{})
	b := connectAs(t, dir, acctB, Config{})
	srv := connectAs(t, dir, Account{Name: "srv", Uid: self.uid, Gid: self.gid, Groups: self.groups}, Config{AllowRoot: true})
	before := handoffs.Load()
	var inside threadIDs
	err := a.Run(func() error {
		var err error
		if inside, err = readThreadIDs(); err != nil {
			return err
		}
		f, _, err := a.Open("a-file", os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte("a"), 0); err != nil {
			return err
		}
		if _, err := a.Mkdir("a-dir", 0o755); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := handoffs.Load() - before; n != 1 {
		t.Errorf("Run with an open, a write and a mkdir inside made %d hand-offs, want 1", n)
	}
	if inside.fsuid != acctA.Uid || inside.fsgid != acctA.Gid {
		t.Errorf("inside Run the thread has fsuid %d fsgid %d, want %d %d", inside.fsuid, inside.fsgid, acctA.Uid, acctA.Gid)
	}
	before = handoffs.Load()
	err = a.Run(func() error {
		if _, err := b.Mkdir("b-dir", 0o755); err != nil {
			return err
		}
		_, err := srv.Mkdir("srv-dir", 0o755)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := handoffs.Load() - before; n != 2 {
		t.Errorf("Run with another account's mkdir inside made %d hand-offs, want 2", n)
	}
	want := map[string]Account{"a-file": acctA, "a-dir": acctA, "b-dir": acctB, "srv-dir": {Uid: self.uid, Gid: self.gid}}
	for name, acct := range want {
		if uid, gid := owner(t, filepath.Join(dir, name)); uid != acct.Uid || gid != acct.Gid {
			t.Errorf("%s owned by %d:%d, want %d:%d", name, uid, gid, acct.Uid, acct.Gid)
		}
	}

	// A Run that stays in progress, on a thread in a's credentials, while
	// plain goroutines make a's and b's operations.
	hold, held := make(chan struct{}), make(chan struct{})
	go a.Run(func() error { close(held); <-hold; return nil })
	<-held
	var wg sync.WaitGroup
	for _, tr := range []*Tree{a, b} {
		for w := range 4 {
			wg.Go(func() {
				for i := range 30 {
					name := fmt.Sprintf("%s-%d-%d", tr.id.User, w, i)
					if _, err := tr.Mkdir(name, 0o755); err != nil {
						t.Errorf("%s: %v", name, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(hold)
	for _, acct := range []Account{acctA, acctB} {
		for w := range 4 {
			for i := range 30 {
				name := fmt.Sprintf("%s-%d-%d", acct.Name, w, i)
				if uid, gid := owner(t, filepath.Join(dir, name)); uid != acct.Uid || gid != acct.Gid {
					t.Errorf("%s, made outside the Run in progress, owned by %d:%d, want %d:%d", name, uid, gid, acct.Uid, acct.Gid)
				}
			}
		}
	}
}
