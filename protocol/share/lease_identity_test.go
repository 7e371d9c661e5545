package share

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

// TestLeasesAsTheUser: the lease forms of LOOKUP, OPEN, MKDIR and READDIR
// act as the tree's user (issue 14): what the user may not reach they
// refuse, what they create is the user's; and a directory's lease — which
// tells its holder the names created and removed in it — goes only to a
// user who may list the directory, even when another user's lease had the
// server watch it already.
func TestLeasesAsTheUser(t *testing.T) {
	needPerUser(t)
	dir := sharedDir(t)
	for _, d := range []struct {
		name string
		mode uint32
	}{{"open", 0o777}, {"private", 0o711}, {"secret", 0o700}} {
		if err := os.Mkdir(filepath.Join(dir, d.name), 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, d.name, "f"), []byte("x"), 0o644)
		os.Chmod(filepath.Join(dir, d.name), os.FileMode(d.mode))
	}
	sh := leasingShare(t, dir)
	root, a := leasingTree(t, sh, Identity{User: "admin"}), leasingTree(t, sh, Identity{User: acctA.Name, Account: acctA})

	// The server's own account watches "private" for its lease; a may
	// search it, not list it: no lease for a, its attributes still.
	mustLease(t, root, "private", LeaseRead, LeaseRead)
	if at, got, err := a.Lease("private", LeaseRead); err != nil || got != 0 || at.Ino == 0 {
		t.Errorf("a's lease on a directory it may not list: %v %v %v, want attributes and none", at.Ino, got, err)
	}
	mustLease(t, a, "private/f", LeaseRead, LeaseRead) // a file there it may read
	mustLease(t, a, "open", LeaseRead, LeaseRead)      // the control
	if _, _, got, _, err := a.ReadDirLease("open", "", 1<<20, func(string) int { return 1 }, LeaseRead, LeaseRead); err != nil || got != LeaseRead {
		t.Errorf("a's listing of open with a lease: %v %v", got, err)
	}

	// Where a may not go, the lease forms refuse as the plain ones do.
	if _, _, err := a.Lease("secret/f", LeaseRead); err != protocol.StatusAccessDenied {
		t.Errorf("LEASE of secret/f as a: %v, want ACCESS_DENIED", err)
	}
	if _, _, _, _, err := a.ReadDirLease("secret", "", 1<<20, func(string) int { return 1 }, LeaseRead, LeaseRead); err != protocol.StatusAccessDenied {
		t.Errorf("READDIR of secret with a lease as a: %v, want ACCESS_DENIED", err)
	}
	if _, _, _, err := a.OpenLease("secret/f", unix.O_RDONLY, 0, LeaseRead); err != protocol.StatusAccessDenied {
		t.Errorf("OPEN of secret/f with a lease as a: %v, want ACCESS_DENIED", err)
	}

	// What a creates with a lease is a's.
	f, _, got, err := a.OpenLease("open/mine", unix.O_CREAT|unix.O_WRONLY, 0o644, LeaseAll)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got == 0 {
		t.Error("no lease on a file a created")
	}
	if _, _, err := a.MkdirLease("open/minedir", 0o755, LeaseRead); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"open/mine", "open/minedir"} {
		if uid, gid := owner(t, filepath.Join(dir, p)); uid != acctA.Uid || gid != acctA.Gid {
			t.Errorf("%s is %d:%d, want a's %d:%d", p, uid, gid, acctA.Uid, acctA.Gid)
		}
	}
}

// leasingTree connects id to sh with leases on, every break acknowledged.
func leasingTree(t *testing.T, sh *Share, id Identity) *Tree {
	t.Helper()
	tr, err := sh.Connect(id)
	if err != nil {
		t.Fatal(err)
	}
	tr.EnableLeases(func(b LeaseBreak) {
		if b.Ack {
			go tr.AckLease(b.ID)
		}
	})
	return tr
}
