package test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// posixEnv is where one check of the POSIX suite runs: Dir is a fresh,
// empty directory on the filesystem under test, Backing the same directory
// on the server's local disk (so a check can see what really reached the
// disk), or "" when there is no such view.
type posixEnv struct {
	Dir     string
	Backing string
}

// posixSuite is the named POSIX suite every configuration runs (interrupt
// and polling completion, and, as a check of the checks, a plain directory
// and the no-op FUSE passthrough). Each check gets its own directory.
var posixSuite = map[string]func(t *testing.T, e posixEnv){
	"CreateRead":       testCreateRead,
	"WriteRead":        testWriteRead,
	"OverwriteMiddle":  testOverwriteMiddle,
	"Append":           testAppend,
	"Truncate":         testTruncate,
	"RenameOverwrite":  testRenameOverwrite,
	"RenameDir":        testRenameDir,
	"UnlinkOpenFile":   testUnlinkOpenFile,
	"Mkdir":            testMkdir,
	"RmdirNotEmpty":    testRmdirNotEmpty,
	"SymlinkReadlink":  testSymlinkReadlink,
	"HardLink":         testHardLink,
	"Chmod":            testChmod,
	"Utimens":          testUtimens,
	"Xattr":            testXattr,
	"ReadDir10000":     testReadDir10000,
	"StatFS":           testStatFS,
	"Fsync":            testFsync,
	"NotExist":         testNotExist,
	"ExclusiveCreate":  testExclusiveCreate,
	"SparseAndEOFRead": testSparseAndEOFRead,
	"SignalDuringIO":   testSignalDuringIO,
	"LargeOffsets":     testLargeOffsets,
}

// runPOSIXSuite runs every check as a subtest in its own directory under
// root (backing is the same directory on local disk, or "").
func runPOSIXSuite(t *testing.T, root, backing string) {
	names := make([]string, 0, len(posixSuite))
	for n := range posixSuite {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			e := posixEnv{Dir: filepath.Join(root, n)}
			if backing != "" {
				e.Backing = filepath.Join(backing, n)
			}
			if err := os.Mkdir(e.Dir, 0o755); err != nil {
				t.Fatal(err)
			}
			posixSuite[n](t, e)
		})
	}
}

// pattern returns n bytes that differ at every offset of a file, seeded so
// that two files' contents differ too.
func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+i>>8) ^ seed
	}
	return b
}

func mustWrite(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func wantContent(t testing.TB, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes, want %d; first difference at %d", path, len(got), len(want), firstDiff(got, want))
	}
}

func firstDiff(a, b []byte) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) == len(b) {
		return -1
	}
	return min(len(a), len(b))
}

func wantErrno(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: err = %v, want %v (%d)", what, err, want, int(want))
	}
}

func testCreateRead(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "f")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != 0 || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
		t.Errorf("new file: size %d mode %v, want 0 -rw-------", st.Size(), st.Mode())
	}
	data := []byte("hello, lwio\n")
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantContent(t, p, data)
	if e.Backing != "" {
		wantContent(t, filepath.Join(e.Backing, "f"), data)
	}
	// Empty file round trip.
	mustWrite(t, filepath.Join(e.Dir, "empty"), nil)
	wantContent(t, filepath.Join(e.Dir, "empty"), []byte{})
}

func testWriteRead(t *testing.T, e posixEnv) {
	// Sizes around page and request boundaries, up to several 1 MiB requests.
	for i, n := range []int{1, 4095, 4096, 4097, 128<<10 + 3, 1 << 20, 3<<20 + 517} {
		p := filepath.Join(e.Dir, fmt.Sprintf("f%d", i))
		data := pattern(byte(i), n)
		mustWrite(t, p, data)
		wantContent(t, p, data)
		if e.Backing != "" {
			wantContent(t, filepath.Join(e.Backing, filepath.Base(p)), data)
		}
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != int64(n) {
			t.Errorf("%s: size %d, want %d", p, st.Size(), n)
		}
	}
}

func testOverwriteMiddle(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "f")
	data := pattern(1, 1<<20)
	mustWrite(t, p, data)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	patch := pattern(9, 10000)
	if _, err := f.WriteAt(patch, 300000); err != nil {
		t.Fatal(err)
	}
	copy(data[300000:], patch)
	got := make([]byte, 20000)
	if _, err := f.ReadAt(got, 295000); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data[295000:315000]) {
		t.Errorf("read back through the same fd differs at %d", firstDiff(got, data[295000:315000]))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantContent(t, p, data)
}

func testAppend(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "log")
	var want []byte
	for i := 0; i < 20; i++ {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		line := []byte(fmt.Sprintf("line %d %s\n", i, strings.Repeat("x", i*100)))
		if _, err := f.Write(line); err != nil {
			t.Fatal(err)
		}
		// O_APPEND writes at the end whatever the offset says.
		if _, err := f.Seek(0, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("!")); err != nil {
			t.Fatal(err)
		}
		want = append(append(want, line...), '!')
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	wantContent(t, p, want)
}

func testTruncate(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "f")
	data := pattern(2, 100000)
	mustWrite(t, p, data)
	// Shrink by path.
	if err := os.Truncate(p, 5000); err != nil {
		t.Fatal(err)
	}
	wantContent(t, p, data[:5000])
	// Grow by fd: the new range reads as zeros.
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(70000); err != nil {
		t.Fatal(err)
	}
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != 70000 {
		t.Errorf("after ftruncate(70000): size %d", st.Size())
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte(nil), data[:5000]...), make([]byte, 65000)...)
	wantContent(t, p, want)
	// O_TRUNC on open.
	f, err = os.OpenFile(p, os.O_RDWR|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	wantContent(t, p, []byte{})
	if e.Backing != "" {
		wantContent(t, filepath.Join(e.Backing, "f"), []byte{})
	}
}

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

func testUnlinkOpenFile(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "f")
	data := pattern(4, 200000)
	mustWrite(t, p, data)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat after unlink: %v, want not exist", err)
	}
	ents, err := os.ReadDir(e.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Errorf("directory after unlink lists %v", entNames(ents))
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatalf("read through the fd of an unlinked file: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("unlinked file via fd differs at %d", firstDiff(got, data))
	}
	// Still writable through the fd, too.
	if _, err := f.WriteAt([]byte("still here"), 1000); err != nil {
		t.Fatalf("write through the fd of an unlinked file: %v", err)
	}
	got = make([]byte, 10)
	if _, err := f.ReadAt(got, 1000); err != nil || string(got) != "still here" {
		t.Fatalf("read back after write to unlinked file: %q, %v", got, err)
	}
	// The name is free again.
	mustWrite(t, p, []byte("other"))
	wantContent(t, p, []byte("other"))
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
	sa, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := os.Stat(b)
	if err != nil {
		t.Fatal(err)
	}
	na, nb := sa.Sys().(*syscall.Stat_t), sb.Sys().(*syscall.Stat_t)
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
	sb, err = os.Stat(b)
	if err != nil {
		t.Fatal(err)
	}
	if n := sb.Sys().(*syscall.Stat_t).Nlink; n != 1 {
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

func testFsync(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	data := pattern(5, 300000)
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		t.Fatalf("fdatasync: %v", err)
	}
	// After fsync the data is on the server's disk before close.
	if e.Backing != "" {
		wantContent(t, filepath.Join(e.Backing, "f"), data)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(e.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		t.Errorf("fsync of a directory: %v", err)
	}
	d.Close()
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

func testSparseAndEOFRead(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("tail"), 5<<20); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	n, err := f.ReadAt(buf, 2<<20)
	if err != nil || n != len(buf) || !bytes.Equal(buf, make([]byte, len(buf))) {
		t.Fatalf("read of a hole: n=%d err=%v, want %d zero bytes", n, err, len(buf))
	}
	n, _ = f.ReadAt(buf, 5<<20)
	if n != 4 || string(buf[:4]) != "tail" {
		t.Fatalf("read across EOF: %d bytes %q, want 4 \"tail\"", n, buf[:n])
	}
	n, _ = f.ReadAt(buf, 6<<20)
	if n != 0 {
		t.Fatalf("read past EOF returned %d bytes", n)
	}
}

func entNames(ents []os.DirEntry) []string {
	var s []string
	for _, e := range ents {
		s = append(s, e.Name())
	}
	return s
}

var catchSIGUSR1 sync.Once

// testSignalDuringIO reads and writes a file, buffered and O_DIRECT, while
// another thread keeps sending the reader a caught signal (as the Go
// runtime's SIGURG preemption, SIGCHLD or SIGALRM do to real programs).
// Regular-file I/O on Linux does not fail with EINTR for a signal whose
// handler was installed with SA_RESTART; applications do not retry it.
func testSignalDuringIO(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "f")
	mustWrite(t, p, pattern(6, 4<<20))
	catchSIGUSR1.Do(func() {
		// Caught for the rest of the run: a signal still in flight when a
		// check ends must not meet the default action (exit). Go installs
		// its handlers with SA_RESTART.
		sig := make(chan os.Signal, 1024)
		signal.Notify(sig, syscall.SIGUSR1)
		go func() {
			for range sig {
			}
		}()
	})
	for _, direct := range []bool{false, true} {
		flags := unix.O_RDWR
		if direct {
			flags |= unix.O_DIRECT
		}
		fd, err := unix.Open(p, flags, 0)
		if err != nil {
			t.Fatal(err)
		}
		buf := alignedBuf(t, 1<<20)
		tids := make(chan int, 1)
		stop := make(chan struct{})
		var failure error
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			tids <- unix.Gettid()
			deadline := time.Now().Add(time.Second)
			for i := 0; time.Now().Before(deadline); i++ {
				off := int64(i%4) << 20
				var err error
				if i%3 == 2 {
					_, err = unix.Pwrite(fd, buf, off)
				} else {
					_, err = unix.Pread(fd, buf, off)
				}
				if err != nil {
					failure = fmt.Errorf("I/O #%d (O_DIRECT %v) with signals arriving: %w", i, direct, err)
					break
				}
			}
			close(stop)
		}()
		tid := <-tids
		func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = unix.Tgkill(os.Getpid(), tid, syscall.SIGUSR1)
				time.Sleep(50 * time.Microsecond)
			}
		}()
		<-done
		unix.Close(fd)
		if failure != nil {
			t.Fatal(failure)
		}
	}
}

// testLargeOffsets writes and reads across the 4 GiB boundary and near
// 1 TiB of a sparse file: offsets must travel as 64-bit values everywhere.
func testLargeOffsets(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cases := []struct {
		off int64
		n   int
	}{{1<<32 - 2048, 8192}, {1<<40 + 7, 3000}}
	for i, c := range cases {
		if _, err := f.WriteAt(pattern(byte(40+i), c.n), c.off); err != nil {
			t.Fatalf("write %d bytes at %d: %v", c.n, c.off, err)
		}
	}
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if want := cases[1].off + int64(cases[1].n); st.Size() != want {
		t.Errorf("size %d, want %d", st.Size(), want)
	}
	for i, c := range cases {
		got := make([]byte, c.n)
		if _, err := f.ReadAt(got, c.off); err != nil {
			t.Fatalf("read %d bytes at %d: %v", c.n, c.off, err)
		}
		if !bytes.Equal(got, pattern(byte(40+i), c.n)) {
			t.Errorf("read at %d differs at %d", c.off, firstDiff(got, pattern(byte(40+i), c.n)))
		}
	}
	// The same across 4 GiB with O_DIRECT, page-aligned.
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf := alignedBuf(t, 16384)
	copy(buf, pattern(50, len(buf)))
	if n, err := unix.Pwrite(fd, buf, 1<<32-8192); err != nil || n != len(buf) {
		t.Fatalf("O_DIRECT pwrite across 4 GiB: %d, %v", n, err)
	}
	clear(buf)
	if n, err := unix.Pread(fd, buf, 1<<32-8192); err != nil || n != len(buf) || !bytes.Equal(buf, pattern(50, len(buf))) {
		t.Fatalf("O_DIRECT pread across 4 GiB: %d, %v, equal %v", n, err, bytes.Equal(buf, pattern(50, len(buf))))
	}
	if e.Backing != "" {
		b, err := os.Open(filepath.Join(e.Backing, "sparse"))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		got := make([]byte, 3000)
		if _, err := b.ReadAt(got, 1<<40+7); err != nil || !bytes.Equal(got, pattern(41, 3000)) {
			t.Errorf("the server's copy near 1 TiB: %v, equal %v", err, bytes.Equal(got, pattern(41, 3000)))
		}
	}
}
