package fs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// Mknod makes the fake tree a Mknoder: devices refused as the server
// refuses them.
func (t *dirTree) Mknod(ctx context.Context, p string, mode, rdev uint32) (session.Attr, error) {
	t.count("mknod")
	if typ := mode & syscall.S_IFMT; typ == syscall.S_IFCHR || typ == syscall.S_IFBLK {
		return session.Attr{}, syscall.EPERM
	}
	if err := unix.Mknod(t.abs(p), mode, int(rdev)); err != nil {
		return session.Attr{}, errOf(err)
	}
	return t.lstat(p)
}

// TestMountOwnersAndNodes: on a mount whose account (uid 0 here, as the
// fake tree acts as this process) shows as 4242:4343, the account's files
// show as that user, a chown to that user goes back as the account, a
// chown to another id goes as it is; a FIFO works between two processes
// of this host and a device node is EPERM.
func TestMountOwnersAndNodes(t *testing.T) {
	backing := t.TempDir()
	ids := NewIDMap(IDMapUser, nil, fakeAccounts{}, nil)
	acct := Account{Name: "root", Uid: 0, Gid: 0, Groups: []uint32{}}
	ids.Bind(4242, 4343, acct)
	ids.ActAsForAll(acct)
	mnt, tree, _ := mountFake(t, backing, Options{Owners: ids, AttrTimeout: time.Second, EntryTimeout: time.Second})
	p := filepath.Join(mnt, "f")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	owner := func(path string) [2]uint32 {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			t.Fatal(err)
		}
		return [2]uint32{st.Uid, st.Gid}
	}
	if got := owner(p); got != [2]uint32{4242, 4343} {
		t.Errorf("the account's file shows as %v, want 4242:4343", got)
	}
	if err := os.Chown(p, 4242, 4343); err != nil {
		t.Fatal(err)
	}
	if got := owner(filepath.Join(backing, "f")); got != [2]uint32{0, 0} {
		t.Errorf("chown to the owner shown reached the disk as %v, want the account 0:0", got)
	}
	if err := os.Chown(p, 777, 778); err != nil {
		t.Fatal(err)
	}
	if got := owner(filepath.Join(backing, "f")); got != [2]uint32{777, 778} {
		t.Errorf("chown to another owner reached the disk as %v, want 777:778", got)
	}
	if got := owner(p); got != [2]uint32{777, 778} {
		t.Errorf("another owner shows as %v, want 777:778", got)
	}
	// access(2) is answered as the account (root): even a 0000 file.
	if err := os.Chmod(p, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Access(p, unix.R_OK|unix.W_OK); err != nil {
		t.Errorf("access as the root account: %v", err)
	}
	if err := unix.Access(p, unix.X_OK); !errors.Is(err, syscall.EACCES) {
		t.Errorf("access X_OK of a 0000 file: %v, want EACCES", err)
	}

	fifo := filepath.Join(mnt, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	got := make(chan string, 1)
	go func() { b, _ := os.ReadFile(fifo); got <- string(b) }()
	if err := os.WriteFile(fifo, []byte("piped"), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "piped" {
			t.Errorf("through the FIFO: %q", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the FIFO's reader got nothing")
	}
	if st, err := os.Lstat(filepath.Join(backing, "fifo")); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("the FIFO in the backing directory: %v %v", st, err)
	}
	if tree.callCount("open") != 1 {
		t.Errorf("%d OPENs: opening the FIFO must not reach the tree (the kernel serves it)", tree.callCount("open"))
	}
	err := unix.Mknod(filepath.Join(mnt, "null"), syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	if !errors.Is(err, syscall.EPERM) {
		t.Errorf("mknod of a device: %v, want EPERM", err)
	}
}
