package test

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The POSIX suite's checks of copies, space and holes (issue 23): what a
// program sees of copy_file_range, fallocate and SEEK_DATA/SEEK_HOLE is
// what it sees on a local filesystem.

// testCopyFileRange copies between two files of the directory with
// copy_file_range(2) — what cp does — at offsets, and checks the bytes on
// the filesystem and on the disk under it.
func testCopyFileRange(t *testing.T, e posixEnv) {
	data := pattern(23, 3<<20+5)
	mustWrite(t, filepath.Join(e.Dir, "src"), data)
	src, err := os.Open(filepath.Join(e.Dir, "src"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst := createFile(t, filepath.Join(e.Dir, "dst"))
	var total int
	for total < len(data)-7 {
		so, do := int64(7+total), int64(total)
		n, err := unix.CopyFileRange(int(src.Fd()), &so, int(dst.Fd()), &do, len(data), 0)
		if err != nil {
			t.Fatalf("copy_file_range after %d bytes: %v", total, err)
		}
		if n == 0 {
			t.Fatalf("copy_file_range stopped at %d of %d bytes", total, len(data)-7)
		}
		total += n
	}
	wantContent(t, filepath.Join(e.Dir, "dst"), data[7:])
	if e.Backing != "" {
		wantOnDisk(t, filepath.Join(e.Backing, "dst"), data[7:])
	}
}

// testFallocate runs fallocate(2) modes 0, KEEP_SIZE, PUNCH_HOLE and
// ZERO_RANGE on a file of the directory and on a file of the disk under it
// (when the check can see it), and wants the same size, block count and
// bytes from both.
func testFallocate(t *testing.T, e posixEnv) {
	data := pattern(39, 1<<20)
	p := filepath.Join(e.Dir, "f")
	mustWrite(t, p, data)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ref *os.File
	if e.Backing != "" {
		// A file of the disk under the share, beside (not in) its view.
		rp := e.Backing + ".fallocate-ref"
		mustWrite(t, rp, data)
		t.Cleanup(func() { os.Remove(rp) })
		if ref, err = os.OpenFile(rp, os.O_RDWR, 0); err != nil {
			t.Fatal(err)
		}
		defer ref.Close()
	}
	for _, op := range []struct {
		name      string
		mode      uint32
		off, size int64
	}{
		{"allocate", 0, 0, 8 << 20},
		{"keep-size", unix.FALLOC_FL_KEEP_SIZE, 8 << 20, 4 << 20},
		{"punch", unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE, 4096, 64 << 10},
		{"zero", unix.FALLOC_FL_ZERO_RANGE, 100000, 64 << 10},
	} {
		if err := unix.Fallocate(int(f.Fd()), op.mode, op.off, op.size); err != nil {
			t.Fatalf("fallocate %s: %v", op.name, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		if want := max(int64(len(data)), op.off+op.size); op.mode&unix.FALLOC_FL_KEEP_SIZE == 0 && st.Size < want {
			t.Errorf("fallocate %s: size %d, want at least %d", op.name, st.Size, want)
		}
		if ref == nil {
			continue
		}
		if err := unix.Fallocate(int(ref.Fd()), op.mode, op.off, op.size); err != nil {
			t.Fatalf("fallocate %s on the disk: %v", op.name, err)
		}
		var rst unix.Stat_t
		if err := unix.Fstat(int(ref.Fd()), &rst); err != nil {
			t.Fatal(err)
		}
		if st.Size != rst.Size || st.Blocks != rst.Blocks {
			t.Errorf("fallocate %s: %d bytes in %d blocks, on the disk %d in %d", op.name, st.Size, st.Blocks, rst.Size, rst.Blocks)
		}
		want, err := os.ReadFile(ref.Name())
		if err != nil {
			t.Fatal(err)
		}
		wantContent(t, p, want)
	}
}

// testSeekDataHole asks SEEK_DATA and SEEK_HOLE of a file whose only data
// is 64 KiB at 1 GiB, and wants its layout, not "all data".
func testSeekDataHole(t *testing.T, e posixEnv) {
	const at, n = 1 << 30, 64 << 10
	f := createFile(t, filepath.Join(e.Dir, "sparse"))
	if _, err := f.WriteAt(pattern(40, n), at); err != nil {
		t.Fatal(err)
	}
	fd := int(f.Fd())
	if pos, err := unix.Seek(fd, 0, unix.SEEK_DATA); err != nil || pos != at {
		t.Errorf("SEEK_DATA from 0 = %d, %v; want %d", pos, err, at)
	}
	if pos, err := unix.Seek(fd, 0, unix.SEEK_HOLE); err != nil || pos != 0 {
		t.Errorf("SEEK_HOLE from 0 = %d, %v; want 0", pos, err)
	}
	if pos, err := unix.Seek(fd, at, unix.SEEK_HOLE); err != nil || pos != at+n {
		t.Errorf("SEEK_HOLE from the data = %d, %v; want %d", pos, err, at+n)
	}
	if _, err := unix.Seek(fd, at+n, unix.SEEK_DATA); err != unix.ENXIO {
		t.Errorf("SEEK_DATA past the data: %v, want ENXIO", err)
	}
}
