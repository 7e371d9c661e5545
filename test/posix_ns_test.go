package test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// The namespace half of the POSIX suite (posix_test.go has the suite and
// its data checks).

func testRenameOverwrite(t *testing.T, e posixEnv) {
	a, b := filepath.Join(e.Dir, "a"), filepath.Join(e.Dir, "b")
	mustWrite(t, a, []byte("new contents"))
	mustWrite(t, b, pattern(3, 50000))
	// Keep the victim open: its data stays readable through the fd.
	victim, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	if err := os.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(a); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after rename, source: %v, want not exist", err)
	}
	wantContent(t, b, []byte("new contents"))
	got := make([]byte, 50000)
	if _, err := victim.ReadAt(got, 0); err != nil {
		t.Fatalf("read of the replaced file through its open fd: %v", err)
	}
	if !bytes.Equal(got, pattern(3, 50000)) {
		t.Errorf("the replaced file's data changed under its open fd")
	}
	ents, err := os.ReadDir(e.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "b" {
		t.Errorf("directory after rename: %v, want [b]", entNames(ents))
	}
}

func testRenameDir(t *testing.T, e posixEnv) {
	src := filepath.Join(e.Dir, "d1")
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(src, "sub", "f"), []byte("deep"))
	dst := filepath.Join(e.Dir, "d2")
	if err := os.Rename(src, dst); err != nil {
		t.Fatal(err)
	}
	wantContent(t, filepath.Join(dst, "sub", "f"), []byte("deep"))
	if _, err := os.Stat(filepath.Join(src, "sub", "f")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old path after directory rename: %v, want not exist", err)
	}
	// Renaming a directory over a non-empty one fails.
	other := filepath.Join(e.Dir, "d3")
	if err := os.MkdirAll(filepath.Join(other, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := os.Rename(dst, other)
	if !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		t.Errorf("rename over a non-empty directory: %v, want ENOTEMPTY or EEXIST", err)
	}
}

func testMkdir(t *testing.T, e posixEnv) {
	d := filepath.Join(e.Dir, "d")
	if err := os.Mkdir(d, 0o750); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(d)
	if err != nil {
		t.Fatal(err)
	}
	if !st.IsDir() || st.Mode().Perm() != 0o750 {
		t.Errorf("mkdir 0750: mode %v", st.Mode())
	}
	wantErrno(t, "mkdir of an existing dir", os.Mkdir(d, 0o755), syscall.EEXIST)
	if err := os.MkdirAll(filepath.Join(d, "a", "b", "c"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(d, "a", "b", "c", "f"), []byte("x"))
	wantContent(t, filepath.Join(d, "a", "b", "c", "f"), []byte("x"))
	if e.Backing != "" {
		if st, err := os.Stat(filepath.Join(e.Backing, "d", "a", "b", "c")); err != nil || !st.IsDir() {
			t.Errorf("nested directory on the server's disk: %v", err)
		}
	}
	if err := os.Remove(filepath.Join(d, "a", "b", "c", "f")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(d, "a", "b", "c")); err != nil {
		t.Fatalf("rmdir of an empty directory: %v", err)
	}
}

func testRmdirNotEmpty(t *testing.T, e posixEnv) {
	d := filepath.Join(e.Dir, "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(d, "f"), []byte("x"))
	wantErrno(t, "rmdir of a non-empty directory", syscall.Rmdir(d), syscall.ENOTEMPTY)
	wantContent(t, filepath.Join(d, "f"), []byte("x"))
	wantErrno(t, "rmdir of a file", syscall.Rmdir(filepath.Join(d, "f")), syscall.ENOTDIR)
	if err := os.Remove(filepath.Join(d, "f")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Rmdir(d); err != nil {
		t.Fatalf("rmdir once empty: %v", err)
	}
	wantErrno(t, "rmdir of a missing directory", syscall.Rmdir(d), syscall.ENOENT)
}

func testSymlinkReadlink(t *testing.T, e posixEnv) {
	mustWrite(t, filepath.Join(e.Dir, "target"), []byte("pointed at"))
	l := filepath.Join(e.Dir, "link")
	if err := os.Symlink("target", l); err != nil {
		t.Fatal(err)
	}
	got, err := os.Readlink(l)
	if err != nil || got != "target" {
		t.Fatalf("readlink = %q, %v; want \"target\"", got, err)
	}
	st, err := os.Lstat(l)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("lstat of a symlink: mode %v", st.Mode())
	}
	wantContent(t, l, []byte("pointed at"))
	// Dangling and absolute targets are stored as given, not resolved.
	for _, target := range []string{"no/such/file", "/etc/hostname", "../../" + strings.Repeat("x", 200)} {
		p := filepath.Join(e.Dir, "l2")
		os.Remove(p)
		if err := os.Symlink(target, p); err != nil {
			t.Fatalf("symlink %q: %v", target, err)
		}
		if got, err := os.Readlink(p); err != nil || got != target {
			t.Errorf("readlink = %q, %v; want %q", got, err, target)
		}
	}
	wantErrno(t, "readlink of a regular file", func() error { _, err := os.Readlink(filepath.Join(e.Dir, "target")); return err }(), syscall.EINVAL)
}

func testHardLink(t *testing.T, e posixEnv) {
	a, b := filepath.Join(e.Dir, "a"), filepath.Join(e.Dir, "b")
	mustWrite(t, a, []byte("shared"))
	if err := os.Link(a, b); err != nil {
		t.Fatal(err)
	}
	na, nb := testutil.Stat(t, a), testutil.Stat(t, b)
	if na.Nlink != 2 || nb.Nlink != 2 {
		t.Errorf("nlink after link: %d and %d, want 2", na.Nlink, nb.Nlink)
	}
	if na.Ino != nb.Ino {
		t.Errorf("hard links have inode numbers %d and %d, want one inode", na.Ino, nb.Ino)
	}
	// A write through one name is seen through the other.
	f, err := os.OpenFile(b, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(" data")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	wantContent(t, a, []byte("shared data"))
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	wantContent(t, b, []byte("shared data"))
	if n := testutil.Stat(t, b).Nlink; n != 1 {
		t.Errorf("nlink after unlinking the other name: %d, want 1", n)
	}
}

func testChmod(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "f")
	mustWrite(t, p, []byte("x"))
	for _, m := range []os.FileMode{0o600, 0o755, 0o640, 0o4755 &^ 0o4000, 0o000, 0o644} {
		if err := os.Chmod(p, m); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != m.Perm() {
			t.Errorf("after chmod %o: mode %v", m, st.Mode())
		}
		if e.Backing != "" {
			if st, err := os.Stat(filepath.Join(e.Backing, "f")); err != nil || st.Mode().Perm() != m.Perm() {
				t.Errorf("after chmod %o, on the server's disk: %v %v", m, st.Mode(), err)
			}
		}
	}
	if err := os.Chmod(e.Dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(e.Dir); err != nil || st.Mode().Perm() != 0o711 {
		t.Errorf("chmod of a directory: %v %v", st.Mode(), err)
	}
	if err := os.Chmod(e.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func testUtimens(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "f")
	mustWrite(t, p, []byte("x"))
	// Multiples of 100 ns survive a Windows FILETIME on the wire.
	atime := time.Date(2001, 2, 3, 4, 5, 6, 123456700, time.UTC)
	mtime := time.Date(2011, 12, 13, 14, 15, 16, 987654300, time.UTC)
	if err := os.Chtimes(p, atime, mtime); err != nil {
		t.Fatal(err)
	}
	check := func(path, where string) {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		if got := time.Unix(st.Mtim.Unix()); !got.Equal(mtime) {
			t.Errorf("%s mtime = %v, want %v", where, got.UTC(), mtime)
		}
		if got := time.Unix(st.Atim.Unix()); !got.Equal(atime) {
			t.Errorf("%s atime = %v, want %v", where, got.UTC(), atime)
		}
	}
	check(p, "mount")
	if e.Backing != "" {
		check(filepath.Join(e.Backing, "f"), "server disk")
	}
	// UTIME_OMIT leaves atime; a new mtime only.
	mtime2 := time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(mtime2.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, 0); err != nil {
		t.Fatal(err)
	}
	mtime = mtime2
	check(p, "mount after UTIME_OMIT")
	// A write moves mtime forward to about now.
	before := time.Now().Add(-2 * time.Second)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("y"))
	f.Close()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.ModTime().Before(before) {
		t.Errorf("mtime after a write: %v, want about now", st.ModTime())
	}
}

func testXattr(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "f")
	mustWrite(t, p, []byte("x"))
	val := []byte("some value\x00with a nul")
	if err := unix.Setxattr(p, "user.lwio.test", val, 0); err != nil {
		if errors.Is(err, unix.ENOTSUP) && e.Backing != "" {
			if berr := unix.Setxattr(filepath.Join(e.Backing, "f"), "user.probe", []byte("1"), 0); errors.Is(berr, unix.ENOTSUP) {
				t.Skipf("SKIP: the backing filesystem itself has no user xattrs: %v", berr)
			}
		}
		t.Fatalf("setxattr: %v", err)
	}
	buf := make([]byte, 256)
	n, err := unix.Getxattr(p, "user.lwio.test", buf)
	if err != nil || !bytes.Equal(buf[:n], val) {
		t.Fatalf("getxattr = %q, %v; want %q", buf[:max(n, 0)], err, val)
	}
	// Size query.
	if n, err := unix.Getxattr(p, "user.lwio.test", nil); err != nil || n != len(val) {
		t.Errorf("getxattr size query = %d, %v; want %d", n, err, len(val))
	}
	wantErrno(t, "XATTR_CREATE of an existing name", unix.Setxattr(p, "user.lwio.test", []byte("v"), unix.XATTR_CREATE), unix.EEXIST)
	if err := unix.Setxattr(p, "user.lwio.other", []byte("2"), 0); err != nil {
		t.Fatal(err)
	}
	n, err = unix.Listxattr(p, buf)
	if err != nil {
		t.Fatal(err)
	}
	names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
	sort.Strings(names)
	var user []string
	for _, nm := range names {
		if strings.HasPrefix(nm, "user.") {
			user = append(user, nm)
		}
	}
	if strings.Join(user, ",") != "user.lwio.other,user.lwio.test" {
		t.Errorf("listxattr = %q", names)
	}
	if err := unix.Removexattr(p, "user.lwio.test"); err != nil {
		t.Fatal(err)
	}
	_, err = unix.Getxattr(p, "user.lwio.test", buf)
	wantErrno(t, "getxattr after removexattr", err, unix.ENODATA)
	_, err = unix.Getxattr(p, "user.never.set", buf)
	wantErrno(t, "getxattr of a name never set", err, unix.ENODATA)
	if _, err := unix.Getxattr(p, "user.lwio.other", buf[:0]); err != nil {
		t.Errorf("getxattr size probe: %v", err)
	}
	_, err = unix.Getxattr(p, "user.lwio.other", buf[:0:0])
	if err != nil {
		t.Errorf("getxattr into an empty buffer (size query): %v", err)
	}
}

func testReadDir10000(t *testing.T, e posixEnv) {
	const n = 10000
	d := filepath.Join(e.Dir, "many")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	want := make(map[string]bool, n)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("entry-%05d-%s", i, strings.Repeat("n", i%40))
		f, err := os.OpenFile(filepath.Join(d, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatalf("create #%d: %v", i, err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		want[name] = true
	}
	// Read in small batches so the listing needs many readdir calls with
	// offsets (resume), not one.
	f, err := os.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := make(map[string]bool, n)
	for {
		names, err := f.Readdirnames(97)
		for _, nm := range names {
			if seen[nm] {
				t.Fatalf("readdir returned %q twice", nm)
			}
			if !want[nm] {
				t.Fatalf("readdir returned %q, never created", nm)
			}
			seen[nm] = true
		}
		if err != nil || len(names) == 0 {
			break
		}
	}
	if len(seen) != n {
		t.Fatalf("readdir saw %d entries, want %d", len(seen), n)
	}
	// And once more with types and stat (readdirplus path, as ls -l does).
	ents, err := os.ReadDir(d)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != n {
		t.Fatalf("second readdir: %d entries, want %d", len(ents), n)
	}
	for _, de := range ents[:100] {
		if !de.Type().IsRegular() {
			t.Errorf("%s: type %v, want regular", de.Name(), de.Type())
		}
	}
}

func testStatFS(t *testing.T, e posixEnv) {
	var st unix.Statfs_t
	if err := unix.Statfs(e.Dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Bsize <= 0 || st.Blocks == 0 || st.Bfree > st.Blocks || st.Bavail > st.Bfree || st.Namelen == 0 {
		t.Fatalf("statfs: %+v", st)
	}
	if e.Backing == "" {
		return
	}
	var bt unix.Statfs_t
	if err := unix.Statfs(e.Backing, &bt); err != nil {
		t.Fatal(err)
	}
	size := func(s unix.Statfs_t) float64 {
		fr := s.Frsize
		if fr == 0 {
			fr = s.Bsize
		}
		return float64(s.Blocks) * float64(fr)
	}
	if r := size(st) / size(bt); r < 0.95 || r > 1.05 {
		t.Errorf("statfs total size %.0f bytes, the server's disk %.0f", size(st), size(bt))
	}
}

func testNotExist(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "nope")
	_, err := os.Stat(p)
	wantErrno(t, "stat", err, syscall.ENOENT)
	_, err = os.Open(p)
	wantErrno(t, "open", err, syscall.ENOENT)
	wantErrno(t, "unlink", syscall.Unlink(p), syscall.ENOENT)
	wantErrno(t, "rename", os.Rename(p, p+"2"), syscall.ENOENT)
	_, err = os.Stat(filepath.Join(e.Dir, "nope", "deeper"))
	wantErrno(t, "stat below a missing dir", err, syscall.ENOENT)
	mustWrite(t, filepath.Join(e.Dir, "file"), []byte("x"))
	_, err = os.Stat(filepath.Join(e.Dir, "file", "below"))
	wantErrno(t, "stat below a file", err, syscall.ENOTDIR)
	// A name created after a failed lookup shows up at once (no negative caching).
	mustWrite(t, p, []byte("now"))
	wantContent(t, p, []byte("now"))
}

func testExclusiveCreate(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "f")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	wantErrno(t, "O_EXCL of an existing file", err, syscall.EEXIST)
	_, err = os.OpenFile(e.Dir, os.O_WRONLY, 0)
	wantErrno(t, "open a directory for writing", err, syscall.EISDIR)
}

func entNames(ents []os.DirEntry) []string {
	var s []string
	for _, e := range ents {
		s = append(s, e.Name())
	}
	return s
}
