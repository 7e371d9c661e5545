package fs

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/fileserver"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// copyRig is a server of share "s" (dir) and mounts of it through
// Reconnectors, as lwio-mount mounts. data counts the file data the
// connections carry: the LWIO engine's reads and writes of registered
// files (counted on the server) and the session channel's READ and WRITE
// (counted by the session client), until the project's own counters
// (lwio stat, issue 17) can say it. copies counts COPY_RANGE requests;
// copyCap and copyDelay, when set, make each one copy at most copyCap bytes
// after copyDelay — a slow copy, to interrupt.
type copyRig struct {
	dir       string
	srv       *fileserver.Server
	data      atomic.Int64
	copies    atomic.Int64
	copyCap   int64
	copyDelay time.Duration
}

func newCopyRig(t *testing.T) *copyRig {
	t.Helper()
	needFUSE(t)
	r := &copyRig{dir: t.TempDir()}
	r.srv = serveWrapped(t, r.dir, "127.0.0.1:0", "127.0.0.1:0", func(f share.File) share.File { return countedFile{f, &r.data} })
	return r
}

// mount mounts the share once more (a session of its own).
func (r *copyRig) mount(t *testing.T) string {
	t.Helper()
	dial := dialer(r.srv.SessionAddr(), client.Interrupt)
	log := logrus.New()
	log.SetLevel(logrus.PanicLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rc, err := NewReconnector(ctx, func(ctx context.Context) (*Session, error) {
		s, err := dial(ctx)
		if err == nil {
			s.Tree = &countedTree{s.Tree.(*session.Tree), r}
		}
		return s, err
	}, 0, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	return mountOn(t, rc, rc)
}

// countedFile counts the bytes the LWIO engine reads and writes.
type countedFile struct {
	share.File
	n *atomic.Int64
}

func (f countedFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	f.n.Add(int64(n))
	return n, err
}

func (f countedFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	f.n.Add(int64(n))
	return n, err
}

// countedTree counts the session channel's file data and COPY_RANGEs.
type countedTree struct {
	*session.Tree
	r *copyRig
}

func (t *countedTree) ReadAt(ctx context.Context, h session.Handle, p []byte, off int64) (int, error) {
	n, err := t.Tree.ReadAt(ctx, h, p, off)
	t.r.data.Add(int64(n))
	return n, err
}

func (t *countedTree) WriteAt(ctx context.Context, h session.Handle, p []byte, off int64) (int, error) {
	n, err := t.Tree.WriteAt(ctx, h, p, off)
	t.r.data.Add(int64(n))
	return n, err
}

func (t *countedTree) CopyRange(ctx context.Context, src session.Handle, srcOff int64, dst session.Handle, dstOff int64, n int64) (int64, session.Attr, error) {
	t.r.copies.Add(1)
	if t.r.copyCap > 0 {
		time.Sleep(t.r.copyDelay)
		n = min(n, t.r.copyCap)
	}
	return t.Tree.CopyRange(ctx, src, srcOff, dst, dstOff, n)
}

func writeRandom(t *testing.T, p string, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

func sameFile(t *testing.T, what, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes differ from the %d expected", what, len(got), len(want))
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// TestCpCopiesOnServer: cp of a file inside the mount is a server-side
// copy: the copy is right and less than 1 MiB of file data crosses the
// connections (the 64 MiB would cross twice through the client without).
func TestCpCopiesOnServer(t *testing.T) {
	r := newCopyRig(t)
	mnt := r.mount(t)
	data := writeRandom(t, filepath.Join(r.dir, "big"), 64<<20)
	r.data.Store(0)
	run(t, "cp", filepath.Join(mnt, "big"), filepath.Join(mnt, "copy"))
	if n := r.data.Load(); n >= 1<<20 {
		t.Errorf("cp of 64 MiB moved %d bytes of file data over the connections, want < 1 MiB", n)
	}
	if r.copies.Load() == 0 {
		t.Error("no COPY_RANGE request")
	}
	sameFile(t, "the copy on the export", filepath.Join(r.dir, "copy"), data)
	sameFile(t, "the copy through the mount", filepath.Join(mnt, "copy"), data)
}

// TestCpBetweenMounts: cp from one mount of a server to another works. The
// kernel never asks a FUSE daemon to copy between two mounts (two
// superblocks): it copies through its page cache, so the bytes cross the
// connections (the session channel can copy by resume key between two
// sessions of a user — protocol/session's TestCopyRange — but nothing
// here could send it).
func TestCpBetweenMounts(t *testing.T) {
	r := newCopyRig(t)
	a, b := r.mount(t), r.mount(t)
	data := writeRandom(t, filepath.Join(r.dir, "f"), 4<<20+3)
	run(t, "cp", filepath.Join(a, "f"), filepath.Join(b, "g"))
	sameFile(t, "the copy on the export", filepath.Join(r.dir, "g"), data)
	sameFile(t, "the copy through the first mount", filepath.Join(a, "g"), data)
}

// TestCpInterrupted: Ctrl-C of a long cp stops the server's copying: cp
// exits, no COPY_RANGE is sent after it, and the copy stays short.
func TestCpInterrupted(t *testing.T) {
	r := newCopyRig(t)
	r.copyCap, r.copyDelay = 1<<20, 20*time.Millisecond // 64 requests, 1.3 s at least
	mnt := r.mount(t)
	const size = 64 << 20
	writeRandom(t, filepath.Join(r.dir, "big"), size)
	cp := testutil.Interruptible("cp", filepath.Join(mnt, "big"), filepath.Join(mnt, "copy"))
	if err := cp.Start(); err != nil {
		t.Fatal(err)
	}
	copied := func() int64 {
		fi, err := os.Stat(filepath.Join(r.dir, "copy"))
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	deadline := time.Now().Add(30 * time.Second)
	for copied() < 4<<20 {
		if time.Now().After(deadline) {
			cp.Process.Kill()
			t.Fatalf("the copy did not start (%d bytes)", copied())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cp.Process.Signal(os.Interrupt)
	if err := cp.Wait(); err == nil {
		t.Fatal("cp finished before its interrupt: the test proves nothing")
	}
	n1, c1 := copied(), r.copies.Load()
	if c1 == 0 {
		t.Fatal("no COPY_RANGE request: cp copied through the client")
	}
	time.Sleep(300 * time.Millisecond)
	if n2, c2 := copied(), r.copies.Load(); n2 != n1 || c2 != c1 {
		t.Errorf("the server kept copying after cp ended: %d → %d bytes, %d → %d requests", n1, n2, c1, c2)
	}
	if n1 >= size {
		t.Errorf("the whole file was copied (%d bytes) despite the interrupt", n1)
	}
}

// statOf is a file's size and 512-byte blocks.
func statOf(t *testing.T, p string) (size, blocks int64) {
	t.Helper()
	st := testutil.Stat(t, p)
	return st.Size, st.Blocks
}

// TestFallocate: fallocate -l, -p and -z on the mount leave the same size,
// block count and bytes as on a file of the export's filesystem; a punch
// shows through the mount's own cache; posix_fallocate moves no data.
func TestFallocate(t *testing.T) {
	r := newCopyRig(t)
	mnt := r.mount(t)
	ref := filepath.Join(t.TempDir(), "ref") // the export's filesystem
	data := writeRandom(t, filepath.Join(r.dir, "f"), 1<<20)
	os.WriteFile(ref, data, 0o644)
	if b, _ := os.ReadFile(filepath.Join(mnt, "f")); !bytes.Equal(b, data) { // cached by the kernel now
		t.Fatal("reading through the mount")
	}
	for _, args := range [][]string{
		{"-l", "8M"},
		{"-p", "-o", "4096", "-l", "65536"},
		{"-z", "-o", "100000", "-l", "65536"},
		{"-n", "-l", "16M"},
	} {
		run(t, "fallocate", append(args, ref)...)
		run(t, "fallocate", append(args, filepath.Join(mnt, "f"))...)
		size, blocks := statOf(t, filepath.Join(r.dir, "f"))
		rsize, rblocks := statOf(t, ref)
		msize, mblocks := statOf(t, filepath.Join(mnt, "f"))
		if size != rsize || blocks != rblocks || msize != rsize || mblocks != rblocks {
			t.Errorf("fallocate %v: export %d bytes %d blocks, mount %d/%d; a local file %d/%d", args, size, blocks, msize, mblocks, rsize, rblocks)
		}
		want, _ := os.ReadFile(ref)
		sameFile(t, "after fallocate "+args[0]+" on the export", filepath.Join(r.dir, "f"), want)
		sameFile(t, "after fallocate "+args[0]+" through the mount", filepath.Join(mnt, "f"), want)
	}
	r.data.Store(0)
	run(t, "fallocate", "-x", "-l", "32M", filepath.Join(mnt, "posix"))
	if size, blocks := statOf(t, filepath.Join(r.dir, "posix")); size != 32<<20 || blocks < 32<<20/512 {
		t.Errorf("posix_fallocate: %d bytes, %d blocks", size, blocks)
	}
	if n := r.data.Load(); n > 0 {
		t.Errorf("posix_fallocate of 32 MiB moved %d bytes of file data", n)
	}
}

// TestSeekData: SEEK_DATA and SEEK_HOLE come from the server, so a file
// whose only data is 64 KiB at 5 GiB says so, and cp --sparse=always
// copies it as a sparse file without reading 5 GiB of zeroes.
func TestSeekData(t *testing.T) {
	r := newCopyRig(t)
	mnt := r.mount(t)
	const at, n = 5 << 30, 64 << 10
	tail := make([]byte, n)
	rand.Read(tail)
	w, _ := os.Create(filepath.Join(r.dir, "sparse"))
	w.WriteAt(tail, at)
	w.Close()

	f, err := os.Open(filepath.Join(mnt, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if pos, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_DATA); err != nil || pos != at {
		t.Errorf("SEEK_DATA = %d, %v; want %d", pos, err, int64(at))
	}
	if pos, err := unix.Seek(int(f.Fd()), at, unix.SEEK_HOLE); err != nil || pos != at+n {
		t.Errorf("SEEK_HOLE from the data = %d, %v; want %d", pos, err, int64(at+n))
	}
	if _, err := unix.Seek(int(f.Fd()), at+n, unix.SEEK_DATA); err != unix.ENXIO {
		t.Errorf("SEEK_DATA past the data: %v, want ENXIO", err)
	}

	r.data.Store(0)
	run(t, "cp", "--sparse=always", filepath.Join(mnt, "sparse"), filepath.Join(mnt, "copy"))
	if moved := r.data.Load(); moved >= 1<<20 {
		t.Errorf("cp --sparse=always moved %d bytes of file data, want < 1 MiB", moved)
	}
	size, blocks := statOf(t, filepath.Join(r.dir, "copy"))
	if size != at+n || blocks*512 > 1<<20 {
		t.Errorf("the copy: %d bytes in %d blocks; want %d bytes, sparse", size, blocks, int64(at+n))
	}
	c, _ := os.Open(filepath.Join(r.dir, "copy"))
	defer c.Close()
	got := make([]byte, n)
	if c.ReadAt(got, at); !bytes.Equal(got, tail) {
		t.Error("the copy's data differs")
	}
}

// TestTmpfile: open(dir, O_TMPFILE), write, then linkat — by
// /proc/self/fd/N with AT_SYMLINK_FOLLOW and by AT_EMPTY_PATH — names the
// file, as on a local filesystem; O_TMPFILE|O_EXCL is never linked.
func TestTmpfile(t *testing.T) {
	r := newCopyRig(t)
	mnt := r.mount(t)
	os.Mkdir(filepath.Join(mnt, "d"), 0o755)
	for _, how := range []string{"proc", "empty-path"} {
		fd, err := unix.Open(filepath.Join(mnt, "d"), unix.O_TMPFILE|unix.O_RDWR, 0o640)
		if err != nil {
			t.Fatalf("O_TMPFILE: %v", err)
		}
		content := []byte("unnamed, then " + how)
		if _, err := unix.Write(fd, content); err != nil {
			t.Fatal(err)
		}
		if ents, _ := os.ReadDir(filepath.Join(r.dir, "d")); len(ents) != 0 && how == "proc" {
			t.Errorf("the unnamed file shows on the export: %v", ents)
		}
		name := filepath.Join(mnt, "d", how)
		if how == "proc" {
			err = unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, name, unix.AT_SYMLINK_FOLLOW)
		} else {
			err = unix.Linkat(fd, "", unix.AT_FDCWD, name, unix.AT_EMPTY_PATH)
		}
		if err != nil {
			t.Fatalf("linkat (%s): %v", how, err)
		}
		// Still open: more writes land in the named file.
		unix.Write(fd, []byte("!"))
		unix.Close(fd)
		want := append(content, '!')
		sameFile(t, how+" on the export", filepath.Join(r.dir, "d", how), want)
		sameFile(t, how+" through the mount", name, want)
		if fi, err := os.Stat(filepath.Join(r.dir, "d", how)); err != nil || fi.Mode().Perm() != 0o640 {
			t.Errorf("%s: %v, %v; want mode 0640", how, fi.Mode(), err)
		}
	}
	fd, err := unix.Open(filepath.Join(mnt, "d"), unix.O_TMPFILE|unix.O_RDWR|unix.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, filepath.Join(mnt, "d", "never"), unix.AT_SYMLINK_FOLLOW); err != syscall.ENOENT {
		t.Errorf("linkat of an O_EXCL tmpfile: %v, want ENOENT", err)
	}
}

// TestTmpfileOwner: on a mount whose account (root, as the test server
// acts) shows as 4242:4343, an O_TMPFILE file shows as that user from the
// open on — fstat before it has a name answers from the attributes the
// open returned (cached for the hour the mount trusts them) — and still
// once linked; on the server it is the account's.
func TestTmpfileOwner(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	ids := NewIDMap(IDMapUser, nil, fakeAccounts{}, nil)
	acct := Account{Name: "root", Uid: 0, Gid: 0, Groups: []uint32{}}
	ids.Bind(4242, 4343, acct)
	ids.ActAsForAll(acct)
	mnt, _, _ := lwioMountWith(t, dir, client.Interrupt, Options{Owners: ids, AttrTimeout: time.Hour, EntryTimeout: time.Hour})
	fd, err := unix.Open(filepath.Join(mnt, "d"), unix.O_TMPFILE|unix.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("O_TMPFILE: %v", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 4242 || st.Gid != 4343 {
		t.Errorf("the unnamed file shows as %d:%d, want 4242:4343", st.Uid, st.Gid)
	}
	name := filepath.Join(mnt, "d", "named")
	if err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, name, unix.AT_SYMLINK_FOLLOW); err != nil {
		t.Fatalf("linkat: %v", err)
	}
	if st := testutil.Lstat(t, name); st.Uid != 4242 || st.Gid != 4343 {
		t.Errorf("once linked it shows as %d:%d, want 4242:4343", st.Uid, st.Gid)
	}
	if st := testutil.Lstat(t, filepath.Join(dir, "d", "named")); st.Uid != 0 || st.Gid != 0 {
		t.Errorf("on the server it is %d:%d, want the account's 0:0", st.Uid, st.Gid)
	}
}

// TestServerSideInvalidates: after a server-side copy or punch, the mount
// that did it reads the new bytes, never its cached old ones; another
// mount sees them at its next open (close-to-open: its mtime moved).
// While the other mount holds the file open its cached pages are only
// dropped by a lease break (issue 15), which calls Node.Invalidate.
func TestServerSideInvalidates(t *testing.T) {
	r := newCopyRig(t)
	a, b := r.mount(t), r.mount(t)
	old := writeRandom(t, filepath.Join(r.dir, "dst"), 1<<20)
	fresh := writeRandom(t, filepath.Join(r.dir, "src"), 1<<20)
	for _, m := range []string{a, b} {
		sameFile(t, "before", filepath.Join(m, "dst"), old) // cached in both
	}
	time.Sleep(20 * time.Millisecond) // mtimes are as coarse as a clock tick

	src, _ := os.Open(filepath.Join(a, "src"))
	defer src.Close()
	dst, _ := os.OpenFile(filepath.Join(a, "dst"), os.O_RDWR, 0)
	defer dst.Close()
	var so, do int64
	if n, err := unix.CopyFileRange(int(src.Fd()), &so, int(dst.Fd()), &do, 1<<20, 0); err != nil || n != 1<<20 {
		t.Fatalf("copy_file_range = %d, %v", n, err)
	}
	got := make([]byte, 1<<20)
	if _, err := dst.ReadAt(got, 0); err != nil || !bytes.Equal(got, fresh) {
		t.Fatalf("the copying mount reads its old cached bytes after the copy (%v)", err)
	}
	sameFile(t, "the other mount after the copy", filepath.Join(b, "dst"), fresh)

	time.Sleep(20 * time.Millisecond)
	if err := unix.Fallocate(int(dst.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 4096, 8192); err != nil {
		t.Fatal(err)
	}
	want := append([]byte{}, fresh...)
	clear(want[4096 : 4096+8192])
	if _, err := dst.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the punching mount reads its old cached bytes after the punch (%v)", err)
	}
	sameFile(t, "the other mount after the punch", filepath.Join(b, "dst"), want)
}

// TestInvalidateHook: Node.Invalidate — what a lease break calls for a
// change made elsewhere — drops the kernel's cached pages of a file held
// open, which nothing else would (same size, same mtime).
func TestInvalidateHook(t *testing.T) {
	r := newCopyRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rc, err := NewReconnector(ctx, dialer(r.srv.SessionAddr(), client.Interrupt), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	root := NewRoot(rc, rc, Options{AttrTimeout: time.Hour, EntryTimeout: time.Hour})
	mnt := t.TempDir()
	srv, err := gofs.Mount(mnt, root, root.fs.opts.MountOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })

	p := filepath.Join(r.dir, "f")
	old := writeRandom(t, p, 64<<10)
	fi, _ := os.Stat(p)
	f, err := os.Open(filepath.Join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, len(old))
	if f.ReadAt(got, 0); !bytes.Equal(got, old) {
		t.Fatal("first read")
	}
	fresh := writeRandom(t, p, len(old)) // another client's change
	os.Chtimes(p, fi.ModTime(), fi.ModTime())
	if f.ReadAt(got, 0); !bytes.Equal(got, old) {
		t.Fatal("precondition: the kernel did not keep the first read's pages, so there is nothing to invalidate")
	}
	node := root.GetChild("f").Operations().(*Node)
	if errno := node.Invalidate(0, 0); errno != 0 {
		t.Fatalf("Invalidate: %v", errno)
	}
	if f.ReadAt(got, 0); !bytes.Equal(got, fresh) {
		t.Error("after Invalidate the mount still reads its cached pages")
	}
}
