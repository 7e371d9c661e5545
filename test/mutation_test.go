package test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// TestChecksCatchCorruption shows that the data checks can fail: it mounts,
// in this process, a loopback FUSE filesystem that flips one bit of every
// read covering one file offset, and runs the checks on it. Each must
// report a failure; one that passes there would pass on a broken lwiofs.
func TestChecksCatchCorruption(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short: the mutation run only checks the checks")
	}
	needFUSE(t)
	backing := t.TempDir()
	mnt := mountCorrupting(t, backing, poisonOffset)
	checks := map[string]func(tb testing.TB){
		"RandomModel": func(tb testing.TB) { testRandomModel(tb, mnt, "") },
		"DirectModel": func(tb testing.TB) { testDirectModel(tb, mnt, "") },
		"WholeFile": func(tb testing.TB) {
			data := pattern(1, 3<<20)
			mustWrite(tb, filepath.Join(mnt, "whole"), data)
			wantContent(tb, filepath.Join(mnt, "whole"), data)
		},
		"FIOVerifySeqBuffered": func(tb testing.TB) {
			needTool(tb, "fio")
			fioVerify(tb, mnt, fioCase{rw: "write", engine: "psync", bs: "1m", size: "8m", iodepth: 1})
		},
		"FIOVerifySeqDirect": func(tb testing.TB) {
			needTool(tb, "fio")
			fioVerify(tb, mnt, fioCase{rw: "write", engine: "psync", direct: true, bs: "1m", size: "8m", iodepth: 1})
		},
	}
	for name, check := range checks {
		t.Run(name, func(t *testing.T) {
			rec := &failRecorder{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				check(rec)
			}()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				t.Fatalf("the check is still running after 2 minutes")
			}
			switch {
			case rec.skipped != "":
				t.Skip(rec.skipped)
			case !rec.failed:
				t.Errorf("the check passed on a filesystem that corrupts every read at offset %d", poisonOffset)
			default:
				t.Logf("caught, as it must be: %s", firstLine(rec.msg))
			}
		})
	}
}

// poisonOffset is the file offset whose byte the corrupting filesystem
// flips on every read: inside the first few MiB every check writes.
const poisonOffset = 1<<20 + 12345

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// failRecorder is a testing.TB whose failures are recorded instead of
// failing the test; Fatal and Skip end the calling goroutine, as they do
// on a real T.
type failRecorder struct {
	testing.TB
	mu      sync.Mutex
	failed  bool
	skipped string
	msg     string
}

func (r *failRecorder) record(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.failed {
		r.msg = msg
	}
	r.failed = true
}

func (r *failRecorder) Helper()                        {}
func (r *failRecorder) Fail()                          { r.record("Fail") }
func (r *failRecorder) FailNow()                       { r.record("FailNow"); runtime.Goexit() }
func (r *failRecorder) Error(a ...any)                 { r.record(fmt.Sprint(a...)) }
func (r *failRecorder) Errorf(format string, a ...any) { r.record(fmt.Sprintf(format, a...)) }
func (r *failRecorder) Fatal(a ...any)                 { r.record(fmt.Sprint(a...)); runtime.Goexit() }
func (r *failRecorder) Fatalf(format string, a ...any) {
	r.record(fmt.Sprintf(format, a...))
	runtime.Goexit()
}
func (r *failRecorder) Skip(a ...any) { r.skipped = fmt.Sprint(a...); runtime.Goexit() }
func (r *failRecorder) Skipf(format string, a ...any) {
	r.skipped = fmt.Sprintf(format, a...)
	runtime.Goexit()
}
func (r *failRecorder) SkipNow()      { r.skipped = "SkipNow"; runtime.Goexit() }
func (r *failRecorder) Failed() bool  { r.mu.Lock(); defer r.mu.Unlock(); return r.failed }
func (r *failRecorder) Skipped() bool { return r.skipped != "" }

// corruptNode is go-fuse's loopback node whose files corrupt reads.
type corruptNode struct {
	gofs.LoopbackNode
	poison int64
}

func (n *corruptNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return fh, fl, errno
	}
	return &corruptFile{LoopbackFile: fh.(*gofs.LoopbackFile), poison: n.poison}, fl, 0
}

func (n *corruptNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return in, fh, fl, errno
	}
	return in, &corruptFile{LoopbackFile: fh.(*gofs.LoopbackFile), poison: n.poison}, fl, 0
}

// corruptFile flips the low bit of the byte at poison in every read that
// covers it.
type corruptFile struct {
	*gofs.LoopbackFile
	poison int64
}

func (f *corruptFile) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	res, errno := f.LoopbackFile.Read(ctx, buf, off)
	if errno != 0 {
		return res, errno
	}
	b, status := res.Bytes(buf)
	if !status.Ok() {
		return nil, syscall.EIO
	}
	out := append([]byte(nil), b...)
	res.Done()
	if f.poison >= off && f.poison < off+int64(len(out)) {
		out[f.poison-off] ^= 1
	}
	return fuse.ReadResultData(out), 0
}

// corruptFSEnv, when set, makes the test binary serve the corrupting
// filesystem over the directory it names instead of running tests (see
// TestMain): the mount then lives in its own process, which unmounts on
// SIGTERM and gets one if this test binary dies.
const corruptFSEnv = "LWIOFS_TEST_CORRUPTFS"

// mountCorrupting mounts dir with the corrupting loopback, served by this
// test binary re-executed, until the test ends.
func mountCorrupting(t *testing.T, dir string, poison int64) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	p := startProc(t, "corruptfs", []string{corruptFSEnv + "=" + dir, fmt.Sprintf("LWIOFS_TEST_POISON=%d", poison)},
		self, "-test.run=^$", mnt)
	waitMounted(t, p, mnt, dir)
	return mnt
}

// serveCorruptFS mounts the corrupting loopback of dir at mnt and serves it
// until SIGTERM or SIGINT; it returns the exit code.
func serveCorruptFS(dir, mnt string) int {
	poison, err := strconv.ParseInt(os.Getenv("LWIOFS_TEST_POISON"), 10, 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "corruptfs: LWIOFS_TEST_POISON: %v\n", err)
		return 2
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		fmt.Fprintf(os.Stderr, "corruptfs: %v\n", err)
		return 1
	}
	root := &gofs.LoopbackRoot{Path: dir, Dev: uint64(st.Dev)}
	root.NewNode = func(r *gofs.LoopbackRoot, _ *gofs.Inode, _ string, _ *syscall.Stat_t) gofs.InodeEmbedder {
		return &corruptNode{LoopbackNode: gofs.LoopbackNode{RootData: r}, poison: poison}
	}
	rootNode := root.NewNode(root, nil, "", &st)
	root.RootNode = rootNode
	zero := time.Duration(0)
	server, err := gofs.Mount(mnt, rootNode, &gofs.Options{
		AttrTimeout: &zero, EntryTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			FsName: "corrupt", Name: "corrupt", DirectMount: true,
			MaxWrite: 1 << 20, DisabledCapabilities: fuse.CAP_PASSTHROUGH,
		},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "corruptfs: mount %s: %v\n", mnt, err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-sig
		if err := server.Unmount(); err != nil {
			fmt.Fprintf(os.Stderr, "corruptfs: unmount: %v\n", err)
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
			os.Exit(1)
		}
	}()
	server.Wait()
	return 0
}
