package test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/smbauth"
)

// localAccount is a Unix account a test created, and the password its
// lwiofs user has (accounts_test.go's localUser).
type localAccount = localUser

// localAccounts creates n Unix accounts with useradd (newLocalUser),
// removed with userdel when the test ends. It needs root and useradd;
// without them the test is skipped, saying why.
func localAccounts(t *testing.T, n int) []localAccount {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: creating the test's Unix accounts (useradd) and acting as them needs root")
	}
	needTool(t, "useradd")
	needTool(t, "userdel")
	var out []localAccount
	for range n {
		out = append(out, *newLocalUser(t))
	}
	return out
}

// usersConfig is a server configuration (mode 0600) with a [users] table
// for each account and the share "share" at dir.
func usersConfig(t *testing.T, accts []localAccount, extra string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(extra)
	for _, a := range accts {
		fmt.Fprintf(&b, "\n[users.%s]\nnt_hash = %q\n", a.name, smbauth.FormatNTHash(smbauth.NTHash(a.password)))
	}
	p := filepath.Join(t.TempDir(), "server.toml")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// openShareDir is a share directory every account may create files in.
// It is sticky, as /tmp is: a user may remove only its own entries.
func openShareDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "share")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil { // whatever the umask
		t.Fatal(err)
	}
	return dir
}

// servedToTwoUsers creates two local accounts, serves dir as "share" with a
// [users] table for both (extra heads the configuration) and mounts it as
// each: two users of one share, each on its own mount.
func servedToTwoUsers(t *testing.T, dir, extra string) (s *Server, a, b localAccount, ma, mb *Mount) {
	t.Helper()
	accts := localAccounts(t, 2)
	a, b = accts[0], accts[1]
	conf := usersConfig(t, accts, extra)
	s = startServer(t, ServerConfig{Shares: map[string]string{"share": dir}, Args: []string{"-config", conf}})
	ma = mountShare(t, s, MountConfig{User: a.name, Password: a.password})
	mb = mountShare(t, s, MountConfig{User: b.name, Password: b.password})
	return s, a, b, ma, mb
}

func ownerOnDisk(t *testing.T, p string) (uint32, uint32) {
	t.Helper()
	st := testutil.Lstat(t, p)
	return st.Uid, st.Gid
}

func wantErrnoE2E(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
}

// TestEveryUserActsAsThemselves: two local accounts mount one share. What
// each creates through its mount — on the session channel and on the
// LWIO data path — is its own on the server's disk; the other cannot read
// its 0600 file; neither can give a file away, leave a set-user-ID bit or
// a file capability on the server's disk, or read root's file; and under
// load from both at once no file is ever owned by the other.
func TestEveryUserActsAsThemselves(t *testing.T) {
	needLWIO(t)
	dir := openShareDir(t)
	mustWrite(t, filepath.Join(dir, "rootonly"), []byte("root's"))
	if err := os.Chmod(filepath.Join(dir, "rootonly"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, a, b, ma, mb := servedToTwoUsers(t, dir, "")

	// Ownership: a file, a directory, a symlink, and a file written over
	// LWIO (past the inline-write threshold).
	mustWrite(t, filepath.Join(ma.Dir, "a-file"), []byte("a's"))
	if err := os.Mkdir(filepath.Join(ma.Dir, "a-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a-file", filepath.Join(ma.Dir, "a-link")); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("b"), 1<<20)
	mustWrite(t, filepath.Join(mb.Dir, "b-big"), big)
	for name, want := range map[string]localAccount{"a-file": a, "a-dir": a, "a-link": a, "b-big": b} {
		if uid, gid := ownerOnDisk(t, filepath.Join(dir, name)); uid != want.uid || gid != want.gid {
			t.Errorf("%s is %d:%d on the server's disk, want %s's %d:%d", name, uid, gid, want.name, want.uid, want.gid)
		}
	}
	if got, err := os.ReadFile(filepath.Join(dir, "b-big")); err != nil || !bytes.Equal(got, big) {
		t.Errorf("b-big on disk: %d bytes, %v", len(got), err)
	}

	// The kernel's checks, as the users.
	secret := filepath.Join(ma.Dir, "a-secret")
	if err := os.WriteFile(secret, []byte("for a only"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := os.ReadFile(filepath.Join(mb.Dir, "a-secret"))
	wantErrnoE2E(t, "b reads a's 0600 file", err, syscall.EACCES)
	_, err = os.ReadFile(filepath.Join(ma.Dir, "rootonly"))
	wantErrnoE2E(t, "a reads root's 0600 file", err, syscall.EACCES)
	wantErrnoE2E(t, "b removes a's directory from the sticky share", os.Remove(filepath.Join(mb.Dir, "a-dir")), syscall.EPERM)
	wantErrnoE2E(t, "a gives its file to uid 4321", os.Chown(secret, 4321, -1), syscall.EPERM)
	wantErrnoE2E(t, "b chmods a's file", os.Chmod(filepath.Join(mb.Dir, "a-secret"), 0o666), syscall.EPERM)

	// Policy, whatever the identity.
	if err := unix.Chmod(filepath.Join(ma.Dir, "a-file"), 0o4755); err != nil {
		t.Errorf("chmod 4755 by the owner: %v", err)
	}
	// security.* is refused by the mount itself, as NFS without labels
	// does (EOPNOTSUPP, which cp -a and tar pass over); the server refuses
	// it too (EPERM) for a client that sends it (test/hostile).
	capability := []byte{1, 0, 0, 2, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	wantErrnoE2E(t, "set security.capability", unix.Setxattr(filepath.Join(ma.Dir, "a-file"), "security.capability", capability, 0), syscall.EOPNOTSUPP)
	wantErrnoE2E(t, "set trusted.x", unix.Setxattr(filepath.Join(ma.Dir, "a-file"), "trusted.x", []byte("x"), 0), syscall.EPERM)
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "a-file"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&07777 != 0o755 {
		t.Errorf("a-file is mode %o on the server's disk after chmod 4755, want 755 (no set-user-ID bit)", st.Mode&07777)
	}
	if n, err := unix.Getxattr(filepath.Join(dir, "a-file"), "security.capability", make([]byte, 64)); err == nil {
		t.Errorf("security.capability reached the server's disk (%d bytes)", n)
	}
	if uid, _ := ownerOnDisk(t, filepath.Join(dir, "a-secret")); uid != a.uid {
		t.Errorf("a-secret is owned by %d after the refused chown, want %d", uid, a.uid)
	}

	// Both users at once, many goroutines each, small files (session
	// channel) and large ones (the LWIO data path).
	const workers, files = 6, 8
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for _, m := range []struct {
		mnt  *Mount
		acct localAccount
	}{{ma, a}, {mb, b}} {
		for w := range workers {
			wg.Go(func() {
				for i := range files {
					data := []byte(m.acct.name)
					if i%2 == 1 {
						data = bytes.Repeat(data, (256<<10)/len(data)+1)
					}
					p := filepath.Join(m.mnt.Dir, fmt.Sprintf("load-%s-%d-%d", m.acct.name, w, i))
					if err := os.WriteFile(p, data, 0o644); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "load-") {
			continue
		}
		seen++
		want := a
		if strings.HasPrefix(e.Name(), "load-"+b.name) {
			want = b
		}
		if uid, gid := ownerOnDisk(t, filepath.Join(dir, e.Name())); uid != want.uid || gid != want.gid {
			t.Errorf("%s is %d:%d, want %s's %d:%d", e.Name(), uid, gid, want.name, want.uid, want.gid)
		}
	}
	if seen != 2*workers*files {
		t.Errorf("%d files written under load, want %d", seen, 2*workers*files)
	}
}

// TestUserOutOfHandles: one user opening files until its limit gets
// EMFILE on its mount; another user meanwhile opens files as usual; once
// the first closes its files it can open again.
func TestUserOutOfHandles(t *testing.T) {
	needLWIO(t)
	dir := openShareDir(t)
	mustWrite(t, filepath.Join(dir, "f"), []byte("x"))
	const limit = 40
	s, _, _, ma, mb := servedToTwoUsers(t, dir, fmt.Sprintf("[limits]\nmax_open_files_per_user = %d\n", limit))

	var held []*os.File
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	var err error
	for range 10 * limit {
		var f *os.File
		if f, err = os.Open(filepath.Join(ma.Dir, "f")); err != nil {
			break
		}
		held = append(held, f)
	}
	if !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("after %d opens on a's mount: %v, want EMFILE", len(held), err)
	}
	if len(held) > limit {
		t.Errorf("a held %d files, more than its limit %d", len(held), limit)
	}
	for i := range limit / 2 {
		f, err := os.Open(filepath.Join(mb.Dir, "f"))
		if err != nil {
			t.Fatalf("b's open %d while a is at its limit: %v", i, err)
		}
		defer f.Close()
	}
	for _, f := range held {
		f.Close()
	}
	held = nil
	// The kernel sends RELEASE after close(2) returns: wait for the
	// server to have the handles back.
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := os.Open(filepath.Join(ma.Dir, "f"))
		if err == nil {
			f.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a still cannot open after closing its files: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(s.p.out.String(), "open refused: handle limit reached") {
		t.Errorf("the server did not log the limit:\n%s", s.p.out)
	}
}

// TestServerNotRoot: a server started as an ordinary account cannot act
// per user: it says so once at start, and every user's files are the
// server account's.
func TestServerNotRoot(t *testing.T) {
	needLWIO(t)
	accts := localAccounts(t, 1)
	srv := accts[0]
	// The test's temporary directories are 0700: let the account reach
	// the programs and the share.
	if err := os.Chmod(binaries.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := openShareDir(t)
	for d := filepath.Dir(dir); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	s := startServer(t, ServerConfig{Shares: map[string]string{"share": dir},
		Cred: &syscall.Credential{Uid: srv.uid, Gid: srv.gid}})
	m := mountShare(t, s, MountConfig{})
	mustWrite(t, filepath.Join(m.Dir, "f"), []byte("written by alice"))
	if uid, gid := ownerOnDisk(t, filepath.Join(dir, "f")); uid != srv.uid || gid != srv.gid {
		t.Errorf("a file alice made through a server run by %s is %d:%d, want the server's %d:%d", srv.name, uid, gid, srv.uid, srv.gid)
	}
	if n := strings.Count(s.p.out.String(), "cannot act per user"); n != 1 {
		t.Errorf("the server said %d times that it cannot act per user, want once:\n%s", n, s.p.out)
	}
}
