package fs

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// authority adapts the session server to the engine's Authority (the two
// packages each name their File interface).
type authority struct {
	s atomic.Pointer[session.Server]
}

func (a *authority) SessionByKey(key [16]byte) (uint64, []byte, bool) {
	return a.s.Load().SessionByKey(key)
}

func (a *authority) OpenByResumeKey(id uint64, key [24]byte) (server.File, error) {
	return a.s.Load().OpenByResumeKey(id, key)
}

// countingKeys counts resume-key requests: one per LWIO registration.
type countingKeys struct {
	ResumeKeyer
	n atomic.Int32
}

func (c *countingKeys) RequestResumeKey(ctx context.Context, h session.Handle) (protocol.ResumeKeyResponse, error) {
	c.n.Add(1)
	return c.ResumeKeyer.RequestResumeKey(ctx, h)
}

// testServers is a session server and an LWIO engine on softrdma, run in
// process.
type testServers struct {
	engine           *server.Server
	sess             *session.Server
	sessAddr, lwAddr string
}

// startServers serves dir as "s" to user u (password pw) on the given
// addresses ("127.0.0.1:0" picks).
func startServers(t *testing.T, dir, sessAddr, lwAddr string) *testServers {
	t.Helper()
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	auth := &authority{}
	engine, err := server.New(server.Config{Authority: auth, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	l, err := engine.Listen(soft.New(soft.Options{}), lwAddr)
	if err != nil {
		t.Fatal(err)
	}
	in, err := transport.InstanceFor(l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	sess, err := session.NewServer(session.ServerConfig{
		Shares:    []share.Config{{Name: "s", Path: dir}},
		Users:     map[string][16]byte{"u": smbauth.NTHash("pw")},
		Providers: []transport.ProviderInfo{{Name: soft.Name, Instances: []transport.Instance{in}}},
		Logger:    log,
	})
	if err != nil {
		t.Fatal(err)
	}
	auth.s.Store(sess)
	go engine.Serve(l)
	nl, err := net.Listen("tcp", sessAddr)
	if err != nil {
		t.Fatal(err)
	}
	go sess.Serve(nl)
	s := &testServers{engine: engine, sess: sess, sessAddr: nl.Addr().String(), lwAddr: l.Addr()}
	t.Cleanup(s.stop)
	return s
}

func (s *testServers) stop() { s.engine.Close(); s.sess.Close() }

// testDialer connects a Session to the servers at sessAddr: session setup,
// tree connect, negotiate, LWIO client in mode. keys, when not nil,
// counts resume-key requests.
func testDialer(sessAddr string, mode client.Mode, keys *countingKeys) Dialer {
	return func(ctx context.Context) (*Session, error) {
		log := logrus.New()
		log.SetLevel(logrus.ErrorLevel)
		c, err := session.Dial(ctx, sessAddr, session.ClientConfig{User: "u", Password: "pw"})
		if err != nil {
			return nil, err
		}
		tree, err := c.TreeConnect(ctx, "s")
		if err != nil {
			c.Close()
			return nil, err
		}
		cl, err := client.New(ctx, client.Config{
			Providers:  []transport.Provider{soft.New(soft.Options{})},
			Negotiate:  tree.Negotiate,
			SessionID:  c.SessionID(),
			SigningKey: c.SessionKey(),
			Completion: mode,
			Logger:     log,
		})
		if err != nil {
			c.Close()
			return nil, err
		}
		var rk ResumeKeyer = tree
		if keys != nil {
			keys.ResumeKeyer = tree
			rk = keys
		}
		done := make(chan struct{})
		go func() {
			select {
			case <-c.Done():
			case <-cl.Done():
			}
			close(done)
		}()
		return &Session{
			Tree: tree, Data: LWIODataPath(rk, cl, nil, log), Done: done,
			Close: func() error { cl.Close(); return c.Close() },
		}, nil
	}
}

// lwioMount runs a real session server and LWIO engine over softrdma in
// process and mounts the share through the LWIO client engine.
func lwioMount(t *testing.T, share string, mode client.Mode) (mnt string, keys *countingKeys, dp DataPath) {
	t.Helper()
	needFUSE(t)
	srv := startServers(t, share, "127.0.0.1:0", "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	keys = &countingKeys{}
	s, err := testDialer(srv.sessAddr, mode, keys)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	mnt = mountOn(t, s.Tree, s.Data)
	return mnt, keys, s.Data
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
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	mnt := t.TempDir()
	srv, err := Mount(mnt, tree, dp, Options{AttrTimeout: time.Second, EntryTimeout: time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
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
			mnt, keys, dp := lwioMount(t, share, mode)
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
			if keys.n.Load() == 0 {
				t.Errorf("no resume key requested: LWIO registration never happened")
			}
		})
	}
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
