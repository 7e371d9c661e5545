package share

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// TestRootAccountRunsInPlace: a root server acting for an account of uid
// 0 and the server's gid whose supplementary groups differ from the
// server's (root in group root, the server with none) hands nothing to an
// identity thread: with the file capabilities the groups decide nothing,
// and each request would pay a thread hand-off and back. Files it creates
// are root's.
func TestRootAccountRunsInPlace(t *testing.T) {
	needPerUser(t)
	if self.uid != 0 || !self.fsCapable() {
		t.Skip("SKIP: needs a root server with the file capabilities")
	}
	uringOff.Store(true) // the write counts as a hand-off too
	t.Cleanup(func() { uringOff.Store(false) })
	dir := sharedDir(t)
	root := Account{Name: "root", Uid: 0, Gid: self.gid, Groups: append(slices.Clone(self.groups), acctA.Gid)}
	a := connectAs(t, dir, root, Config{AllowRoot: true})
	before := handoffs.Load()
	if err := a.Run(func() error { return createAndWrite(a, "f") }); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Mkdir("d", 0o755); err != nil {
		t.Fatal(err)
	}
	if n := handoffs.Load() - before; n != 0 {
		t.Errorf("%d hand-offs for root's account (groups %v, the server's %v), want 0", n, root.Groups, self.groups)
	}
	for _, name := range []string{"f", "d"} {
		if st := testutil.Stat(t, filepath.Join(dir, name)); st.Uid != 0 || st.Gid != self.gid {
			t.Errorf("%s is owned by %d:%d, want 0:%d", name, st.Uid, st.Gid, self.gid)
		}
	}
}

// createAndWrite creates name in tr and writes a byte to it.
func createAndWrite(tr *Tree, name string) error {
	f, _, err := tr.Open(name, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteAt([]byte("x"), 0)
	return err
}

// ownedFile writes data to dir/name, owned by acct with mode (set-id bits
// included, which chown would clear), and returns its path.
func ownedFile(t *testing.T, dir, name, data string, acct Account, mode uint32) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, int(acct.Uid), int(acct.Gid)); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// openOwned makes dir/name as ownedFile does and opens it for writing
// through a tree of acct's (set-id bits allowed); the file closes at the
// test's end.
func openOwned(t *testing.T, dir, name, data string, acct Account, mode uint32) (string, *Tree, *OpenFile) {
	t.Helper()
	p := ownedFile(t, dir, name, data, acct, mode)
	tr := connectAs(t, dir, acct, Config{AllowSetid: true})
	f, _, err := tr.Open(name, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return p, tr, f
}
