package session

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/smbauth"
)

const (
	testUser     = "alice"
	testPassword = "correct horse"
	testServer   = "srv"
)

// env is a running server with a share "data" (at dir/share), a read-only
// share "ro" and a share "bobs" only bob may use; dir/outside is a directory
// next to the share that no client must ever reach.
type env struct {
	t       testing.TB
	srv     *Server
	addr    string
	dir     string
	share   string
	outside string
	hook    *logtest.Hook
	cfg     ServerConfig
}

func newEnv(t testing.TB, mut ...func(*ServerConfig)) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, dir: dir, share: filepath.Join(dir, "share"), outside: filepath.Join(dir, "outside")}
	for _, d := range []string{e.share, e.outside, filepath.Join(dir, "ro")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(e.outside, "secret"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ro", "file"), []byte("read only"), 0o644); err != nil {
		t.Fatal(err)
	}
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	e.hook = hook
	cfg := ServerConfig{
		ServerName: testServer,
		Shares: []share.Config{
			{Name: "data", Path: e.share},
			{Name: "ro", Path: filepath.Join(dir, "ro"), ReadOnly: true},
			{Name: "bobs", Path: e.share, Users: []string{"bob"}},
		},
		Users: map[string][16]byte{
			testUser: smbauth.NTHash(testPassword),
			"bob":    smbauth.NTHash("bob's"),
		},
		Logger: logger,
	}
	for _, m := range mut {
		m(&cfg)
	}
	actAsServer(&cfg)
	e.cfg = cfg
	e.serve()
	return e
}

// serve starts a server with e.cfg on a new port.
func (e *env) serve() {
	t := e.t
	srv, err := NewServer(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.srv, e.addr = srv, l.Addr().String()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; err != ErrServerClosed {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (e *env) dial(user, password string) (*Client, error) {
	return Dial(ctxT(e.t), e.addr, ClientConfig{User: user, Password: password, Domain: "WORK"})
}

func (e *env) client() *Client {
	e.t.Helper()
	c, err := e.dial(testUser, testPassword)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

func (e *env) tree(share string) *Tree {
	e.t.Helper()
	tr, err := e.client().TreeConnect(ctxT(e.t), share)
	if err != nil {
		e.t.Fatal(err)
	}
	return tr
}

// logged reports whether some log entry's message contains s.
func (e *env) logged(s string) bool {
	for _, en := range e.hook.AllEntries() {
		if strings.Contains(en.Message, s) {
			return true
		}
	}
	return false
}

// waitLogged polls for a log line written by another goroutine.
func (e *env) waitLogged(s string) bool {
	for range 200 {
		if e.logged(s) {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// each runs fn(0) … fn(n-1), each in a goroutine of its own, and returns
// their n results as they come.
func each[T any](n int, fn func(i int) T) <-chan T {
	out := make(chan T, n)
	for i := range n {
		go func() { out <- fn(i) }()
	}
	return out
}

// eventually polls cond for up to two seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func (e *env) writeFile(rel, content string) {
	e.t.Helper()
	if err := os.WriteFile(filepath.Join(e.share, rel), []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// actAsServer makes every user act as the server's own account: these
// tests are about the protocol, not identity (share's identity tests and
// test/identity_test.go are), and the test users have no Unix accounts.
// Run as root, that account is root, so the shares allow it.
// A test that sets Accounts.Lookup decides for itself.
func actAsServer(cfg *ServerConfig) {
	if cfg.Accounts.Lookup != nil {
		return
	}
	if cfg.Accounts.Guest == "" {
		cfg.Accounts.Guest = "root"
	}
	for i := range cfg.Shares {
		cfg.Shares[i].AllowRoot = true
	}
}
