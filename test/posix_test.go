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
	"CopyFileRange":    testCopyFileRange,
	"Fallocate":        testFallocate,
	"SeekDataHole":     testSeekDataHole,
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

// createFile creates path, closed when the test ends.
func createFile(t testing.TB, path string) *os.File {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func mustWrite(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// wantContent reads path once: what a mount (this one, or another after
// the writer's close(2)) must show at once — close-to-open leaves it no
// time to catch up.
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

// wantOnDisk is wantContent for a path on the server's disk, read there
// directly: it may lag a file closed through a mount by the BATCH of what
// a Write lease held back, sent right after close(2) (docs/usage.md,
// "What close(2) promises"), so it waits a little for it.
func wantOnDisk(t testing.TB, path string, want []byte) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got, err := os.ReadFile(path); err == nil && bytes.Equal(got, want) {
			return
		}
	}
	wantContent(t, path, want)
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
		wantOnDisk(t, filepath.Join(e.Backing, "f"), data)
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
			wantOnDisk(t, filepath.Join(e.Backing, filepath.Base(p)), data)
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
		wantOnDisk(t, filepath.Join(e.Backing, "f"), []byte{})
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
		wantOnDisk(t, filepath.Join(e.Backing, "f"), data)
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

func testSparseAndEOFRead(t *testing.T, e posixEnv) {
	p := filepath.Join(e.Dir, "f")
	f := createFile(t, p)
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
	f := createFile(t, p)
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
