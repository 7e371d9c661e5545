package client

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/protocol/server/servertest"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// The servers here resolve sessions and files with servertest.Authority.
var _ server.Authority = (*servertest.Authority)(nil)

type osFile struct {
	*os.File
	ro bool
}

func (f osFile) ReadOnly() bool { return f.ro }

// Append is share.OpenFile's, for the engine's WriteToEndOfFile.
func (f osFile) Append(p []byte) (int, int64, error) { return share.AppendFile(f.File, p) }

// WriteVAt writes a fragmented write's pieces in one pwritev(2), as
// share.OpenFile does, so that the engine here (and its benchmarks) writes
// them as lwio-server does rather than one WriteAt per piece.
func (f osFile) WriteVAt(bufs [][]byte, off int64) (int, error) {
	n, err := unix.Pwritev(int(f.Fd()), bufs, off)
	if err == nil && n < pagesLen(bufs) {
		err = io.ErrShortWrite
	}
	return n, err
}

// env is a server on the soft provider and what a client needs to reach it.
type env struct {
	t    testing.TB
	dir  string
	auth *servertest.Authority
	srv  *server.Server
	addr string
}

func newEnv(t testing.TB, cfg server.Config) *env {
	t.Helper()
	return newEnvOn(t, cfg, soft.New(soft.Options{}))
}

// newEnvOn is newEnv with the server listening on p.
func newEnvOn(t testing.TB, cfg server.Config, p transport.Provider) *env {
	t.Helper()
	e := &env{t: t, dir: t.TempDir(), auth: servertest.NewAuthority()}
	cfg.Authority = e.auth
	if l := testutil.Logger("server"); l != nil {
		cfg.Logger = l
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv, e.addr = srv, servertest.ServeOn(t, srv, p)
	t.Cleanup(func() { srv.Close() })
	return e
}

// session is one client session: id, signing key and a Negotiate.
type session struct {
	e   *env
	id  uint64
	key []byte
	via string // the address the negotiate offers instead of the server's (a proxy)
}

var sessionIDs struct {
	sync.Mutex
	n uint64
}

func (e *env) session() *session {
	sessionIDs.Lock()
	sessionIDs.n++
	id := sessionIDs.n + 1000
	sessionIDs.Unlock()
	key := make([]byte, 16)
	rand.Read(key)
	return &session{e: e, id: id, key: key}
}

func (s *session) negotiate(ctx context.Context, req protocol.NegotiateRequest) (protocol.NegotiateResponse, error) {
	addr := s.e.addr
	if s.via != "" {
		addr = s.via
	}
	in, err := transport.InstanceFor(addr)
	if err != nil {
		return protocol.NegotiateResponse{}, err
	}
	for _, p := range req.Providers {
		if p.Name == soft.Name {
			key := s.e.auth.NegotiateKey(s.id, s.key)
			return protocol.NewNegotiateResponse("test", key, []transport.ProviderInfo{
				{Name: soft.Name, Instances: []transport.Instance{in}},
			}), nil
		}
	}
	return protocol.NegotiateResponse{}, errors.New("no common provider")
}

func (s *session) config(mode Mode) Config {
	return Config{
		Logger: testutil.Logger("client"),
		// Through a proxy (via), on TCP: the same-host unix socket would
		// go around it.
		Providers:  []transport.Provider{soft.New(soft.Options{TCPOnly: s.via != ""})},
		Negotiate:  s.negotiate,
		SessionID:  s.id,
		SigningKey: s.key,
		Completion: mode,
		// The tests' connections share memory (softrdma on this host),
		// where the default is not to split (splitDefault): split as
		// the default does elsewhere, as the split tests expect.
		SplitRead: DefaultSplitRead,
	}
}

// newClient is a new session on e and its client in mode.
func (e *env) newClient(t testing.TB, mode Mode) (*session, *Client) {
	t.Helper()
	s := e.session()
	return s, s.client(t, s.config(mode))
}

// oneConn is a new session on e and its client with one connection in
// mode.
func (e *env) oneConn(t testing.TB, mode Mode) (*session, *Client) {
	t.Helper()
	s := e.session()
	cfg := s.config(mode)
	cfg.Connections = 1
	return s, s.client(t, cfg)
}

// oneConnClient is a client of s with one connection in mode that asks
// for credits and takes up to maxCredits.
func (s *session) oneConnClient(t testing.TB, mode Mode, credits, maxCredits int) *Client {
	t.Helper()
	cfg := s.config(mode)
	cfg.Connections, cfg.Credits, cfg.MaxCredits = 1, credits, maxCredits
	return s.client(t, cfg)
}

func (s *session) client(t testing.TB, cfg Config) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// file creates name with content and returns its resume key on s.
func (s *session) file(t testing.TB, name string, content []byte) (protocol.ResumeKey, string) {
	t.Helper()
	f, path := s.e.create(t, name, content)
	return s.e.auth.AddFile(s.id, osFile{File: f}), path
}

// newFile creates name with content on s's server and registers it on cl.
func (s *session) newFile(t testing.TB, cl *Client, name string, content []byte) *File {
	t.Helper()
	key, _ := s.file(t, name, content)
	return s.register(t, cl, key, 0)
}

// create writes name with content in the server's directory and opens it
// read-write until the test ends.
func (e *env) create(t testing.TB, name string, content []byte) (*os.File, string) {
	t.Helper()
	path := filepath.Join(e.dir, name)
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, path
}

func (s *session) register(t testing.TB, cl *Client, key protocol.ResumeKey, flags uint32) *File {
	t.Helper()
	f, err := cl.Register(context.Background(), key, flags)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// inEachMode runs body once per completion mode, as a subtest, against a
// fresh server configured by cfg and a client (in that mode) of one session.
func inEachMode(t *testing.T, cfg server.Config, body func(t *testing.T, e *env, s *session, cl *Client)) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, cfg)
			s, cl := e.newClient(t, mode)
			body(t, e, s, cl)
		})
	}
}

func ctxT(t testing.TB) context.Context { return testutil.Context(t, 20*time.Second) }

// gated creates a file whose I/O waits for the gate.
func (s *session) gated(t testing.TB, name string, content []byte) (protocol.ResumeKey, *servertest.GatedFile) {
	t.Helper()
	f, _ := s.e.create(t, name, content)
	g := servertest.NewGatedFile(osFile{File: f})
	t.Cleanup(g.Open) // runs before the file's close
	return s.e.auth.AddFile(s.id, g), g
}
