package share

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

// nonRootEnv names the share directory to the child of
// TestNonRootServerDropsFileCaps; set, the test runs as that child.
const nonRootEnv = "LWIOFS_TEST_NONROOT_SHARE"

// nonRootUid is the child's uid (nobody's on Debian): a server that is not
// root but was given what per-user identity needs — a systemd unit with
// User= and AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_DAC_OVERRIDE …
const nonRootUid = 65534

// TestNonRootServerDropsFileCaps: a server that is not root but has the
// file capabilities (ambient, say) acts for a user without them. The
// kernel drops them from a thread only when its fsuid leaves 0; a fsuid
// going from the server's uid to the user's keeps CAP_DAC_OVERRIDE and
// the rest, so the server must drop them itself (capset) — else any user
// reads root's 0600 files. The server's own uid, connecting as a user,
// must not keep them either. The test runs itself again as uid 65534 with
// the unit's capabilities ambient.
func TestNonRootServerDropsFileCaps(t *testing.T) {
	if dir := os.Getenv(nonRootEnv); dir != "" {
		nonRootChild(t, dir)
		return
	}
	needPerUser(t)
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root to start a non-root child with capabilities")
	}
	dir := sharedDir(t)
	for _, name := range []string{"secret", "nobody-only"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("root's"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The test binary, where uid 65534 may run it (go test's own
	// directory is 0700).
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(sharedDir(t), "share.test")
	copyFile(t, exe, bin)
	runChild(t, "the non-root server", nonRootEnv+"="+dir, &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: nonRootUid, Gid: nonRootUid, Groups: []uint32{}},
		AmbientCaps: []uintptr{unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_DAC_OVERRIDE,
			unix.CAP_DAC_READ_SEARCH, unix.CAP_CHOWN, unix.CAP_FOWNER, unix.CAP_FSETID},
	}, bin)
}

// runChild runs the calling test again in the test binary exe (after the
// args, as in setpriv … exe), with env added and attr, and fails unless
// it passes there.
func runChild(t *testing.T, what, env string, attr *syscall.SysProcAttr, args ...string) {
	t.Helper()
	args = append(args, "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	var out strings.Builder
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = attr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, out.String())
	}
	if !strings.Contains(out.String(), "--- PASS") {
		t.Fatalf("%s did not run the test:\n%s", what, out.String())
	}
}

// nonRootChild is TestNonRootServerDropsFileCaps as the non-root server.
func nonRootChild(t *testing.T, dir string) {
	if !PerUser() || os.Geteuid() != nonRootUid {
		t.Fatalf("the child has uid %d, per-user %v: want uid %d with CAP_SETUID and CAP_SETGID", os.Geteuid(), PerUser(), nonRootUid)
	}
	nobody := Account{Name: "nobody", Uid: nonRootUid, Gid: nonRootUid}
	// A Tree.Run in progress (another session's request) makes every
	// operation ask the kernel whether its thread is in place already: a
	// thread of the server's has nobody's ids, but not its capabilities.
	other := connectAs(t, dir, acctB, Config{})
	release, running := make(chan struct{}), make(chan struct{})
	go other.Run(func() error { close(running); <-release; return nil })
	<-running
	defer close(release)
	for _, acct := range []Account{acctA, nobody} {
		tr := connectAs(t, dir, acct, Config{})
		if err := tr.Run(func() error {
			// Inside its own Run the server's operations still have the
			// server's capabilities (open_by_handle_at wants one).
			if !asServerHasCaps() {
				return errors.New("asServer inside a Run of " + acct.Name + " runs without the server's capabilities")
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		if f, _, err := tr.Open("secret", os.O_RDONLY, 0); !errors.Is(err, protocol.StatusAccessDenied) {
			if err == nil {
				f.Close()
			}
			t.Errorf("%s opens root's 0600 file through a non-root server: %v, want ACCESS_DENIED", acct.Name, err)
		}
		_, err := tr.SetAttr("nobody-only", SetAttrIn{Valid: SetMode, Mode: 0o644})
		if ntstatus.ToErrno(err) != syscall.EPERM {
			t.Errorf("%s chmods root's file through a non-root server: %v, want EPERM", acct.Name, err)
		}
	}
}

// copyFile copies src to dst, mode 0755.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, 0o755); err != nil {
		t.Fatal(err)
	}
}

// asServerHasCaps reports whether asServer runs its function with the
// server's effective capabilities.
func asServerHasCaps() bool {
	var caps [2]unix.CapUserData
	_ = asServer(func() error {
		hdr := capsHeader
		return unix.Capget(&hdr, &caps[0])
	})
	return caps[0].Effective == self.caps[0].Effective && caps[1].Effective == self.caps[1].Effective
}

// noSetuidEnv names the share directory to the child of
// TestRootWithoutSetuidRefusesUsers; set, the test runs as that child.
const noSetuidEnv = "LWIOFS_TEST_NOSETUID_SHARE"

// TestRootWithoutSetuidRefusesUsers: a root server that lost CAP_SETUID
// and CAP_SETGID (a drop-in narrowing the unit's CapabilityBoundingSet)
// cannot act per user; every user would act as the server — as root,
// reading root's 0600 files on a share that does not allow_root. It
// refuses the tree connect there (RootRefused), and serves a share that
// allows root. The test runs itself again under setpriv with those two
// capabilities out of the bounding set.
func TestRootWithoutSetuidRefusesUsers(t *testing.T) {
	if dir := os.Getenv(noSetuidEnv); dir != "" {
		if PerUser() || os.Geteuid() != 0 {
			t.Fatalf("the child has uid %d, per-user %v: want root without CAP_SETUID", os.Geteuid(), PerUser())
		}
		sh, err := Open(Config{Name: "s", Path: dir}, false)
		if err != nil {
			t.Fatal(err)
		}
		defer sh.Close()
		tr, err := sh.Connect(Identity{User: acctA.Name, Account: acctA})
		var refused *RootRefused
		if !errors.As(err, &refused) || !errors.Is(err, protocol.StatusAccessDenied) {
			if err == nil {
				if f, _, err := tr.Open("secret", os.O_RDONLY, 0); err == nil {
					f.Close()
					t.Errorf("%s reads root's 0600 file through a root server that cannot act per user", acctA.Name)
				}
			}
			t.Errorf("tree connect of %s to a share without allow_root on a root server without CAP_SETUID: %v, want RootRefused", acctA.Name, err)
		}
		connectAs(t, dir, acctA, Config{AllowRoot: true})
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("SKIP: needs setpriv (util-linux)")
	}
	dir := sharedDir(t)
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	runChild(t, "the root server without CAP_SETUID", noSetuidEnv+"="+dir, nil,
		setpriv, "--bounding-set=-setuid,-setgid", "--inh-caps=-all", exe)
}
