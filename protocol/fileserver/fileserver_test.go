package fileserver

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/quietlog"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// TestStart builds a whole server, reaches it as a client does — session
// setup, tree connect, negotiate, LWIO AUTH, REGISTER, WRITE, READ — and
// closes it.
func TestStart(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 2)
	registered := countRegistered(&cfg)
	srv := start(t, cfg)
	ls := srv.Listeners()
	if len(ls) != 2 || ls[0].Provider != soft.Name || ls[0].Addr == ls[1].Addr || len(ls[0].Advertised) != 1 {
		t.Fatalf("listeners %+v", ls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr, f := openOverLWIO(ctx, t, srv, 0)
	if n, err := f.WriteAt(ctx, []byte("hello"), 0); err != nil || n != 5 {
		t.Fatalf("WRITE: %d %v", n, err)
	}
	buf := make([]byte, 5)
	if n, err := f.ReadAt(ctx, buf, 0); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("READ: %q %v", buf[:n], err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "hello" {
		t.Errorf("disk holds %q", b)
	}
	if registered.Load() != 1 {
		t.Errorf("WrapFile saw %d registrations, want 1", registered.Load())
	}
	if err := srv.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := tr.GetAttr(context.Background(), ""); !protocol.IsConnectionLost(err) {
		t.Errorf("session after Close: %v, want the connection lost", err)
	}
	if _, err := net.Dial("tcp", srv.SessionAddr()); err == nil {
		t.Error("session listener still open after Close")
	}
}

// OPEN registers the file with the engine when asked (issue 16): the Fid
// comes with the answer and serves LWIO I/O, closing the handle closes the
// Fid, a directory or a session without LWIO connections gets none, and
// a Fid is its session's alone.
func TestRegisterOnOpen(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 1)
	registered := countRegistered(&cfg)
	srv := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dial := func() (*session.Client, *session.Tree) {
		c, tr := dialTree(ctx, t, srv)
		tr.RegisterOnOpen(true)
		return c, tr
	}
	c, tr := dial()
	// No LWIO connection yet: nothing to register with.
	h, _, err := tr.Open(ctx, "early", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tr.Fid(h); ok {
		t.Error("an open before any LWIO connection answered a Fid")
	}
	cl := lwioClient(ctx, t, c, tr, 0)
	h, _, err = tr.Open(ctx, "f", os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	of, ok := tr.Fid(h)
	if !ok || of.Fid == 0 || of.FlagsAndAttributes != protocol.FileNoIntermediateBuffering {
		t.Fatalf("OPEN answered %+v, %v; want a Fid, unbuffered (O_DIRECT)", of, ok)
	}
	f := cl.Attach(of.Fid, of.FlagsAndAttributes)
	if n, err := f.WriteAt(ctx, []byte("hello"), 0); err != nil || n != 5 {
		t.Fatalf("WRITE on the open's Fid: %d %v", n, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "hello" {
		t.Errorf("disk holds %q", b)
	}
	if registered.Load() != 1 {
		t.Errorf("WrapFile saw %d registrations, want 1", registered.Load())
	}
	if d, _, err := tr.Open(ctx, "", os.O_RDONLY, 0); err != nil {
		t.Fatal(err)
	} else if _, ok := tr.Fid(d); ok {
		t.Error("a directory's open answered a Fid")
	}

	// Another session cannot use the Fid.
	c2, tr2 := dial()
	cl2 := lwioClient(ctx, t, c2, tr2, 0)
	if _, err := cl2.Attach(of.Fid, 0).ReadAt(ctx, make([]byte, 5), 0); !errors.Is(err, protocol.StatusInvalidHandle) {
		t.Errorf("another session's READ on the Fid: %v, want STATUS_INVALID_HANDLE", err)
	}

	// Closing the handle closes the Fid.
	if err := tr.CloseHandle(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(ctx, make([]byte, 5), 0); !errors.Is(err, protocol.StatusInvalidHandle) {
		t.Errorf("READ on the Fid after the handle closed: %v, want STATUS_INVALID_HANDLE", err)
	}
}

// openOverLWIO reaches srv as a client does — session setup as u/pw, tree
// connect to s, OPEN of f (created), resume key, LWIO negotiate and AUTH
// of conns connections (0: the default), REGISTER — and returns the tree
// and the registered file; both close when the test ends.
func openOverLWIO(ctx context.Context, t *testing.T, srv *Server, conns int) (*session.Tree, *client.File) {
	t.Helper()
	c, tr := dialTree(ctx, t, srv)
	h, _, err := tr.Open(ctx, "f", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	rk, err := tr.RequestResumeKey(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	f, err := lwioClient(ctx, t, c, tr, conns).Register(ctx, rk.Key, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tr, f
}

// testConfig is a server with one share, s, in dir, that user u with
// password pw reaches, on a free session port, with n softrdma listeners.
func testConfig(dir string, n int) Config {
	cfg := Config{
		Session: session.ServerConfig{
			Shares:   []share.Config{{Name: "s", Path: dir, AllowRoot: true}},
			Users:    map[string][16]byte{"u": smbauth.NTHash("pw")},
			Accounts: share.AccountsConfig{Guest: "root"}, // "u" acts as the server (root here)
		},
		SessionAddr: "127.0.0.1:0",
	}
	for range n {
		cfg.Listeners = append(cfg.Listeners, Listener{Provider: soft.New(soft.Options{}), Addr: "127.0.0.1:0"})
	}
	return cfg
}

// countRegistered has cfg count the files the engine registers.
func countRegistered(cfg *Config) *atomic.Int32 {
	var n atomic.Int32
	cfg.WrapFile = func(f share.File) share.File { n.Add(1); return f }
	return &n
}

// start starts a server from cfg; it closes when the test ends.
func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	srv, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// dialTree sets up a session on srv as u/pw and connects to share s; the
// session closes when the test ends.
func dialTree(ctx context.Context, t *testing.T, srv *Server) (*session.Client, *session.Tree) {
	t.Helper()
	c, err := session.Dial(ctx, srv.SessionAddr(), session.ClientConfig{User: "u", Password: "pw", KeepAlive: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	tr, err := c.TreeConnect(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	return c, tr
}

// lwioClient starts the LWIO client of session c, negotiating through tr
// with conns connections (0: the default); it closes when the test ends.
func lwioClient(ctx context.Context, t *testing.T, c *session.Client, tr *session.Tree, conns int) *client.Client {
	t.Helper()
	cl, err := client.New(ctx, client.Config{
		Providers: []transport.Provider{soft.New(soft.Options{})},
		Negotiate: tr.Negotiate, SessionID: c.SessionID(), SigningKey: c.SessionKey(), Connections: conns,
	})
	if err != nil {
		t.Fatalf("LWIO client through the advertised listeners: %v", err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// TestStartFailsCleanly: a port taken, a bad share: Start fails, and the
// session port it had opened is free again.
func TestStartFailsCleanly(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	if _, err := Start(Config{SessionAddr: taken.Addr().String()}); err == nil {
		t.Error("Start on a taken session port succeeded")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := l.Addr().String()
	l.Close()
	cfg := Config{
		Session:     session.ServerConfig{Shares: []share.Config{{Name: "s", Path: filepath.Join(t.TempDir(), "missing")}}},
		SessionAddr: free,
	}
	good := cfg.Session.Shares[0]
	good.Path = t.TempDir()
	for _, tc := range []struct {
		what  string
		share share.Config
		lwio  string
	}{
		{"a missing share directory", cfg.Session.Shares[0], ""},
		{"a taken LWIO port", good, taken.Addr().String()},
	} {
		cfg.Session.Shares[0] = tc.share
		cfg.Listeners = nil
		if tc.lwio != "" {
			cfg.Listeners = []Listener{{Provider: soft.New(soft.Options{}), Addr: tc.lwio}}
		}
		if _, err := Start(cfg); err == nil {
			t.Errorf("Start with %s succeeded", tc.what)
		}
		l, err := net.Listen("tcp", free)
		if err != nil {
			t.Errorf("after Start failed on %s, its session port: %v", tc.what, err)
			continue
		}
		l.Close()
	}
}

func TestProviders(t *testing.T) {
	in := func(a string) transport.Instance {
		i, err := transport.InstanceFor(a)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	ps := providers([]ListenerInfo{
		{Provider: "verbs", Advertised: []transport.Instance{in("10.0.0.1:2")}},
		{Provider: "softrdma", Advertised: []transport.Instance{in("10.0.0.1:1")}},
		{Provider: "softrdma", Advertised: []transport.Instance{in("10.0.0.2:1")}},
	})
	if len(ps) != 2 || ps[0].Name != "verbs" || ps[1].Name != "softrdma" || len(ps[1].Instances) != 2 {
		t.Errorf("providers %v: want verbs first, softrdma with both instances", ps)
	}
}

func TestInstances(t *testing.T) {
	ins, err := instances("127.0.0.1:4451")
	if err != nil || len(ins) != 1 || ins[0].String() != "127.0.0.1:4451" {
		t.Fatalf("specific address: %v %v", ins, err)
	}
	// A wildcard is advertised as local addresses, loopback last, never
	// as 0.0.0.0 which no client can connect to.
	ins, err = instances("0.0.0.0:4451")
	if err != nil || len(ins) == 0 {
		t.Fatalf("wildcard: %v %v", ins, err)
	}
	for _, in := range ins {
		a, err := in.Addr()
		if err != nil {
			t.Fatal(err)
		}
		host, port, _ := net.SplitHostPort(a)
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() || ip.To4() == nil || port != "4451" {
			t.Errorf("wildcard advertised as %s", a)
		}
	}
}

func TestKeepServing(t *testing.T) {
	log := quietlog.Or(nil)
	// Accept errors are retried; a clean close ends it.
	calls := 0
	keepServing(log, make(chan struct{}), func() error {
		calls++
		if calls < 3 {
			return errors.New("accept4: too many open files")
		}
		return nil
	})
	if calls != 3 {
		t.Errorf("serve called %d times, want 3", calls)
	}
	// Shutting down ends it even while the listener keeps failing.
	stopping := make(chan struct{})
	done := make(chan struct{})
	go func() {
		keepServing(log, stopping, func() error { return errors.New("broken") })
		close(done)
	}()
	time.Sleep(30 * time.Millisecond)
	close(stopping)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("keepServing did not stop")
	}
}
