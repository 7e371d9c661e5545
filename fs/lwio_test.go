package fs

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/fileserver"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// serve serves dir as share "s" to user "u" (password "pw"): a whole
// server (fileserver.Start) with the session channel at sessAddr and one
// softrdma listener at lwAddr ("127.0.0.1:0" picks), until the test ends.
// registered, when not nil, counts the files the engine registers.
func serve(t *testing.T, dir, sessAddr, lwAddr string, registered *atomic.Int32) *fileserver.Server {
	t.Helper()
	var wrap func(share.File) share.File
	if registered != nil {
		wrap = func(f share.File) share.File { registered.Add(1); return f }
	}
	return serveWrapped(t, dir, sessAddr, lwAddr, wrap)
}

// serveWrapped is serve with wrap applied to every file the engine
// registers (nil: none).
func serveWrapped(t *testing.T, dir, sessAddr, lwAddr string, wrap func(share.File) share.File) *fileserver.Server {
	t.Helper()
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	cfg := fileserver.Config{
		Session: session.ServerConfig{
			Shares:   []share.Config{{Name: "s", Path: dir, AllowRoot: true}},
			Users:    map[string][16]byte{"u": smbauth.NTHash("pw")},
			Accounts: share.AccountsConfig{Guest: "root"}, // "u" acts as the server (root here)
			Logger:   log,
			// Beside the share, so a server restarted on it finds the
			// key its clients' file identities are sealed with.
			StateDir: dir + ".state",
		},
		Engine:      server.Config{Logger: log},
		SessionAddr: sessAddr,
		Listeners:   []fileserver.Listener{{Provider: soft.New(soft.Options{}), Addr: lwAddr}},
	}
	cfg.WrapFile = wrap
	srv, err := fileserver.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// dialer dials share "s" at addr as user "u" with file data over LWIO on
// softrdma in mode, as lwio-mount does.
func dialer(addr string, mode client.Mode) Dialer {
	cfg := dialConfig(addr, mode)
	return func(ctx context.Context) (*Session, error) { return Dial(ctx, cfg) }
}

// dialConfig is how dialer dials: the share "s" of the server at addr
// over softrdma, LWIO required, in mode.
func dialConfig(addr string, mode client.Mode) DialConfig {
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	return DialConfig{
		Addr:        addr,
		Share:       "s",
		Session:     session.ClientConfig{User: "u", Password: "pw"},
		Providers:   []transport.Provider{soft.New(soft.Options{})},
		RequireRDMA: true,
		Completion:  mode,
		Logger:      log,
	}
}

// lwioMount runs a real server over softrdma in process and mounts the
// share through the LWIO client engine; registered counts the files the
// server registered.
func lwioMount(t *testing.T, dir string, mode client.Mode) (mnt string, registered *atomic.Int32, dp DataPath) {
	t.Helper()
	return lwioMountWith(t, dir, mode, Options{})
}

// lwioMountWith is lwioMount with the mount's options (timeouts and logger
// filled in as mountOn's).
func lwioMountWith(t *testing.T, dir string, mode client.Mode, opts Options) (mnt string, registered *atomic.Int32, dp DataPath) {
	t.Helper()
	needFUSE(t)
	registered = &atomic.Int32{}
	srv := serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", registered)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := dialer(srv.SessionAddr(), mode)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	mnt = mountWith(t, s.Tree, s.Data, opts)
	return mnt, registered, s.Data
}

func needFUSE(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("mounts FUSE")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and /dev/fuse")
	}
}

func mountOn(t *testing.T, tree Tree, dp DataPath) string {
	t.Helper()
	return mountWith(t, tree, dp, Options{})
}

// mountWith is mountOn with opts, its logger filled in and its zero
// timeouts set to a second.
func mountWith(t *testing.T, tree Tree, dp DataPath, opts Options) string {
	t.Helper()
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	mnt := t.TempDir()
	if opts.AttrTimeout == 0 {
		opts.AttrTimeout = time.Second
	}
	if opts.EntryTimeout == 0 {
		opts.EntryTimeout = time.Second
	}
	opts.Logger = log
	srv, err := Mount(mnt, tree, dp, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, ok := aborted.Load(mnt); ok { // by a watchdog: the test has failed
			syscall.Unmount(mnt, syscall.MNT_DETACH)
			return
		}
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return mnt
}

// TestLWIOSmoke mounts through the real engines and moves data both ways:
// buffered, O_DIRECT, identical pages (a COLLAPSE candidate), and a read
// past the end.
func TestLWIOSmoke(t *testing.T) {
	for _, mode := range []client.Mode{client.Interrupt, client.Polling} {
		t.Run(mode.String(), func(t *testing.T) {
			share := t.TempDir()
			mnt, registered, dp := lwioMount(t, share, mode)
			if name := dp.Name(); name != "lwio/softrdma" {
				t.Errorf("data path %q, want lwio/softrdma", name)
			}
			data := make([]byte, 3<<20+123)
			rand.Read(data)
			p := filepath.Join(mnt, "f")
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(filepath.Join(share, "f")); !bytes.Equal(got, data) {
				t.Fatalf("server disk differs after write through the mount")
			}
			// New content written on the server: the next open must not
			// serve the old pages (close-to-open).
			rand.Read(data[:4096])
			if err := os.WriteFile(filepath.Join(share, "f"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read back through the mount: %v, equal %v", err, bytes.Equal(got, data))
			}

			// O_DIRECT: identical pages, then distinct ones.
			fd, err := syscall.Open(filepath.Join(mnt, "d"), syscall.O_CREAT|syscall.O_RDWR|syscall.O_DIRECT, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			buf := alignedBuf(1 << 20)
			for i := range buf {
				buf[i] = byte(i % 4096 % 251)
			}
			if n, err := syscall.Pwrite(fd, buf, 0); err != nil || n != len(buf) {
				t.Fatalf("O_DIRECT write of identical pages: %d %v", n, err)
			}
			rand.Read(buf[:64<<10])
			if n, err := syscall.Pwrite(fd, buf[:64<<10], 1<<20); err != nil || n != 64<<10 {
				t.Fatalf("O_DIRECT write: %d %v", n, err)
			}
			rd := alignedBuf(64 << 10)
			if n, err := syscall.Pread(fd, rd, 1<<20); err != nil || n != 64<<10 || !bytes.Equal(rd, buf[:64<<10]) {
				t.Fatalf("O_DIRECT read: %d %v", n, err)
			}
			if n, err := syscall.Pread(fd, rd, 8<<20); err != nil || n != 0 {
				t.Fatalf("read past EOF: %d %v", n, err)
			}
			syscall.Close(fd)
			disk, _ := os.ReadFile(filepath.Join(share, "d"))
			want := make([]byte, 1<<20)
			for i := range want {
				want[i] = byte(i % 4096 % 251)
			}
			if len(disk) != 1<<20+64<<10 || !bytes.Equal(disk[:1<<20], want) || !bytes.Equal(disk[1<<20:], buf[:64<<10]) {
				t.Fatalf("server disk after O_DIRECT writes: %d bytes, wrong content", len(disk))
			}
			if registered.Load() == 0 {
				t.Errorf("the server registered no file: the data never went over LWIO")
			}
		})
	}
}

// A file's writes go over LWIO from the first byte, and the Fid comes with
// the open (issue 16 item 3): a small file created, written and closed
// through the mount costs no resume key and no REGISTER, and its bytes
// travel as an LWIO WRITE. A handle the server could not register at open
// (no LWIO connection then) still registers by resume key on first use.
// Without leases: under a Write lease the first writes of a new file are
// held back and go in the BATCH at close instead (TestSmallFileUnderWriteLease).
func TestSmallFileWritesOverLWIO(t *testing.T) {
	share := t.TempDir()
	mnt, registered, dp := lwioMountWith(t, share, client.Interrupt, Options{NoLeases: true})
	cl := dp.(*lwioPath).cl
	requests := func() (n uint64) {
		for _, ci := range cl.Conns() {
			n += ci.Requests
		}
		return n
	}
	before, reqs := cl.Stats(), requests()
	for i := range 10 {
		p := filepath.Join(mnt, fmt.Sprintf("small%d", i))
		if err := os.WriteFile(p, []byte(fmt.Sprint("content ", i)), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(filepath.Join(share, fmt.Sprintf("small%d", i))); string(got) != fmt.Sprint("content ", i) {
			t.Fatalf("server disk has %q", got)
		}
	}
	after := cl.Stats()
	if n := after.Registered - before.Registered; n != 0 {
		t.Errorf("%d REGISTER round trips for 10 small files, want 0 (the Fid comes with the open)", n)
	}
	if n := after.Attached - before.Attached; n < 10 {
		t.Errorf("%d Fids from OPEN for 10 written files, want 10", n)
	}
	if n := requests() - reqs; n < 10 {
		t.Errorf("%d LWIO requests for 10 small writes, want at least 10 (every write over LWIO)", n)
	}
	if registered.Load() < 10 {
		t.Errorf("the server registered %d files, want 10", registered.Load())
	}

	t.Run("by resume key", func(t *testing.T) {
		// A handle opened before the data path came up has no Fid.
		tree := dp.(*lwioPath).keys.(*session.Tree)
		tree.RegisterOnOpen(false)
		defer tree.RegisterOnOpen(true)
		before := cl.Stats()
		if err := os.WriteFile(filepath.Join(mnt, "late"), []byte("late"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(filepath.Join(share, "late")); string(got) != "late" {
			t.Fatalf("server disk has %q", got)
		}
		if n := cl.Stats().Registered - before.Registered; n != 1 {
			t.Errorf("%d REGISTERs for a file opened without a Fid, want 1", n)
		}
	})
}

// alignedBuf returns n bytes aligned for O_DIRECT.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := 0
	for addr(b[off:])%4096 != 0 {
		off++
	}
	return b[off : off+n]
}
