package fs

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/protocol/share"
	"golang.org/x/sys/unix"
)

// slowFile is a registered file whose writes take a while on the server,
// and that counts how many run at once; failAt makes a write at that
// offset fail with STATUS_DISK_FULL.
type slowFile struct {
	share.File
	delay   time.Duration
	failAt  int64
	running atomic.Int32
	most    atomic.Int32
}

func (f *slowFile) WriteAt(p []byte, off int64) (int, error) {
	n := f.running.Add(1)
	defer f.running.Add(-1)
	for m := f.most.Load(); n > m && !f.most.CompareAndSwap(m, n); m = f.most.Load() {
	}
	if f.delay > 0 {
		// Random, so that writes in flight together finish in any order.
		time.Sleep(f.delay/2 + time.Duration(mrand.Int64N(int64(f.delay))))
	}
	if f.failAt >= 0 && off == f.failAt {
		return 0, protocol.StatusDiskFull
	}
	return f.File.WriteAt(p, off)
}

// writeBehindMount mounts a server whose files are slowFiles made by mk,
// with opts.
func writeBehindMount(t *testing.T, opts Options, mk func(share.File) *slowFile) (dir, mnt string, files func() []*slowFile) {
	t.Helper()
	needFUSE(t)
	dir = t.TempDir()
	var mu sync.Mutex
	var made []*slowFile
	srv := serveWrapped(t, dir, "127.0.0.1:0", "127.0.0.1:0", func(f share.File) share.File {
		sf := mk(f)
		mu.Lock()
		made = append(made, sf)
		mu.Unlock()
		return sf
	})
	s := dialed(t, srv.SessionAddr())
	return dir, mountWith(t, s.Tree, s.Data, opts), func() []*slowFile {
		mu.Lock()
		defer mu.Unlock()
		return append([]*slowFile(nil), made...)
	}
}

// dialed dials the server's session at addr as a mount does (dialer),
// closed when the test ends.
func dialed(t *testing.T, addr string) *Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := dialer(addr, client.Interrupt)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A buffered sequential writer keeps several WRITEs in flight (the
// server sees them at once), and close(2) returns only once all of them
// are on the server's disk: close-to-open holds.
func TestWriteBehind(t *testing.T) {
	dir, mnt, files := writeBehindMount(t, Options{}, func(f share.File) *slowFile {
		return &slowFile{File: f, delay: 20 * time.Millisecond, failAt: -1}
	})
	data := make([]byte, 8<<20)
	rand.Read(data)
	f, err := os.Create(filepath.Join(mnt, "seq"))
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(data); off += 1 << 20 {
		if _, err := f.Write(data[off : off+1<<20]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// No sleep, no sync: close has returned, the disk must hold it all.
	if got, _ := os.ReadFile(filepath.Join(dir, "seq")); !bytes.Equal(got, data) {
		t.Fatalf("server disk holds %d bytes after close, want the %d written", len(got), len(data))
	}
	most := int32(0)
	for _, sf := range files() {
		most = max(most, sf.most.Load())
	}
	if most < 2 {
		t.Errorf("at most %d WRITE ran at once on the server: the writer waited for each", most)
	}

	t.Run("stat sees the writes", func(t *testing.T) {
		f, err := os.OpenFile(filepath.Join(mnt, "grow"), os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for i := 0; i < 4; i++ {
			if _, err := f.Write(data[:1<<20]); err != nil {
				t.Fatal(err)
			}
		}
		// Straight from the server, not the kernel's cache.
		fi, err := os.Stat(filepath.Join(dir, "grow"))
		if err != nil {
			t.Fatal(err)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(mnt, "grow"), &st); err != nil || st.Size != 4<<20 {
			t.Fatalf("stat through the mount: %d bytes, %v; want 4 MiB (the server had %d when asked)", st.Size, err, fi.Size())
		}
	})

	t.Run("overlapping writes keep their order", func(t *testing.T) {
		f, err := os.OpenFile(filepath.Join(mnt, "over"), os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		for i := byte(1); i <= 5; i++ {
			if _, err := f.WriteAt(bytes.Repeat([]byte{i}, 64<<10), 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "over")); !bytes.Equal(got, bytes.Repeat([]byte{5}, 64<<10)) {
			t.Fatalf("after five writes over one range the server holds %v…, want the last", got[:4])
		}
	})
}

// A write that fails on the server after the kernel was answered fails the
// file's close(2) (and is reported once).
func TestWriteBehindFailureAtClose(t *testing.T) {
	_, mnt, _ := writeBehindMount(t, Options{}, func(f share.File) *slowFile {
		return &slowFile{File: f, failAt: 2 << 20}
	})
	f, err := os.Create(filepath.Join(mnt, "full"))
	if err != nil {
		t.Fatal(err)
	}
	block := make([]byte, 1<<20)
	var werr error
	for i := 0; i < 4 && werr == nil; i++ {
		_, werr = f.Write(block)
	}
	cerr := f.Close()
	if err := errors.Join(werr, cerr); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write errors %v, close %v; want ENOSPC from one of them", werr, cerr)
	}
}

// TestUnlockAfterFailedPostedWrite: releasing a lock after a write(2)
// whose posted WRITE then fails on the server (disk full) releases the
// lock on the server all the same — another descriptor can take it — and
// reports the failure; close(2) reports it again. The unlock used to
// return before sending the UNLOCK (the lock stayed held until the last
// close, other clients got EAGAIN) and to clear the failure, so close
// returned 0.
func TestUnlockAfterFailedPostedWrite(t *testing.T) {
	_, mnt, _ := writeBehindMount(t, Options{NoLeases: true}, func(f share.File) *slowFile {
		return &slowFile{File: f, failAt: 0}
	})
	p := filepath.Join(mnt, "locked")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := ofd(f, unix.F_WRLCK, 0, 1, false); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err != nil {
		t.Fatal(err) // posted: the failure comes later
	}
	uerr := ofd(f, unix.F_UNLCK, 0, 1, false)
	g, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	lerr := ofd(g, unix.F_WRLCK, 0, 1, false)
	cerr := f.Close()
	if !errors.Is(uerr, syscall.ENOSPC) || lerr != nil || !errors.Is(cerr, syscall.ENOSPC) {
		t.Fatalf("unlock: %v (want ENOSPC); another descriptor's lock then: %v (want it taken); close: %v (want ENOSPC)", uerr, lerr, cerr)
	}
}

// TestBreakWaitsForPostedWrites: a Write lease's break is acknowledged
// only once the writer's posted writes (write-behind over LWIO,
// writeasync.go) are on the server. Another mount that looks the file up
// and reads it while it is still open for writing recalls the lease, and
// then reads every byte the writer's write(2)s returned for — not a file
// short of the writes still in flight.
func TestBreakWaitsForPostedWrites(t *testing.T) {
	_, a, b, _, _, ra, _ := leaseRoots(t, Options{})
	f, err := os.OpenFile(filepath.Join(a, "big"), os.O_CREATE|os.O_RDWR|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte("abcdefgh"), (1<<20)/8)
	const chunks = 8
	for i := range chunks {
		if _, err := f.WriteAt(chunk, int64(i)<<20); err != nil {
			t.Fatal(err)
		}
	}
	ch := ra.EmbeddedInode().GetChild("big")
	if ch == nil {
		t.Fatal("mount a does not know the file it created")
	}
	if !ch.Operations().(*Node).holdsWrite() {
		t.Fatal("mount a holds no Write lease on the file it created and has open")
	}
	got, err := os.ReadFile(filepath.Join(b, "big"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != chunks<<20 {
		t.Fatalf("b reads %d bytes while a has %d written, want all (the break waits for a's posted writes)", len(got), chunks<<20)
	}
	for i := range chunks {
		if !bytes.Equal(got[i<<20:(i+1)<<20], chunk) {
			t.Fatalf("b reads wrong bytes in MiB %d", i)
		}
	}
}

// heldPath is a data path whose posted writes reach the server only when
// they are waited for: a write in flight for as long as the mount lets it.
type heldPath struct{ DataPath }

func (p heldPath) Attach(ctx context.Context, h session.Handle, flags int) (DataFile, error) {
	f, err := p.DataPath.Attach(ctx, h, flags)
	if err != nil {
		return nil, err
	}
	return heldFile{f}, nil
}

type heldFile struct{ DataFile }

func (f heldFile) WriteAsync(_ context.Context, p []byte, off int64) (PendingWrite, error) {
	return &heldWrite{f.DataFile, append([]byte(nil), p...), off}, nil
}

type heldWrite struct {
	f   DataFile
	p   []byte
	off int64
}

func (w *heldWrite) Wait(ctx context.Context) (int, error) { return w.f.WriteAt(ctx, w.p, w.off) }

// heldMount serves a temporary directory and mounts it with opts on a
// heldPath: posted writes reach the server only when waited for.
func heldMount(t *testing.T, opts Options) (dir, mnt string) {
	t.Helper()
	needFUSE(t)
	dir = t.TempDir()
	srv := serveWrapped(t, dir, "127.0.0.1:0", "127.0.0.1:0", func(f share.File) share.File { return f })
	s := dialed(t, srv.SessionAddr())
	return dir, mountWith(t, s.Tree, heldPath{s.Data}, opts)
}

// TestPunchAfterPostedWrite: fallocate(PUNCH_HOLE) after a write(2) on a
// mount without leases punches what the write wrote — the write posted
// over LWIO is on the server before the punch is sent (flushDeferred
// returned before waiting for it when the mount had no leases, and the
// write then landed after the punch: the punched bytes came back).
func TestPunchAfterPostedWrite(t *testing.T) {
	dir, mnt := heldMount(t, Options{NoLeases: true})
	f, err := os.OpenFile(filepath.Join(mnt, "punched"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{7}, 8192), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "punched"))
	if err != nil {
		t.Fatal(err)
	}
	want := append(make([]byte, 4096), bytes.Repeat([]byte{7}, 4096)...)
	if !bytes.Equal(got, want) {
		t.Fatalf("after a write of [0, 8192) then a punch of [0, 4096) the server holds %d bytes, first %d (want 8192, first 0: the posted write landed after the punch)",
			len(got), got[:min(len(got), 1)])
	}
}

// TestDirectWriteAfterPostedWrite: an O_DIRECT write (written through)
// lands after an earlier buffered write(2) of the same bytes through
// another descriptor of the file (posted over LWIO): the server ends with
// the O_DIRECT write's bytes, not the older ones.
func TestDirectWriteAfterPostedWrite(t *testing.T) {
	dir, mnt := heldMount(t, Options{NoLeases: true})
	if err := os.WriteFile(filepath.Join(dir, "d"), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	buffered, err := os.OpenFile(filepath.Join(mnt, "d"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer buffered.Close()
	direct, err := os.OpenFile(filepath.Join(mnt, "d"), os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, err := buffered.WriteAt(bytes.Repeat([]byte{1}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	buf := alignedBuf(4096)
	copy(buf, bytes.Repeat([]byte{2}, 4096))
	if _, err := direct.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*os.File{direct, buffered} {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(filepath.Join(dir, "d"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, buf) {
		t.Fatalf("the server holds %d bytes, first %d; want 4096 of 2 (the O_DIRECT write was overwritten by the earlier posted one)",
			len(got), got[:min(len(got), 1)])
	}
}

// TestUnlockWaitsForPostedWrites: releasing a lock returns only once the
// file's posted writes are on the server, so the next holder — on another
// mount, or reading the server's disk as here — reads what this holder
// wrote under the lock: a write(2)'s, with leases and without, and a
// shared mapping's write-back, which the unlock itself posts
// (TestSharedMappingTwoMounts lost bytes to that one when its WRITE, on a
// data connection, reached the server after the UNLOCK, on the
// session's). Here a posted write is sent only once waited for, so one the
// unlock does not wait for is certainly missing.
func TestUnlockWaitsForPostedWrites(t *testing.T) {
	needFUSE(t)
	check := func(t *testing.T, dir string, round byte, off int) {
		t.Helper()
		// No sleep, no close: the unlock has returned, the disk must hold it.
		got, err := os.ReadFile(filepath.Join(dir, "locked"))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) <= off || got[off] != round {
			t.Fatalf("round %d: after unlock the server holds %d bytes, want byte %d at %d (a posted write outlived the lock)",
				round, len(got), round, off)
		}
	}
	for _, opts := range []Options{{}, {NoLeases: true}} {
		t.Run(fmt.Sprintf("write, noleases=%v", opts.NoLeases), func(t *testing.T) {
			dir, mnt := heldMount(t, opts)
			f, err := os.OpenFile(filepath.Join(mnt, "locked"), os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for round := byte(1); round <= 3; round++ {
				if err := ofd(f, unix.F_WRLCK, 8192, 1, false); err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt(bytes.Repeat([]byte{round}, 4096), 0); err != nil {
					t.Fatal(err)
				}
				if err := ofd(f, unix.F_UNLCK, 8192, 1, false); err != nil {
					t.Fatal(err)
				}
				check(t, dir, round, 0)
			}
		})
	}
	t.Run("shared mapping", func(t *testing.T) {
		dir, mnt := heldMount(t, Options{})
		if err := os.WriteFile(filepath.Join(dir, "locked"), make([]byte, 4096), 0o644); err != nil {
			t.Fatal(err)
		}
		m := startMapper(t, os.O_RDWR, []string{mnt}, filepath.Join(mnt, "locked"))
		for round := byte(1); round <= 3; round++ {
			m.do("lock 0 8192")
			m.do("set 0 100 %d", round)
			m.do("unlock 0 8192")
			check(t, dir, round, 100)
		}
	})
}

// Many files written behind at once on a mount with one LWIO connection:
// 64 files open, each written in lockstep rounds of 128 KiB (interrupt and polling mounts), so that
// every file has writes in flight and none has the 8 that make its writer
// wait for its own. A posted write held one of the connection's 256
// request slots until it was waited for, so the fifth round's writes
// waited for a slot for good and the mount hung (a build writing many
// outputs at once; protocol/client TestWriteBehindManyFilesOneConn is the
// engine's side). close(2) then puts every byte on the server.
func TestWriteBehindManyFilesOneConn(t *testing.T) {
	needFUSE(t)
	for _, mode := range []client.Mode{client.Interrupt, client.Polling} {
		t.Run(mode.String(), func(t *testing.T) { writeBehindManyFiles(t, mode) })
	}
}

func writeBehindManyFiles(t *testing.T, mode client.Mode) {
	const files, rounds, size = 64, 12, 128 << 10
	dir := t.TempDir()
	srv := serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := dialConfig(srv.SessionAddr(), mode)
	cfg.Conns = 1
	s, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	mnt := mountOn(t, s.Tree, s.Data)
	watchdog(t, func() []int { return nil }, mnt)
	fs := make([]*os.File, files)
	data := make([][]byte, files)
	for i := range fs {
		if fs[i], err = os.Create(filepath.Join(mnt, fmt.Sprintf("f%d", i))); err != nil {
			t.Fatal(err)
		}
		data[i] = make([]byte, rounds*size)
		rand.Read(data[i])
	}
	for r := 0; r < rounds; r++ {
		var wg sync.WaitGroup
		errs := make(chan error, files)
		for i, f := range fs {
			wg.Go(func() {
				if _, err := f.Write(data[i][r*size : (r+1)*size]); err != nil {
					errs <- fmt.Errorf("round %d, file %d: %w", r, i, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, f := range fs {
		if err := f.Close(); err != nil {
			t.Fatalf("close of file %d: %v", i, err)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("f%d", i))); !bytes.Equal(got, data[i]) {
			t.Fatalf("the server holds %d bytes of file %d after its close, want the %d written", len(got), i, len(data[i]))
		}
	}
}

// TestUnlockWaitsForPostedWritesBeside: releasing a lock — by F_UNLCK, or
// by a close(2) that drops the process's POSIX locks — also waits for the
// posted writes of the files open beside the locked one: sqlite's WAL
// checkpoint writes database pages under a lock of the -shm file and,
// having copied only part of the WAL, publishes how far it got in the -shm
// without an fsync of the database, so a reader on another mount that took
// the lock next read pages that had not landed ("database disk image is
// malformed", TestSQLiteTwoMounts/WAL). Here a posted write is sent only
// once waited for. An OFD lock or a flock goes with the last close of its
// open file (RELEASE, which the kernel does not wait for): the test waits
// until the server's lock is free, then reads.
func TestUnlockWaitsForPostedWritesBeside(t *testing.T) {
	needFUSE(t)
	for _, opts := range []Options{{}, {NoLeases: true}} {
		for _, how := range []string{"unlock", "close", "close OFD", "close flock"} {
			t.Run(fmt.Sprintf("%s, noleases=%v", how, opts.NoLeases), func(t *testing.T) {
				dir, mnt := heldMount(t, opts)
				for _, name := range []string{"t.db", "t.db-shm"} {
					if err := os.WriteFile(filepath.Join(dir, name), make([]byte, 8192), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				db := openRW(t, filepath.Join(mnt, "t.db"))
				shm := openRW(t, filepath.Join(mnt, "t.db-shm"))
				// A read attaches the data path: the writes are posted
				// then, not held back by a Write lease.
				if _, err := db.ReadAt(make([]byte, 1), 0); err != nil {
					t.Fatal(err)
				}
				for round := byte(1); round <= 3; round++ {
					locked := shm
					var err error
					if how != "unlock" {
						locked, err = os.OpenFile(filepath.Join(mnt, "t.db-shm"), os.O_RDWR, 0)
						if err != nil {
							t.Fatal(err)
						}
					}
					switch how {
					case "close":
						err = posix(locked, unix.F_WRLCK, 121, 1)
					case "close flock":
						err = unix.Flock(int(locked.Fd()), unix.LOCK_EX|unix.LOCK_NB)
					default:
						err = ofd(locked, unix.F_WRLCK, 121, 1, false)
					}
					if err != nil {
						t.Fatal(err)
					}
					if _, err := db.WriteAt(bytes.Repeat([]byte{round}, 4096), 4096); err != nil {
						t.Fatal(err)
					}
					if how == "unlock" {
						err = ofd(shm, unix.F_UNLCK, 121, 1, false)
					} else {
						err = locked.Close()
					}
					if err != nil {
						t.Fatal(err)
					}
					if how == "close OFD" || how == "close flock" {
						serverLockFree(t, filepath.Join(dir, "t.db-shm"), how == "close flock")
					}
					// No sleep: the lock is gone, the next holder reads the disk.
					got, err := os.ReadFile(filepath.Join(dir, "t.db"))
					if err != nil {
						t.Fatal(err)
					}
					if len(got) != 8192 || got[4096] != round {
						t.Fatalf("round %d: after the -shm lock went the server's t.db holds %d bytes, byte 4096 = %d; want %d (a posted write of the file beside outlived the lock)",
							round, len(got), got[min(len(got)-1, 4096)], round)
					}
				}
			})
		}
	}
}

// serverLockFree waits until a process on the server can take, and takes
// and drops, a write lock of byte 121 of path (an OFD lock, or a flock):
// the lock a mount held on it is gone.
func serverLockFree(t *testing.T, path string, flock bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if flock {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		} else {
			err = ofd(f, unix.F_WRLCK, 121, 1, false)
		}
		if err == nil {
			return // closing f drops it
		}
		if time.Now().After(deadline) {
			t.Fatalf("the mount's lock of %s is still held on the server: %v", path, err)
		}
	}
}
