package share

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

// open opens rel on the env's tree with flags, closing it with the test.
func (e *env) open(t *testing.T, rel string, flags int) *OpenFile {
	t.Helper()
	f, _, err := e.tr.Open(rel, flags, 0o644)
	if err != nil {
		t.Fatalf("open %s: %v", rel, err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestCopyRange: the server copies between two files of the share; a
// cancelled context still copies one piece and stops there (the bound of
// one request); the end of the source gives a short count, then 0.
func TestCopyRange(t *testing.T) {
	e := newEnv(t, false)
	data := testutil.RandBytes(2*copyPiece + 12345)
	e.writeFile(t, "src", string(data))
	src := e.open(t, "src", os.O_RDONLY)
	dst := e.open(t, "dst", os.O_RDWR|os.O_CREATE)

	n, a, err := dst.CopyRange(context.Background(), src, 100, 7, int64(len(data)))
	if err != nil || n != int64(len(data))-100 || a.Size != uint64(len(data))-93 {
		t.Fatalf("CopyRange = %d, size %d, %v; want %d (to the source's end), size %d", n, a.Size, err, len(data)-100, len(data)-93)
	}
	got, _ := os.ReadFile(filepath.Join(e.share, "dst"))
	if want := append(make([]byte, 7), data[100:]...); !bytes.Equal(got, want) {
		t.Fatalf("copy differs (%d bytes, want %d)", len(got), len(want))
	}
	if n, _, err := dst.CopyRange(context.Background(), src, int64(len(data)), 0, 10); n != 0 || err != nil {
		t.Errorf("CopyRange at the source's end = %d, %v; want 0, nil", n, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, _, err := dst.CopyRange(ctx, src, 0, 0, int64(len(data))); n != copyPiece || err != nil {
		t.Errorf("CopyRange with a cancelled context = %d, %v; want one piece (%d)", n, err, copyPiece)
	}
}

// TestCopyRangeRights: a destination opened read-only, one of a read-only
// share and a source of another share are refused; a source opened
// write-only cannot be read (INVALID_HANDLE, EBADF as locally).
func TestCopyRangeRights(t *testing.T) {
	e := newEnv(t, false)
	e.writeFile(t, "src", "data")
	src := e.open(t, "src", os.O_RDONLY)
	if _, _, err := e.open(t, "src", os.O_RDONLY).CopyRange(context.Background(), src, 0, 0, 4); err != protocol.StatusAccessDenied {
		t.Errorf("copy into a read-only handle: %v, want ACCESS_DENIED", err)
	}
	other := newEnv(t, false)
	if _, _, err := other.open(t, "x", os.O_RDWR|os.O_CREATE).CopyRange(context.Background(), src, 0, 0, 4); err != protocol.StatusNotSameDevice {
		t.Errorf("copy from another share: %v, want NOT_SAME_DEVICE", err)
	}
	wo := e.open(t, "src", os.O_WRONLY)
	if _, _, err := e.open(t, "dst", os.O_RDWR|os.O_CREATE).CopyRange(context.Background(), wo, 0, 0, 4); err != protocol.StatusInvalidHandle {
		t.Errorf("copy from a write-only handle: %v, want INVALID_HANDLE", err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	ro := connect(t, Config{Name: "ro", Path: dir, ReadOnly: true}, false)
	rf, _, err := ro.Open("f", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	if _, _, err := rf.CopyRange(context.Background(), rf, 0, 1, 1); err != protocol.StatusAccessDenied {
		t.Errorf("copy on a read-only share: %v, want ACCESS_DENIED", err)
	}
}

// TestCopyByHand: the copy the kernel refuses (EXDEV between two
// filesystems inside a share) is done by pread/pwrite, bytes for bytes.
func TestCopyByHand(t *testing.T) {
	dir := t.TempDir()
	data := testutil.RandBytes(3*copyByHandBuf + 17)
	os.WriteFile(filepath.Join(dir, "a"), data, 0o644)
	a, _ := os.Open(filepath.Join(dir, "a"))
	defer a.Close()
	b, _ := os.Create(filepath.Join(dir, "b"))
	defer b.Close()
	n, err := copyByHand(int(a.Fd()), int(b.Fd()), 5, 3, int64(len(data)))
	if err != nil || n != int64(len(data))-5 {
		t.Fatalf("copyByHand = %d, %v", n, err)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "b"))
	if !bytes.Equal(got, append(make([]byte, 3), data[5:]...)) {
		t.Error("copy by hand differs")
	}
}

// statOf is the size and 512-byte blocks of a file on the export.
func statOf(t *testing.T, p string) (size, blocks int64) {
	t.Helper()
	st := testutil.Stat(t, p)
	return st.Size, st.Blocks
}

// TestAllocate: each mode does on the share what fallocate(2) does on a
// file beside it; a read-only handle and an unknown mode are refused.
func TestAllocate(t *testing.T) {
	e := newEnv(t, false)
	data := testutil.RandBytes(1 << 20)
	e.writeFile(t, "f", string(data))
	ref := filepath.Join(e.outside, "ref")
	os.WriteFile(ref, data, 0o644)
	rf, _ := os.OpenFile(ref, os.O_RDWR, 0)
	defer rf.Close()
	f := e.open(t, "f", os.O_RDWR)
	for _, op := range []struct {
		mode    uint32
		off, n  int64
		changes bool
	}{
		{0, 0, 4 << 20, true},
		{unix.FALLOC_FL_KEEP_SIZE, 4 << 20, 4 << 20, true},
		{unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE, 4096, 64 << 10, true},
		{unix.FALLOC_FL_ZERO_RANGE, 200000, 100000, true},
		{unix.FALLOC_FL_COLLAPSE_RANGE, 0, 4096, true},
		{unix.FALLOC_FL_INSERT_RANGE, 0, 8192, true},
	} {
		refErr := unix.Fallocate(int(rf.Fd()), op.mode, op.off, op.n)
		a, err := f.Allocate(op.mode, op.off, op.n)
		if refErr != nil {
			// The export's filesystem refuses this mode: so does the share.
			if err != protocol.StatusNotSupported {
				t.Errorf("mode %#x: export says %v, share %v", op.mode, refErr, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("mode %#x: %v", op.mode, err)
		}
		size, blocks := statOf(t, filepath.Join(e.share, "f"))
		rsize, rblocks := statOf(t, ref)
		if size != rsize || blocks != rblocks || int64(a.Size) != size || int64(a.Blocks) != blocks {
			t.Errorf("mode %#x: share size %d blocks %d (attr %d/%d), export %d/%d", op.mode, size, blocks, a.Size, a.Blocks, rsize, rblocks)
		}
		got, _ := os.ReadFile(filepath.Join(e.share, "f"))
		want, _ := os.ReadFile(ref)
		if !bytes.Equal(got, want) {
			t.Errorf("mode %#x: contents differ from the export's", op.mode)
		}
	}
	if _, err := e.open(t, "f", os.O_RDONLY).Allocate(0, 0, 1); err != protocol.StatusAccessDenied {
		t.Errorf("Allocate on a read-only handle: %v, want ACCESS_DENIED", err)
	}
	if _, err := f.Allocate(0x1000, 0, 1); err != protocol.StatusNotSupported {
		t.Errorf("unknown mode: %v, want NOT_SUPPORTED", err)
	}
	if _, err := f.Allocate(0, 0, 0); err != protocol.StatusInvalidParameter {
		t.Errorf("zero length: %v, want INVALID_PARAMETER", err)
	}
}

// TestSeek: SEEK_DATA and SEEK_HOLE come from the server file's layout.
func TestSeek(t *testing.T) {
	e := newEnv(t, false)
	const at = 5 << 30
	w, _ := os.Create(filepath.Join(e.share, "sparse"))
	w.WriteAt(testutil.RandBytes(64<<10), at)
	w.Close()
	f := e.open(t, "sparse", os.O_RDONLY)
	if pos, err := f.Seek(0, unix.SEEK_DATA); err != nil || pos != at {
		t.Errorf("SEEK_DATA from 0 = %d, %v; want %d", pos, err, at)
	}
	if pos, err := f.Seek(at, unix.SEEK_HOLE); err != nil || pos != at+64<<10 {
		t.Errorf("SEEK_HOLE from the data = %d, %v; want %d", pos, err, at+64<<10)
	}
	if _, err := f.Seek(at+64<<10, unix.SEEK_DATA); ntstatus.ToErrno(err) != syscall.ENXIO {
		t.Errorf("SEEK_DATA past the data: %v, want ENXIO", err)
	}
	if _, err := f.Seek(0, unix.SEEK_END); err != protocol.StatusInvalidParameter {
		t.Errorf("SEEK_END: %v, want INVALID_PARAMETER", err)
	}
}

// TestTmpfile: an unnamed file is made in a directory of the share, written,
// and linked into place; the name is confined and must be new; a file
// opened O_TMPFILE|O_EXCL cannot be linked; a read-only share refuses.
func TestTmpfile(t *testing.T) {
	resolvers(t, func(t *testing.T, e *env) {
		os.Mkdir(filepath.Join(e.share, "d"), 0o755)
		f, a, err := e.tr.Tmpfile("d", os.O_RDWR, 0o640)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if a.Mode != syscall.S_IFREG|0o640 {
			t.Errorf("tmpfile mode %o, want 100640", a.Mode)
		}
		if ents, _ := readDir(e.tr, "d"); len(ents) != 0 {
			t.Errorf("the unnamed file shows in its directory: %v", ents)
		}
		f.WriteAt([]byte("hello"), 0)
		if _, err := f.LinkAt("../outside/escaped"); err != protocol.StatusAccessDenied {
			t.Errorf("link outside the share: %v, want ACCESS_DENIED", err)
		}
		if _, err := os.Stat(filepath.Join(e.outside, "escaped")); err == nil {
			t.Fatal("a tmpfile was linked outside the share")
		}
		e.writeFile(t, "d/taken", "x")
		if _, err := f.LinkAt("d/taken"); err != protocol.StatusObjectNameCollision {
			t.Errorf("link over an existing name: %v, want OBJECT_NAME_COLLISION", err)
		}
		la, err := f.LinkAt("d/named")
		if err != nil || la.Nlink != 1 || la.Size != 5 {
			t.Fatalf("LinkAt = %+v, %v", la, err)
		}
		if b, _ := os.ReadFile(filepath.Join(e.share, "d/named")); string(b) != "hello" {
			t.Errorf("linked file holds %q", b)
		}

		x, _, err := e.tr.Tmpfile("", os.O_WRONLY|os.O_EXCL, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer x.Close()
		if _, err := x.LinkAt("never"); err != protocol.StatusObjectNameNotFound {
			t.Errorf("linking an O_EXCL tmpfile: %v, want OBJECT_NAME_NOT_FOUND (ENOENT)", err)
		}
		if _, _, err := e.tr.Tmpfile("d", os.O_RDONLY, 0o600); err != protocol.StatusInvalidParameter {
			t.Errorf("O_TMPFILE read-only: %v, want INVALID_PARAMETER", err)
		}
		if _, _, err := e.tr.Tmpfile("../outside", os.O_RDWR, 0o600); err != protocol.StatusAccessDenied {
			t.Errorf("tmpfile outside the share: %v, want ACCESS_DENIED", err)
		}
	})
	ro := connect(t, Config{Name: "ro", Path: t.TempDir(), ReadOnly: true}, false)
	if _, _, err := ro.Tmpfile("", os.O_RDWR, 0o600); err != protocol.StatusAccessDenied {
		t.Errorf("tmpfile on a read-only share: %v, want ACCESS_DENIED", err)
	}
}
