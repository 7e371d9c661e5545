package test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDurableReopenActsAsUser: the server is killed and restarted under
// two local accounts' mounts, and the files they had open are re-opened
// by identity (REOPEN) as the user who opened them, not as the server: a
// file given to the other account while the server was down is no longer
// a's to read through the descriptor it kept (re-opened as the server, it
// would be); a's own file is, and a lock (its description opened as a) and
// a write through it work and leave the file a's.
func TestDurableReopenActsAsUser(t *testing.T) {
	needLWIO(t)
	accts := localAccounts(t, 2)
	a, b := accts[0], accts[1]
	dir := openShareDir(t)
	// Made on the server's disk, a's and unread through the mount: what
	// the descriptors read after the restart comes from the server.
	for _, name := range []string{"a-keep", "a-given"} {
		p := filepath.Join(dir, name)
		mustWrite(t, p, []byte(name+" data"))
		if err := os.Chown(p, int(a.uid), int(a.gid)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf := usersConfig(t, accts, "")
	s := startServer(t, ServerConfig{Shares: map[string]string{"share": dir}, Args: []string{"-config", conf}})
	ma := mountShare(t, s, MountConfig{User: a.name, Password: a.password})
	keep, given := openRW(t, ma.Dir, "a-keep"), openRW(t, ma.Dir, "a-given")

	_ = s.p.cmd.Process.Kill()
	<-s.p.done
	// While the server is down a-given becomes b's (still 0600).
	if err := os.Chown(filepath.Join(dir, "a-given"), int(b.uid), int(b.gid)); err != nil {
		t.Fatal(err)
	}
	s.restart(t)

	within(t, time.Minute, "a's own file after the restart", func() error {
		if got, err := readStart(keep); err != nil || got != "a-keep data" {
			return fmt.Errorf("descriptor opened before the crash: %q %v", got, err)
		}
		return nil
	})
	got, err := readStart(given)
	if err == nil || got != "" {
		t.Errorf("a's descriptor of the file given to b while the server was down read %q (%v): re-opened as the server, not as a", got, err)
	} else if !errors.Is(err, syscall.EACCES) {
		t.Errorf("a's descriptor of b's 0600 file: %v, want EACCES", err)
	}

	// A lock through the re-opened handle (its owner's description is
	// opened as a), then a write through it.
	fl := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 1}
	if err := unix.FcntlFlock(keep.Fd(), unix.F_OFD_SETLK, &fl); err != nil {
		t.Errorf("lock through the re-opened descriptor: %v", err)
	}
	if _, err := keep.WriteAt([]byte("A"), 0); err != nil {
		t.Fatal(err)
	}
	if err := keep.Sync(); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "a-keep"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != a.uid || st.Gid != a.gid {
		t.Errorf("a-keep on the server's disk after a's write through the re-opened descriptor: owner %d:%d, want a's %d:%d", st.Uid, st.Gid, a.uid, a.gid)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a-keep")); string(b) != "A-keep data" {
		t.Errorf("a-keep holds %q", b)
	}
}
