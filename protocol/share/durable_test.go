package share

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestIdentityKey: the key is made once, private, and kept; a damaged one
// is an error, not silently replaced.
func TestIdentityKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "lwio")
	k1, err := LoadIdentityKey(dir)
	if err != nil || len(k1) != IdentityKeySize {
		t.Fatalf("LoadIdentityKey = %d bytes, %v", len(k1), err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("state directory: %v %v, want mode 0700", st.Mode(), err)
	}
	if st, err := os.Stat(filepath.Join(dir, identityKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v %v, want mode 0600", st.Mode(), err)
	}
	k2, err := LoadIdentityKey(dir)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Errorf("second load: %v; same key %v", err, bytes.Equal(k1, k2))
	}
	if err := os.WriteFile(filepath.Join(dir, identityKeyFile), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadIdentityKey(dir); err == nil {
		t.Error("a 5-byte key was accepted")
	}
}

// durableEnv is a share with an identity key.
func durableEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, false)
	e.tr.sh.SetIdentityKey(bytes.Repeat([]byte{7}, IdentityKeySize))
	return e
}

func (e *env) fileID(t *testing.T, p string) []byte {
	t.Helper()
	f, _, err := e.tr.Open(p, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	id := f.FileID()
	if id == nil {
		t.Fatal("no FileID with a key set")
	}
	return id
}

func readAll(t *testing.T, f *OpenFile) string {
	t.Helper()
	buf := make([]byte, 64)
	n, err := f.ReadAt(buf, 0)
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	return string(buf[:n])
}

// TestReopenByIdentity: a FileID finds its file at its name or, renamed,
// where it went; a replaced or deleted file is ESTALE, never the new file
// under the old name.
func TestReopenByIdentity(t *testing.T) {
	e := durableEnv(t)
	e.writeFile(t, "a", "first a")
	id := e.fileID(t, "a")

	f, _, err := e.tr.Reopen(id, "a", os.O_RDONLY)
	if err != nil || readAll(t, f) != "first a" {
		t.Fatalf("Reopen at its name: %v", err)
	}
	f.Close()

	// Renamed behind the client's back (another client, a local process).
	if err := os.Mkdir(filepath.Join(e.share, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(e.share, "a"), filepath.Join(e.share, "sub", "moved")); err != nil {
		t.Fatal(err)
	}
	f, _, err = e.tr.Reopen(id, "a", os.O_RDWR)
	if err != nil {
		t.Fatalf("Reopen of a renamed file: %v", err)
	}
	if readAll(t, f) != "first a" {
		t.Error("Reopen of a renamed file opened another file")
	}
	f.Close()

	// Replaced: a new file under the old name (and the old one gone).
	e.writeFile(t, "b", "old b")
	idB := e.fileID(t, "b")
	os.Remove(filepath.Join(e.share, "b"))
	e.writeFile(t, "b", "new b")
	if _, _, err := e.tr.Reopen(idB, "b", os.O_RDONLY); err == nil {
		t.Fatal("Reopen of a replaced file opened the new one")
	} else {
		wantErrno(t, "Reopen of a replaced file", err, syscall.ESTALE)
	}
	// Deleted.
	os.Remove(filepath.Join(e.share, "sub", "moved"))
	_, _, err = e.tr.Reopen(id, "a", os.O_RDONLY)
	wantErrno(t, "Reopen of a deleted file", err, syscall.ESTALE)

	// O_CREAT, O_EXCL and O_TRUNC are not replayed.
	e.writeFile(t, "c", "keep me")
	idC := e.fileID(t, "c")
	f, _, err = e.tr.Reopen(idC, "c", os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_TRUNC)
	if err != nil || readAll(t, f) != "keep me" {
		t.Errorf("Reopen with O_CREAT|O_EXCL|O_TRUNC: %v", err)
	}
	if f != nil {
		f.Close()
	}
}

// TestReopenRenamedKernelNamesNothing: when the kernel cannot name a
// file handle's inode — its dentries left the cache (memory pressure,
// drop_caches), so open_by_handle_at answers a disconnected one, "/" in
// /proc — a file renamed within its directory is still found there; one
// moved elsewhere is then ESTALE, never another file.
func TestReopenRenamedKernelNamesNothing(t *testing.T) {
	e := durableEnv(t)
	saved := kernelWhereIs
	t.Cleanup(func() { kernelWhereIs = saved })
	kernelWhereIs = func(*Share, *identity) (string, where) { return "", whereUnnamed }

	if err := os.Mkdir(filepath.Join(e.share, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.writeFile(t, "d/other", "another file")
	e.writeFile(t, "d/a", "first a")
	id := e.fileID(t, "d/a")
	if err := os.Rename(filepath.Join(e.share, "d", "a"), filepath.Join(e.share, "d", "a.old")); err != nil {
		t.Fatal(err)
	}
	f, _, err := e.tr.Reopen(id, "d/a", os.O_RDONLY)
	if err != nil {
		t.Fatalf("Reopen of a file renamed in its directory: %v", err)
	}
	if got := readAll(t, f); got != "first a" {
		t.Errorf("Reopen of a file renamed in its directory read %q", got)
	}
	f.Close()

	e.writeFile(t, "top", "at the root")
	idTop := e.fileID(t, "top")
	if err := os.Rename(filepath.Join(e.share, "top"), filepath.Join(e.share, "top2")); err != nil {
		t.Fatal(err)
	}
	f, _, err = e.tr.Reopen(idTop, "top", os.O_RDONLY)
	if err != nil {
		t.Fatalf("Reopen of a file renamed at the root: %v", err)
	}
	if got := readAll(t, f); got != "at the root" {
		t.Errorf("Reopen of a file renamed at the root read %q", got)
	}
	f.Close()

	if err := os.Rename(filepath.Join(e.share, "d", "a.old"), filepath.Join(e.share, "elsewhere")); err != nil {
		t.Fatal(err)
	}
	_, _, err = e.tr.Reopen(id, "d/a", os.O_RDONLY)
	wantErrno(t, "Reopen of a file moved out of its directory, unnamed by the kernel", err, syscall.ESTALE)
}

// TestReopenDeletedInodeReused: on a filesystem without btime (ext4 with
// 128-byte inodes, ext2/3, some tmpfs, overlay, NFS) a deleted file's inode
// number is at once another file's, in the same directory. A reopen of the
// deleted file must not open that one: the directory is searched only when
// the handle opened (the file exists) and the kernel could not name it,
// and what the search finds must have the identity's kernel handle (its
// generation), or, without a handle, a btime to compare.
func TestReopenDeletedInodeReused(t *testing.T) {
	e := durableEnv(t)
	savedWhere, savedStat := kernelWhereIs, statxFd
	t.Cleanup(func() { kernelWhereIs, statxFd = savedWhere, savedStat })
	statxFd = func(fd int, stx *unix.Statx_t) error {
		err := savedStat(fd, stx)
		stx.Mask &^= unix.STATX_BTIME
		return err
	}
	if err := os.Mkdir(filepath.Join(e.share, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.writeFile(t, "d/new", "an unrelated new file")
	// The deleted "d/a" as its FileID had it: the inode number d/new has
	// now, another generation in its handle, no btime.
	newF, err := os.Open(filepath.Join(e.share, "d", "new"))
	if err != nil {
		t.Fatal(err)
	}
	newID, err := statxIdentity(int(newF.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := unix.NameToHandleAt(int(newF.Fd()), "", unix.AT_EMPTY_PATH)
	newF.Close()
	if err != nil {
		t.Fatalf("no file handles on the test's filesystem: %v", err)
	}
	newID.htype, newID.handle = h.Type(), h.Bytes()
	seal := func(id identity) []byte {
		body := id.encode()
		return append(body, e.tr.sh.seal(body)...)
	}
	deleted := newID
	deleted.handle = append([]byte(nil), newID.handle...)
	deleted.handle[len(deleted.handle)-1] ^= 0x5a
	noHandle := newID
	noHandle.htype, noHandle.handle = 0, nil

	for _, c := range []struct {
		name  string
		where where
		id    identity
	}{
		{"deleted (open_by_handle_at ESTALE)", whereNot, newID},
		{"unnamed, another generation's handle", whereUnnamed, deleted},
		{"unnamed, no handle and no btime", whereUnnamed, noHandle},
	} {
		kernelWhereIs = func(*Share, *identity) (string, where) { return "", c.where }
		if f, _, err := e.tr.Reopen(seal(c.id), "d/a", os.O_RDWR); err == nil {
			t.Errorf("%s: Reopen opened the new file, reading %q", c.name, readAll(t, f))
			f.Close()
		} else {
			wantErrno(t, c.name, err, syscall.ESTALE)
		}
	}

	// Its own handle still finds a file renamed in its directory.
	kernelWhereIs = func(*Share, *identity) (string, where) { return "", whereUnnamed }
	f, _, err := e.tr.Reopen(seal(newID), "d/a", os.O_RDONLY)
	if err != nil {
		t.Fatalf("Reopen by a matching handle, no btime: %v", err)
	}
	if got := readAll(t, f); got != "an unrelated new file" {
		t.Errorf("Reopen by a matching handle read %q", got)
	}
	f.Close()
}

// TestReopenConfined: a FileID opens nothing outside its share: not a
// forged one, not one of another share, not one sealed with the right key
// for a file outside the share (as if its seal leaked), not a file moved
// out of the share while the server was down.
func TestReopenConfined(t *testing.T) {
	e := durableEnv(t)
	e.writeFile(t, "f", "inside")
	id := e.fileID(t, "f")

	forged := append([]byte(nil), id...)
	forged[len(forged)-1] ^= 1
	_, _, err := e.tr.Reopen(forged, "f", os.O_RDONLY)
	wantErrno(t, "forged FileID", err, syscall.ESTALE)
	_, _, err = e.tr.Reopen(id[:len(id)-1], "f", os.O_RDONLY)
	wantErrno(t, "truncated FileID", err, syscall.ESTALE)
	// The same directory served as another share: its ids are not this one's.
	other := connect(t, Config{Name: "other", Path: e.share}, false)
	other.sh.SetIdentityKey(bytes.Repeat([]byte{7}, IdentityKeySize))
	_, _, err = other.Reopen(id, "f", os.O_RDONLY)
	wantErrno(t, "another share's FileID", err, syscall.ESTALE)

	// A correctly sealed id of a file outside the share.
	secret, err := os.Open(filepath.Join(e.outside, "secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer secret.Close()
	sid, err := statxIdentity(int(secret.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if h, _, err := unix.NameToHandleAt(int(secret.Fd()), "", unix.AT_EMPTY_PATH); err == nil {
		sid.htype, sid.handle = h.Type(), h.Bytes()
	} else {
		t.Logf("no file handles here (%v): only the by-path step is tried", err)
	}
	body := sid.encode()
	sealed := append(body, e.tr.sh.seal(body)...)
	for _, p := range []string{"f", "secret", "../outside/secret"} {
		if f, _, err := e.tr.Reopen(sealed, p, os.O_RDONLY); err == nil {
			t.Errorf("Reopen of a file outside the share (path %q) opened %q", p, readAll(t, f))
			f.Close()
		}
	}

	// Moved out of the share (same filesystem) during an outage.
	if err := os.Rename(filepath.Join(e.share, "f"), filepath.Join(e.outside, "f")); err != nil {
		t.Fatal(err)
	}
	if f, _, err := e.tr.Reopen(id, "f", os.O_RDONLY); err == nil {
		t.Errorf("Reopen of a file moved out of the share opened %q", readAll(t, f))
		f.Close()
	} else {
		wantErrno(t, "Reopen of a file moved out", err, syscall.ESTALE)
	}
}

// TestFileIDNeedsKey: without an identity key no FileID is issued and none
// is honoured.
func TestFileIDNeedsKey(t *testing.T) {
	e := newEnv(t, false)
	e.writeFile(t, "f", "x")
	f := e.open(t, "f", os.O_RDONLY)
	if id := f.FileID(); id != nil {
		t.Errorf("FileID without a key = %x", id)
	}
	_, _, err := e.tr.Reopen([]byte("anything at all, long enough"), "f", os.O_RDONLY)
	wantErrno(t, "Reopen without a key", err, syscall.ESTALE)
}

// TestReopenSearchAsTheUser: the search for a renamed file runs with the
// user's credentials, not the server's. A user who may reach a file in a
// directory it cannot list (mode 0711, as a home directory) cannot have it
// found by name after a rename; once the directory is readable, it can.
func TestReopenSearchAsTheUser(t *testing.T) {
	needPerUser(t)
	dir := sharedDir(t)
	tr := connectAs(t, dir, acctA, Config{})
	tr.sh.SetIdentityKey(bytes.Repeat([]byte{7}, IdentityKeySize))
	saved := kernelWhereIs
	t.Cleanup(func() { kernelWhereIs = saved })
	kernelWhereIs = func(*Share, *identity) (string, where) { return "", whereUnnamed }

	d := filepath.Join(dir, "d")
	if err := os.Mkdir(d, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o711); err != nil { // past the umask
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "a"), []byte("first a"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, _, err := tr.Open("d/a", os.O_RDONLY, 0)
	if err != nil {
		t.Fatalf("open as %s through a directory it may traverse: %v", acctA.Name, err)
	}
	id := f.FileID()
	f.Close()
	if err := os.Rename(filepath.Join(d, "a"), filepath.Join(d, "a.old")); err != nil {
		t.Fatal(err)
	}
	_, _, err = tr.Reopen(id, "d/a", os.O_RDONLY)
	wantErrno(t, "Reopen by a user who cannot list the directory", err, syscall.ESTALE)

	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	f, _, err = tr.Reopen(id, "d/a", os.O_RDONLY)
	if err != nil {
		t.Fatalf("Reopen by a user who can list the directory: %v", err)
	}
	defer f.Close()
	if got := readAll(t, f); got != "first a" {
		t.Errorf("Reopen as the user read %q, want the renamed file's data", got)
	}
}
