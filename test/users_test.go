package test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// sharedMount is a server whose share belongs to account acct, mounted
// with acct's credentials by root with allow_other and opts.
func sharedMount(t *testing.T, acct *localUser, opts ...string) (*Server, *Mount) {
	t.Helper()
	share := t.TempDir()
	if err := os.Chown(share, int(acct.uid), int(acct.gid)); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, ServerConfig{Shares: map[string]string{"share": share}, Args: serverConfig(t, acct)})
	m := mountShare(t, s, MountConfig{User: acct.name, Password: acct.password, Options: append([]string{"allow_other"}, opts...)})
	reachable(t, m.Dir)
	return s, m
}

// testTree writes a small source tree (nested directories, modes, a
// symlink, a Makefile) under dir and returns a tarball of it in dir.
func testTree(t *testing.T, dir string) (src, tarball string) {
	t.Helper()
	src = filepath.Join(dir, "src")
	files := map[string]string{
		"README":             "a tree to unpack\n",
		"lib/util.c":         "int twice(int x) { return 2 * x; }\n",
		"lib/util.h":         "int twice(int x);\n",
		"cmd/main.c":         "#include <stdio.h>\n#include \"../lib/util.h\"\nint main(void) { printf(\"%d\\n\", twice(21)); return 0; }\n",
		"Makefile":           "hello: cmd/main.c lib/util.c\n\tcc -o hello cmd/main.c lib/util.c\n",
		"deep/a/b/c/d/e.txt": strings.Repeat("deep ", 1000),
	}
	for name, content := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, p, []byte(content))
	}
	if err := os.Chmod(filepath.Join(src, "lib"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "lib/util.h"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("lib/util.h", filepath.Join(src, "util.h")); err != nil {
		t.Fatal(err)
	}
	tarball = filepath.Join(dir, "tree.tar")
	runCmd(t, dir, nil, "tar", "-cf", tarball, "-C", src, ".")
	return src, tarball
}

// TestAllowOther: on a mount made by root with allow_other and one
// credential (server account acct), an ordinary local user works as the
// mounting user would — create, chmod, utimes, chown to self, mkdir then
// create inside, rename, tar -x, git clone, a build — and everything lands
// on the server's disk owned by acct; files of the account show as the
// mounting user (root), or as uid=/gid=.
func TestAllowOther(t *testing.T) {
	needAccounts(t)
	needTool(t, "tar")
	needTool(t, "git")
	needTool(t, "cc")
	needTool(t, "make")
	acct := newLocalUser(t) // the server account the mount logs on as
	u := newLocalUser(t)    // a local user of the mount, not the one who mounted it
	_, m := sharedMount(t, acct)

	work := testutil.PublicDir(t, "lwiofs-users-")
	src, tarball := testTree(t, work)
	repo := filepath.Join(work, "repo")
	runCmd(t, work, gitEnv(t), "git", "init", "-q", "-b", "main", repo)
	mustWrite(t, filepath.Join(repo, "f.txt"), []byte("committed\n"))
	runCmd(t, repo, gitEnv(t), "git", "add", ".")
	runCmd(t, repo, gitEnv(t), "git", "commit", "-q", "-m", "one")
	runCmd(t, work, nil, "chown", "-R", u.name, repo) // git refuses to read a repository of another user

	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	mustShAs(t, u, m.Dir, fmt.Sprintf(`
echo hi > mine.txt
chmod 600 mine.txt
test "$(stat -c %%a mine.txt)" = 600
touch -m -d @%d mine.txt
test "$(stat -c %%Y mine.txt)" = %d
touch -a mine.txt
chown %s mine.txt
chgrp %s mine.txt
test -w mine.txt
mkdir d1
touch d1/x
echo more >> d1/x
cd d1 && cd ..
mv mine.txt d1/renamed.txt
mkdir -m 700 private && echo p > private/p && cd private && cd ..
mkdir tx
tar -xf %s -C tx
git clone -q %s clone
cd clone && echo change >> f.txt && git commit -q -am two && git log --oneline | wc -l | grep -qx 2
cd ../tx && make -s hello && ./hello | grep -qx 42
`, mtime.Unix(), mtime.Unix(), u.name, u.name, tarball, repo))

	t.Run("POSIXAsUser", func(t *testing.T) {
		dir := filepath.Join(m.Dir, "posix")
		mustShAs(t, u, m.Dir, "mkdir posix")
		posixAs(t, u, dir)
	})

	// On the server's disk: everything the user made belongs to acct.
	for _, p := range []string{"d1", "d1/x", "d1/renamed.txt", "private", "tx", "tx/lib/util.h", "tx/hello", "clone/f.txt"} {
		if uid, gid := ownerOnDisk(t, filepath.Join(m.Backing, p)); uid != acct.uid || gid != acct.gid {
			t.Errorf("%s on the server's disk is owned by %d:%d, want the account %s %d:%d", p, uid, gid, acct.name, acct.uid, acct.gid)
		}
	}
	st, err := os.Stat(filepath.Join(m.Backing, "d1/renamed.txt"))
	if err != nil || st.Mode().Perm() != 0o600 || !st.ModTime().Equal(mtime) {
		t.Errorf("d1/renamed.txt on the server's disk: %v %v, want mode 0600 and mtime %v", st.Mode(), err, mtime)
	}
	runCmd(t, work, nil, "diff", "-r", "--no-dereference", src, filepath.Join(m.Backing, "tx"), "-x", "hello")
	if st, err := os.Stat(filepath.Join(m.Backing, "tx/lib")); err != nil || st.Mode().Perm() != 0o750 {
		t.Errorf("tar -x kept tx/lib's mode? %v %v", st.Mode(), err)
	}
	// On the mount: the account's files show as the mounting user.
	wantOwner(t, filepath.Join(m.Dir, "d1/x"), 0, 0)

	t.Run("UidGidOptions", func(t *testing.T) {
		// uid=/gid= show the account's files as another local user; other
		// owners keep their server ids.
		_, m2 := sharedMount(t, acct, "uid="+u.name, "gid="+strconv.Itoa(int(u.gid)))
		mustShAs(t, u, m2.Dir, "echo x > f && mkdir d")
		wantOwner(t, filepath.Join(m2.Dir, "f"), u.uid, u.gid)
		mustWrite(t, filepath.Join(m2.Backing, "other"), []byte("x"))
		if err := os.Chown(filepath.Join(m2.Backing, "other"), 4321, 4321); err != nil {
			t.Fatal(err)
		}
		wantOwner(t, filepath.Join(m2.Dir, "other"), 4321, 4321)
	})

	t.Run("IDMapNone", func(t *testing.T) {
		_, m3 := sharedMount(t, acct, "idmap=none")
		mustShAs(t, u, m3.Dir, "echo x > f")
		wantOwner(t, filepath.Join(m3.Dir, "f"), acct.uid, acct.gid)
	})
}

// wantOwner checks the owner p shows on the mount.
func wantOwner(t *testing.T, p string, uid, gid uint32) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != uid || st.Gid != gid {
		t.Errorf("%s shows as owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, uid, gid)
	}
}

// TestFIFOAndSocket: a FIFO and a UNIX-domain socket can be made on the
// mount and work between two processes of this host (the kernel serves
// them locally, as on NFS); the server holds only the nodes. A device node
// is refused with EPERM, never EOPNOTSUPP.
func TestFIFOAndSocket(t *testing.T) {
	needAccounts(t)
	acct, u := newLocalUser(t), newLocalUser(t)
	_, m := sharedMount(t, acct)
	// As a local user other than the one who mounted, with the shell's tools.
	mustShAs(t, u, m.Dir, `
mkfifo -m 600 ufifo
(cat ufifo > got &) ; echo hello > ufifo
for i in 1 2 3 4 5 6 7 8 9 10; do test -s got && break; sleep 0.2; done
grep -qx hello got
test -p ufifo
rm ufifo got
`)
	fifo := filepath.Join(m.Dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o640); err != nil {
		t.Fatalf("mkfifo on the mount: %v", err)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := os.ReadFile(fifo) // opens for reading: blocks until a writer comes
		got <- b
	}()
	if err := os.WriteFile(fifo, []byte("through the pipe"), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if string(b) != "through the pipe" {
			t.Errorf("read from the FIFO: %q", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the FIFO's reader never got the data")
	}

	sock := filepath.Join(m.Dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("bind a UNIX-domain socket on the mount: %v", err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Write([]byte("hello over the socket"))
			c.Close()
		}
	}()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("connect to the socket on the mount: %v", err)
	}
	var buf bytes.Buffer
	buf.ReadFrom(c)
	c.Close()
	if buf.String() != "hello over the socket" {
		t.Errorf("read from the socket: %q", buf.String())
	}

	for name, typ := range map[string]uint32{"fifo": syscall.S_IFIFO, "sock": syscall.S_IFSOCK} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(m.Backing, name), &st); err != nil || st.Mode&syscall.S_IFMT != typ {
			t.Errorf("%s on the server's disk: mode %o %v, want type %o", name, st.Mode, err, typ)
		}
	}
	if st, err := os.Stat(fifo); err != nil || st.Mode()&os.ModeNamedPipe == 0 || st.Mode().Perm() != 0o640 {
		t.Errorf("the FIFO on the mount: %v %v", st.Mode(), err)
	}

	err = unix.Mknod(filepath.Join(m.Dir, "null"), syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	if !errors.Is(err, syscall.EPERM) {
		t.Errorf("mknod of a character device: %v, want EPERM", err)
	}
	if _, err := os.Lstat(filepath.Join(m.Backing, "null")); !os.IsNotExist(err) {
		t.Errorf("a refused device node exists on the server's disk: %v", err)
	}
	if err := os.Remove(sock); err != nil {
		t.Errorf("rm of the socket: %v", err)
	}
}

// TestMultiUser: a multiuser mount (made by root, whose own session logs
// on as account mnt) gives each local user a session with their own
// credentials from credentials_dir: files a and b create are owned on the
// server's disk by their two accounts and show on the mount as theirs; each
// is refused the other's 0600 file; a user without credentials gets
// EACCES, as does one whose file others can read (with a log line); `lwio
// login` adds credentials to the running mount; idle sessions close.
func TestMultiUser(t *testing.T) {
	needAccounts(t)
	mnt, a, b, c, d := newLocalUser(t), newLocalUser(t), newLocalUser(t), newLocalUser(t), newLocalUser(t)
	share := t.TempDir()
	if err := os.Chmod(share, 0o1777); err != nil {
		t.Fatal(err)
	}
	creds := testutil.PublicDir(t, "lwiofs-users-")
	credentialsFile(t, filepath.Join(creds, a.name), a, a, 0o600)
	credentialsFile(t, filepath.Join(creds, b.name), b, b, 0o600)
	credentialsFile(t, filepath.Join(creds, c.name), c, c, 0o644) // readable by others: refused
	s := startServer(t, ServerConfig{Shares: map[string]string{"share": share}, Args: serverConfig(t, mnt, a, b, c, d)})
	m := mountShare(t, s, MountConfig{User: mnt.name, Password: mnt.password, Options: []string{"allow_other",
		"multiuser", "credentials_dir=" + creds, "idle_timeout=2"}})
	reachable(t, m.Dir)

	for _, u := range []*localUser{a, b} {
		mustShAs(t, u, m.Dir, fmt.Sprintf(`
echo "%s's secret" > %s.txt
chmod 600 %s.txt
mkdir %s.d && echo x > %s.d/inside
test "$(stat -c %%u %s.txt)" = %d
`, u.name, u.name, u.name, u.name, u.name, u.name, u.uid))
	}
	for _, u := range []*localUser{a, b} {
		for _, p := range []string{u.name + ".txt", u.name + ".d", u.name + ".d/inside"} {
			if uid, gid := ownerOnDisk(t, filepath.Join(share, p)); uid != u.uid || gid != u.gid {
				t.Errorf("%s on the server's disk is owned by %d:%d, want %s's account %d:%d", p, uid, gid, u.name, u.uid, u.gid)
			}
		}
		wantOwner(t, filepath.Join(m.Dir, u.name+".txt"), u.uid, u.gid)
	}
	for _, pair := range [][2]*localUser{{a, b}, {b, a}} {
		u, other := pair[0], pair[1]
		out, err := shAs(u, m.Dir, "cat "+other.name+".txt")
		if err == nil || !strings.Contains(out, "Permission denied") || strings.Contains(out, "secret") {
			t.Errorf("%s reads %s's 0600 file: %v\n%s", u.name, other.name, err, out)
		}
	}
	mustShAs(t, a, m.Dir, "cat "+a.name+".txt | grep -q secret")

	// No credentials, or credentials others can read: EACCES.
	for _, u := range []*localUser{c, d} {
		out, err := shAs(u, m.Dir, "ls >/dev/null; touch "+u.name+".txt")
		if err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("%s (no usable credentials) on the mount: %v\n%s", u.name, err, out)
		}
	}
	if _, err := os.Stat(filepath.Join(share, c.name+".txt")); !os.IsNotExist(err) {
		t.Errorf("a user without credentials created a file: %v", err)
	}
	if !strings.Contains(m.p.out.String(), "chmod 600 "+filepath.Join(creds, c.name)) {
		t.Errorf("no log line refusing %s's credentials file (mode 0644):\n%s", c.name, m.p.out)
	}

	// lwio login: d adds their own credentials to the running mount.
	lwio := filepath.Join(testutil.PublicDir(t, "lwiofs-users-"), "lwio")
	if err := copyFile(lwio, binaries.mount); err != nil || os.Chmod(lwio, 0o755) != nil {
		t.Fatalf("a copy of lwio-mount others may run: %v", err)
	}
	login := asUser(d, d.home, []string{"LWIO_PASSWORD=" + d.password}, lwio, "login", s.URL("share"))
	if out, err := login.CombinedOutput(); err != nil {
		t.Fatalf("lwio login as %s: %v\n%s", d.name, err, out)
	}
	mustShAs(t, d, m.Dir, "echo d > "+d.name+".txt")
	if uid, _ := ownerOnDisk(t, filepath.Join(share, d.name+".txt")); uid != d.uid {
		t.Errorf("after lwio login, %s's file is owned by %d on the server's disk, want %d", d.name, uid, d.uid)
	}
	bad := asUser(c, c.home, []string{"LWIO_PASSWORD=wrong"}, lwio, "login", m.Dir)
	if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), "wrong user name or password") {
		t.Errorf("lwio login with a wrong password: %v\n%s", err, out)
	}

	t.Run("LocksAndAppends", func(t *testing.T) {
		// a's flock and b's meet on the server, each through their own
		// session; appends of both land whole at the end.
		needTool(t, "flock")
		mustShAs(t, a, m.Dir, "umask 0; : > shared.lock; : > shared.log; chmod 666 shared.lock shared.log")
		holder := asUser(a, m.Dir, nil, "flock", "-x", "shared.lock", "sh", "-c", "touch held; sleep 60")
		holder.SysProcAttr.Setpgid = true
		if err := holder.Start(); err != nil {
			t.Fatal(err)
		}
		stopped := false
		stop := func() {
			if !stopped {
				stopped = true
				syscall.Kill(-holder.Process.Pid, syscall.SIGKILL)
				holder.Wait()
			}
		}
		defer stop()
		deadline := time.Now().Add(20 * time.Second)
		for _, err := os.Stat(filepath.Join(share, "held")); err != nil; _, err = os.Stat(filepath.Join(share, "held")) {
			if time.Now().After(deadline) {
				t.Fatalf("%s's flock holder never started: %v", a.name, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if out, err := shAs(b, m.Dir, "flock -n shared.lock true"); err == nil {
			t.Errorf("%s took a lock %s holds:\n%s", b.name, a.name, out)
		}
		stop()
		mustShAs(t, b, m.Dir, "flock -w 20 shared.lock true") // released with a's last close
		for _, u := range []*localUser{a, b, a} {
			mustShAs(t, u, m.Dir, "echo line-"+u.name+" >> shared.log")
		}
		want := "line-" + a.name + "\nline-" + b.name + "\nline-" + a.name + "\n"
		if got, err := os.ReadFile(filepath.Join(share, "shared.log")); err != nil || string(got) != want {
			t.Errorf("shared.log on the server's disk: %q %v, want %q", got, err, want)
		}
	})

	t.Run("POSIXAsUser", func(t *testing.T) {
		mustShAs(t, a, m.Dir, "mkdir posix-"+a.name)
		posixAs(t, a, filepath.Join(m.Dir, "posix-"+a.name))
	})

	// Idle sessions close (idle_timeout=2), and the next use logs on again.
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(m.p.out.String(), "idle session closed") {
		if time.Now().After(deadline) {
			t.Fatalf("no idle session closed within 20s of idle_timeout=2:\n%s", m.p.out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	mustShAs(t, b, m.Dir, "cat "+b.name+".txt | grep -q secret")
}
