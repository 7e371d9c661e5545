package share

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fanotifyMarks counts the inode marks of the share's fanotify group, from
// its descriptor's fdinfo ("fanotify ino:… mflags:…" lines).
func fanotifyMarks(t *testing.T, sh *Share) int {
	t.Helper()
	rc, err := sh.leases.w.f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info []byte
	rc.Control(func(fd uintptr) {
		info, err = os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(info), "fanotify ino:")
}

// TestUnmarkAsTheServer: the last user of a watched directory to go may be
// one who can search it but not read it (0711); fanotify refuses that user
// the mark's removal (it wants read permission on the object), so the
// server removes it with its own credentials — else the kernel's mark
// stays, watching a directory nobody holds anything in, and counting
// against fs.fanotify.max_user_marks, until the share closes.
func TestUnmarkAsTheServer(t *testing.T) {
	needPerUser(t)
	dir := sharedDir(t)
	priv := filepath.Join(dir, "private")
	if err := os.Mkdir(priv, 0o711); err != nil {
		t.Fatal(err)
	}
	os.Chmod(priv, 0o711)
	if err := os.WriteFile(filepath.Join(priv, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	sh := leasingShare(t, dir)
	root, a := leasingTree(t, sh, Identity{User: "admin"}), leasingTree(t, sh, Identity{User: acctA.Name, Account: acctA})
	if n := fanotifyMarks(t, sh); n != 0 {
		t.Fatalf("%d marks before any lease", n)
	}
	// The server's own account leases the directory (the server marks
	// it); a opens a file in it with a lease, under that mark.
	at := mustLease(t, root, "private", LeaseRead, LeaseRead)
	f, _, _, err := a.OpenLease("private/f", unix.O_RDONLY, 0, LeaseRead)
	if err != nil {
		t.Fatal(err)
	}
	if n := fanotifyMarks(t, sh); n == 0 {
		t.Fatal("no mark with a directory leased")
	}
	// root gives its lease up first: a's open file still needs the mark.
	root.ReleaseLeases([]uint64{at.Ino})
	if n := fanotifyMarks(t, sh); n == 0 {
		t.Fatal("the mark went while a's file in the directory is open")
	}
	// a goes last, on its own identity: the directory's mark must go.
	a.ReleaseLeases([]uint64{leaseIno(t, filepath.Join(priv, "f"))})
	a.as(func() error { return f.Close() }) // as a CLOSE in a request run whole as a (Tree.Run)
	a.Disconnect()
	root.Disconnect()
	if n := fanotifyMarks(t, sh); n != 0 {
		t.Errorf("%d fanotify mark(s) left with no lease and no open file", n)
	}
}

func leaseIno(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
