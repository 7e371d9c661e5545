package test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// localUser is a local account a test made with useradd: a person using a
// mount on this host, a server account on the server (the test's server
// runs on this host and reads the same passwd database), or both.
type localUser struct {
	name     string
	uid, gid uint32
	password string // its password on the lwio server, when it has one
	home     string // a HOME it owns, for git and friends
}

// needAccounts skips unless the test can make local accounts: root and
// useradd/userdel (scripts/deps.sh has them on every Debian).
func needAccounts(t *testing.T) {
	t.Helper()
	needLWIO(t)
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root to create local accounts (useradd) and to run programs as them")
	}
	needTool(t, "useradd")
	needTool(t, "userdel")
}

// newLocalUser creates a local account (and its own group), removed when
// the test ends. The name is random, so parallel runs never collide.
func newLocalUser(t *testing.T) *localUser {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	name := "lwt" + hex.EncodeToString(b[:])
	var out []byte
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		// Another test creating accounts holds the passwd lock: retry.
		out, err = exec.Command("useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin",
			"--comment", "lwiofs test account", name).CombinedOutput()
		if err == nil || !bytes.Contains(out, []byte("lock")) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		for attempt := 0; attempt < 20; attempt++ {
			out, err := exec.Command("userdel", name).CombinedOutput()
			if err == nil || !bytes.Contains(out, []byte("lock")) {
				if err != nil {
					t.Errorf("userdel %s: %v\n%s", name, err, out)
				}
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	lu := &localUser{name: name, uid: uint32(uid), gid: uint32(gid), password: "pw-" + name}
	lu.home = filepath.Join(testutil.PublicDir(t, "lwiofs-users-"), "home-"+name)
	if err := os.Mkdir(lu.home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(lu.home, int(lu.uid), int(lu.gid)); err != nil {
		t.Fatal(err)
	}
	return lu
}

// reachable makes the mountpoint or directory dir, made under a
// t.TempDir(), reachable by every local user.
func reachable(t *testing.T, dir string) {
	t.Helper()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
}

// serverConfig is the server flags that load a configuration
// (usersConfig) naming users and their passwords.
func serverConfig(t *testing.T, users ...*localUser) []string {
	t.Helper()
	accts := make([]localAccount, len(users))
	for i, u := range users {
		accts[i] = *u
	}
	return []string{"-config", usersConfig(t, accts, "")}
}

// credentialsFile writes u's credentials file (mount.cifs format) at p,
// owned by owner (nil: root) with mode perm.
func credentialsFile(t *testing.T, p string, u *localUser, owner *localUser, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte("username="+u.name+"\npassword="+u.password+"\n"), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, perm); err != nil {
		t.Fatal(err)
	}
	if owner != nil {
		if err := os.Chown(p, int(owner.uid), int(owner.gid)); err != nil {
			t.Fatal(err)
		}
	}
}

// asUser is a command run as local user u (its uid, its group, no
// supplementary groups), with HOME its own and a quiet git.
func asUser(u *localUser, dir string, env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=" + u.home, "USER=" + u.name,
		"LC_ALL=C", "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=e2e", "GIT_AUTHOR_EMAIL=e2e@example.org",
		"GIT_COMMITTER_NAME=e2e", "GIT_COMMITTER_EMAIL=e2e@example.org"}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: []uint32{}}}
	return cmd
}

// shAs runs a shell script (set -e) as u in dir and returns its output;
// ok is false, with the output, when it fails.
func shAs(u *localUser, dir, script string, env ...string) (string, error) {
	cmd := asUser(u, dir, env, "/bin/sh", "-ec", script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		return "", err
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(5 * time.Minute):
		cmd.Process.Kill()
		<-done
		return out.String(), fmt.Errorf("still running after 5 minutes; killed")
	}
}

// mustShAs is shAs that fails the test.
func mustShAs(t *testing.T, u *localUser, dir, script string, env ...string) string {
	t.Helper()
	out, err := shAs(u, dir, script, env...)
	if err != nil {
		t.Fatalf("as %s (uid %d): %v\nscript:\n%s\noutput:\n%s", u.name, u.uid, err, script, tail(out, 8<<10))
	}
	return out
}

// testBinaryFor copies this test binary where u can run it, to run
// TestPOSIXAt as u.
func testBinaryFor(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(testutil.PublicDir(t, "lwiofs-users-"), "e2e.test")
	if err := copyFile(dst, self); err != nil || os.Chmod(dst, 0o755) != nil {
		t.Fatalf("a copy of the test binary others may run: %v", err)
	}
	return dst
}

// posixAs runs the POSIX suite as u in dir (on a mount), in a copy of this
// test binary run with u's credentials.
func posixAs(t *testing.T, u *localUser, dir string) {
	t.Helper()
	bin := testBinaryFor(t)
	cmd := asUser(u, u.home, []string{posixDirEnv + "=" + dir}, bin, "-test.run", "^TestPOSIXAt$", "-test.v", "-test.timeout", "10m")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestPOSIXAt")) {
		t.Fatalf("the POSIX suite as %s (uid %d) in %s: %v\n%s", u.name, u.uid, dir, err, tail(string(out), 16<<10))
	}
	t.Logf("POSIX suite as uid %d: %d checks passed", u.uid, bytes.Count(out, []byte("    --- PASS: TestPOSIXAt/")))
}
