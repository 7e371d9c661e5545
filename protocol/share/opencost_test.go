package share

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The cheaper OPEN and SETATTR (issue 15): an open reads its attributes
// and its identity in one statx, a leased create's watch and FileID share
// one kernel handle taken from the descriptor, and a setattr on an open
// handle knows the file's type without an fstat. These tests hold what the
// syscalls that went away guarded.

// TestOpenLeaseCreateWatchedAndIdentified: a file created with a lease
// (tar -x's OPEN) is watched — a local process's change to it breaks the
// lease — and its FileID, sealed from the identity the open read and the
// handle the watch took, finds it again renamed away from its name, and
// refuses the file that replaced it.
func TestOpenLeaseCreateWatchedAndIdentified(t *testing.T) {
	dir, hs := leaseShare(t, 1)
	a := hs[0]
	a.tr.sh.SetIdentityKey(bytes.Repeat([]byte{7}, IdentityKeySize))
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	f, at, got, err := a.tr.OpenLease("d/f", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644, LeaseRead|LeaseHandle)
	if err != nil || got != LeaseRead|LeaseHandle {
		t.Fatalf("OpenLease create = %v, %v; want RH", got, err)
	}
	id := f.FileID()
	if _, err := f.WriteAt([]byte("mine"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "d", "f"), &st); err != nil || st.Ino != at.Ino {
		t.Fatalf("created inode %d, stat %v: %v", at.Ino, st.Ino, err)
	}
	// The identity in the FileID is the open's, and its handle the file's.
	want, err := statxIdentity(fdOf(t, filepath.Join(dir, "d", "f")))
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, filepath.Join(dir, "d", "f"), 0)
	if err != nil {
		t.Fatalf("no file handles on the test's filesystem: %v", err)
	}
	gotID, ok := a.tr.sh.openFileID(id)
	if !ok || !gotID.sameFile(&want) || gotID.htype != h.Type() || !bytes.Equal(gotID.handle, h.Bytes()) {
		t.Fatalf("FileID identity %+v, want %+v with handle %x", gotID, want, h.Bytes())
	}

	local(t, "echo local >> "+filepath.Join(dir, "d", "f"))
	a.wantBreak(t, "local append to the created file", at.Ino, 0)

	if err := os.Rename(filepath.Join(dir, "d", "f"), filepath.Join(dir, "moved")); err != nil {
		t.Fatal(err)
	}
	g, _, err := a.tr.Reopen(id, "d/f", os.O_RDONLY)
	if err != nil {
		t.Fatalf("Reopen of the renamed created file: %v", err)
	}
	if s := readAll(t, g); s != "mine" && s != "minelocal\n" && s != "local\n" {
		t.Errorf("Reopen read %q", s)
	}
	g.Close()
	os.Remove(filepath.Join(dir, "moved"))
	os.WriteFile(filepath.Join(dir, "d", "f"), []byte("another"), 0o644)
	_, _, err = a.tr.Reopen(id, "d/f", os.O_RDONLY)
	wantErrno(t, "Reopen of a replaced created file", err, syscall.ESTALE)
}

// fdOf opens p for the test's own reading.
func fdOf(t *testing.T, p string) int {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// TestOpenSetAttrKnowsType: an open answers what fstat(2) would, and a
// setattr on an open handle treats a directory
// as a directory and a file as a file without looking (the share's
// set-id policy keeps a directory's set-group-ID bit, clears a file's),
// and one that changes nothing answers the file's attributes as they are
// now, changed by another since the open.
func TestOpenSetAttrKnowsType(t *testing.T) {
	e := newEnv(t, false)
	if err := os.Mkdir(filepath.Join(e.share, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.writeFile(t, "f", "x")
	d, _, err := e.tr.Open("d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a, err := d.SetAttr(SetAttrIn{Valid: SetMode, Mode: 0o2775})
	if err != nil || a.Mode&07777 != 0o2775 {
		t.Errorf("chmod 2775 of an open directory: mode %o, %v; want 2775", a.Mode&07777, err)
	}
	f, oa, err := e.tr.Open("f", unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The open's attributes (from statx) are fstat's.
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(e.share, "f"), &st); err != nil || oa != attrFromStat(&st) {
		t.Errorf("Open's attributes %+v, stat's %+v (%v)", oa, attrFromStat(&st), err)
	}
	a, err = f.SetAttr(SetAttrIn{Valid: SetMode, Mode: 0o2775})
	if err != nil || a.Mode&07777 != 0o775 {
		t.Errorf("chmod 2775 of an open file: mode %o, %v; want 775", a.Mode&07777, err)
	}
	a, err = f.SetAttr(SetAttrIn{Valid: SetSize, Size: 5})
	if err != nil || a.Size != 5 {
		t.Errorf("truncate of an open file: size %d, %v; want 5", a.Size, err)
	}
	if err := os.WriteFile(filepath.Join(e.share, "f"), []byte("longer now"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err = f.SetAttr(SetAttrIn{})
	if err != nil || a.Size != 10 || a.Mode&07777 != 0o775 {
		t.Errorf("fstat of an open file: size %d mode %o, %v; want 10, 775", a.Size, a.Mode&07777, err)
	}
}

// TestSetAttrModeEveryDescriptor: a chmod reaches the inode whether the
// tree holds it open for I/O (fchmod) or only by an O_PATH descriptor (a
// SETATTR by path: through /proc, which fchmod refuses), set-id bits
// cleared as before in both.
func TestSetAttrModeEveryDescriptor(t *testing.T) {
	e := newEnv(t, false)
	e.writeFile(t, "f", "x")
	e.writeFile(t, "g", "y")
	mode := func(name string) uint32 {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(e.share, name), &st); err != nil {
			t.Fatal(err)
		}
		return st.Mode & 07777
	}
	f, _, err := e.tr.Open("f", unix.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if a, err := f.SetAttr(SetAttrIn{Valid: SetMode, Mode: 0o640}); err != nil || a.Mode&07777 != 0o640 || mode("f") != 0o640 {
		t.Errorf("chmod 640 of an open file: %o (disk %o), %v", a.Mode&07777, mode("f"), err)
	}
	if a, err := e.tr.SetAttr("g", SetAttrIn{Valid: SetMode, Mode: 0o604}); err != nil || a.Mode&07777 != 0o604 || mode("g") != 0o604 {
		t.Errorf("chmod 604 by path: %o (disk %o), %v", a.Mode&07777, mode("g"), err)
	}
}

// TestSetAttrModeWithoutProc: a server with no /proc (a chroot or a
// container without it) still changes the mode of a file a client holds
// open — by fchmod on the descriptor, not through /proc/self/fd. /proc is
// hidden under an empty tmpfs in a mount namespace of the test's own
// thread, where the tree's calls run (no identity thread: the server's
// own account).
func TestSetAttrModeWithoutProc(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mount namespace")
	}
	e := newEnv(t, false)
	e.writeFile(t, "f", "x")
	f, _, err := e.tr.Open("f", unix.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	done := make(chan error, 1)
	go func() {
		// The thread is left locked: it dies with this goroutine,
		// namespace and all.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			done <- fmt.Errorf("unshare: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			done <- fmt.Errorf("make private: %w", err)
			return
		}
		if err := unix.Mount("noproc", "/proc", "tmpfs", 0, ""); err != nil {
			done <- fmt.Errorf("hide /proc: %w", err)
			return
		}
		if _, err := os.Stat("/proc/self/fd"); err == nil {
			done <- fmt.Errorf("/proc/self/fd still there")
			return
		}
		a, err := f.SetAttr(SetAttrIn{Valid: SetMode, Mode: 0o640})
		if err == nil && a.Mode&07777 != 0o640 {
			err = fmt.Errorf("mode %o, want 640", a.Mode&07777)
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Errorf("chmod 640 of an open file without /proc: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(e.share, "f"), &st); err != nil || st.Mode&07777 != 0o640 {
		t.Errorf("on disk: mode %o, %v; want 640", st.Mode&07777, err)
	}
}
