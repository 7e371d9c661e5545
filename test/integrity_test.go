package test

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// testRandomModel writes and reads random ranges of a file on the mount and
// of a model file on local disk, in lock step, and compares every read, the
// whole file after reopening, and the server's copy on disk.
func testRandomModel(t testing.TB, dir, backing string) {
	const (
		span  = 12 << 20 // offsets land below this
		maxIO = 300 << 10
		ops   = 600
	)
	rng := rand.New(rand.NewSource(42))
	path := filepath.Join(dir, "model-target")
	modelPath := filepath.Join(t.TempDir(), "model")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := os.OpenFile(modelPath, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	buf := make([]byte, maxIO)
	got, want := make([]byte, maxIO), make([]byte, maxIO)
	for i := 0; i < ops; i++ {
		off := rng.Int63n(span)
		n := 1 + rng.Intn(maxIO)
		if rng.Intn(3) == 0 { // page-aligned I/O too, the common case
			off &^= 4095
			n = (n + 4095) &^ 4095
		}
		switch op := rng.Intn(10); {
		case op < 5:
			rng.Read(buf[:n])
			if _, err := f.WriteAt(buf[:n], off); err != nil {
				t.Fatalf("op %d: write %d@%d: %v", i, n, off, err)
			}
			if _, err := m.WriteAt(buf[:n], off); err != nil {
				t.Fatal(err)
			}
		case op < 9:
			gn, gerr := f.ReadAt(got[:n], off)
			wn, _ := m.ReadAt(want[:n], off)
			if gn != wn || !bytes.Equal(got[:gn], want[:wn]) {
				t.Fatalf("op %d: read %d@%d: got %d bytes (%v), want %d; first difference at %d",
					i, n, off, gn, gerr, wn, firstDiff(got[:gn], want[:wn]))
			}
		default:
			size := rng.Int63n(span)
			if err := f.Truncate(size); err != nil {
				t.Fatalf("op %d: ftruncate %d: %v", i, size, err)
			}
			if err := m.Truncate(size); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	model, err := os.ReadFile(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	wantContent(t, path, model)
	if backing != "" {
		wantOnDisk(t, filepath.Join(backing, "model-target"), model)
	}
}

// alignedBuf returns n bytes aligned for O_DIRECT (mmap'd: page aligned).
func alignedBuf(t testing.TB, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// testDirectModel is testRandomModel with O_DIRECT and 4 KiB-aligned I/O,
// the path that skips the page cache and reaches the server one request
// per call.
func testDirectModel(t testing.TB, dir, backing string) {
	const (
		span = 8 << 20
		ops  = 400
	)
	rng := rand.New(rand.NewSource(7))
	path := filepath.Join(dir, "direct-target")
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_RDWR|unix.O_TRUNC|unix.O_DIRECT, 0o644)
	if err != nil {
		t.Fatalf("open O_DIRECT: %v", err)
	}
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	}()
	model := make([]byte, span)
	buf := alignedBuf(t, 1<<20)
	for i := 0; i < ops; i++ {
		off := rng.Int63n(span/4096) * 4096
		n := (1 + rng.Intn(256)) * 4096
		if off+int64(n) > span {
			n = int(span - off)
		}
		if rng.Intn(2) == 0 {
			rng.Read(buf[:n])
			w, err := unix.Pwrite(fd, buf[:n], off)
			if err != nil || w != n {
				t.Fatalf("op %d: O_DIRECT pwrite %d@%d = %d, %v", i, n, off, w, err)
			}
			copy(model[off:], buf[:n])
		} else {
			r, err := unix.Pread(fd, buf[:n], off)
			if err != nil {
				t.Fatalf("op %d: O_DIRECT pread %d@%d: %v", i, n, off, err)
			}
			// The file may be shorter than span until the last block is written.
			if !bytes.Equal(buf[:r], model[off:off+int64(r)]) {
				t.Fatalf("op %d: O_DIRECT pread %d@%d differs at %d", i, n, off, firstDiff(buf[:r], model[off:off+int64(r)]))
			}
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	want := model[:st.Size]
	if err := unix.Close(fd); err != nil {
		t.Fatalf("close: %v", err)
	}
	fd = -1
	wantContent(t, path, want)
	if backing != "" {
		wantOnDisk(t, filepath.Join(backing, "direct-target"), want)
	}
}

// fioCase is one fio --verify run.
type fioCase struct {
	rw      string // write or randwrite
	engine  string // psync or io_uring
	direct  bool
	bs      string
	size    string
	iodepth int
	numjobs int // 0 or 1: one job on one file; more: one file per job, at once
}

func (c fioCase) name() string {
	mode := "buffered"
	if c.direct {
		mode = "direct"
	}
	if c.numjobs > 1 {
		return fmt.Sprintf("%s-%s-%s-%djobs", c.rw, c.engine, mode, c.numjobs)
	}
	return fmt.Sprintf("%s-%s-%s", c.rw, c.engine, mode)
}

// fioCases is the verification matrix: sequential and random writes, psync
// and io_uring, buffered and O_DIRECT.
func fioCases() []fioCase {
	var cs []fioCase
	for _, rw := range []string{"write", "randwrite"} {
		for _, engine := range []string{"psync", "io_uring"} {
			for _, direct := range []bool{false, true} {
				c := fioCase{rw: rw, engine: engine, direct: direct, bs: "1m", size: "48m", iodepth: 1}
				if rw == "randwrite" {
					c.bs, c.size = "4k", "16m"
				}
				if engine == "io_uring" {
					c.iodepth = 16
				}
				cs = append(cs, c)
			}
		}
	}
	// Four writers at once, each at queue depth 16 on its own file: many
	// requests in flight on the mount's connections and credits.
	cs = append(cs, fioCase{rw: "randwrite", engine: "io_uring", direct: true, bs: "16k", size: "8m", iodepth: 16, numjobs: 4})
	return cs
}

// ioURingWorks tells whether fio's io_uring engine runs on local disk here;
// when it does not, the kernel forbids it and the mount is not to blame.
func ioURingWorks(t testing.TB) (bool, string) {
	dir := t.TempDir()
	out, err := exec.Command("fio", "--name=probe", "--directory="+dir, "--size=64k", "--bs=4k",
		"--rw=write", "--ioengine=io_uring", "--output-format=terse").CombinedOutput()
	if err != nil {
		return false, fmt.Sprintf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return true, ""
}

// runFIOVerify runs each case in dir as a subtest: fio writes with crc32c
// checksums in every block, then reads everything back and verifies; any
// mismatch makes fio exit non-zero.
func runFIOVerify(t *testing.T, dir string, cases []fioCase) {
	needTool(t, "fio")
	uring, why := ioURingWorks(t)
	for _, c := range cases {
		t.Run(c.name(), func(t *testing.T) {
			if c.engine == "io_uring" && !uring {
				t.Skipf("SKIP: fio's io_uring engine fails on local disk here too: %s", why)
			}
			fioVerify(t, dir, c)
		})
	}
}

func fioVerify(t testing.TB, dir string, c fioCase) {
	direct := "0"
	if c.direct {
		direct = "1"
	}
	args := []string{"--name=" + c.name(), "--directory=" + dir}
	if c.numjobs > 1 {
		args = append(args, fmt.Sprintf("--numjobs=%d", c.numjobs))
	} else {
		args = append(args, "--filename="+c.name()+".dat")
	}
	args = append(args,
		"--rw="+c.rw, "--bs="+c.bs, "--size="+c.size,
		"--ioengine="+c.engine, fmt.Sprintf("--iodepth=%d", c.iodepth), "--direct="+direct,
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_dump=0",
		"--mem=mmap", "--iomem_align=2m", "--randrepeat=0",
		"--output-format=normal",
	)
	out := runCmd(t, dir, nil, "fio", args...)
	if strings.Contains(out, "verify:") && strings.Contains(out, "bad") {
		t.Fatalf("fio reported a verification failure:\n%s", tail(out, 8<<10))
	}
	files, _ := filepath.Glob(filepath.Join(dir, c.name()+"*"))
	if len(files) < max(c.numjobs, 1) {
		t.Errorf("fio left %d files, want %d: %v", len(files), max(c.numjobs, 1), files)
	}
	for _, f := range files {
		if err := os.Remove(f); err != nil {
			t.Errorf("remove fio file: %v", err)
		}
	}
}
