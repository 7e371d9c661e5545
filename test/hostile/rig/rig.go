// Package rig starts a real lwiofs server in the test process — the session
// channel (protocol/session) and the LWIO engine (protocol/server) on the
// softrdma provider, built by protocol/fileserver as cmd/lwio-server builds
// it — on
// 127.0.0.1 ephemeral ports with a temporary share, and gives tests what
// they need around it: a legitimate client that does the whole round
// (session setup, tree connect, open, resume key, negotiate, LWIO AUTH,
// REGISTER, WRITE, READ, compare), and a view of every memory region the
// server registers with its provider.
//
// It is used by test/hostile (hostile clients) and test/load (many
// concurrent clients).
package rig

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/fileserver"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// Credentials the rig's server knows, and its share.
const (
	User     = "alice"
	Password = "correct horse battery staple"
	Share    = "data"
)

// Options shape the server. Zero fields keep the engine's and session
// server's own defaults, as cmd/lwio-server does with an empty [limits].
type Options struct {
	Engine  server.Config        // Authority and Logger are filled in
	Session session.ServerConfig // Shares, Users, Providers and Logger are filled in
	Soft    soft.Options         // the server's softrdma provider
}

// Server is a running server.
type Server struct {
	T           testing.TB
	Dir         string // the share's directory
	SessionAddr string // the session channel's TCP listener
	SoftAddr    string // the softrdma listener
	Engine      *server.Server
	Sess        *session.Server
	// Regions records every memory region the engine registered with its
	// provider's protection domain.
	Regions *RegionLog

	wrap atomic.Pointer[func(share.File) share.File]
}

// Start starts a server — fileserver.Start, as cmd/lwio-server does, on
// one softrdma listener whose registrations Regions records — and stops it
// at the end of the test.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	s := &Server{T: t, Dir: t.TempDir(), Regions: &RegionLog{}}
	ec := o.Engine
	if ec.Logger == nil {
		ec.Logger = testutil.Logger("lwio")
	}
	so := o.Soft
	if so.Logger == nil {
		so.Logger = testutil.Logger("softrdma")
	}
	sc := o.Session
	sc.ServerName = "rig"
	sc.Users = map[string][16]byte{User: smbauth.NTHash(Password)}
	// The rig's user acts as the server's own account (root, run as root):
	// hostile tests are about the wire, not identity.
	sc.Shares = []share.Config{{Name: Share, Path: s.Dir, AllowRoot: true}}
	if sc.Accounts.Guest == "" {
		sc.Accounts.Guest = "root"
	}
	if sc.Logger == nil {
		sc.Logger = testutil.Logger("session")
	}
	srv, err := fileserver.Start(fileserver.Config{
		Session:     sc,
		Engine:      ec,
		SessionAddr: "127.0.0.1:0",
		Listeners:   []fileserver.Listener{{Provider: &countingProvider{Provider: soft.New(so), log: s.Regions}, Addr: "127.0.0.1:0"}},
		WrapFile: func(f share.File) share.File {
			if w := s.wrap.Load(); w != nil {
				return (*w)(f)
			}
			return f
		},
		Logger: testutil.Logger("rig"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	s.Engine, s.Sess = srv.Engine(), srv.Session()
	s.SessionAddr, s.SoftAddr = srv.SessionAddr(), srv.Listeners()[0].Addr
	return s
}

// WrapFiles makes every file registered from now on go through w (nil
// stops it).
func (s *Server) WrapFiles(w func(share.File) share.File) {
	if w == nil {
		s.wrap.Store(nil)
		return
	}
	s.wrap.Store(&w)
}

// Session is a legitimate session with a tree connected to the share.
type Session struct {
	C    *session.Client
	Tree *session.Tree
}

// Close ends the session.
func (ss *Session) Close() { ss.C.Close() }

// DialSession runs session setup and tree connect with the rig's
// credentials.
func (s *Server) DialSession(ctx context.Context) (*Session, error) {
	c, err := session.Dial(ctx, s.SessionAddr, session.ClientConfig{User: User, Password: Password, Workstation: "rig", KeepAlive: -1})
	if err != nil {
		return nil, fmt.Errorf("session setup: %w", err)
	}
	tr, err := c.TreeConnect(ctx, Share)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("tree connect: %w", err)
	}
	return &Session{C: c, Tree: tr}, nil
}

// TestSession is DialSession for a test: it fails t on an error, and the
// session closes when the test ends.
func (s *Server) TestSession(ctx context.Context, t testing.TB) *Session {
	t.Helper()
	ss, err := s.DialSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ss.Close)
	return ss
}

// ClientConfig is the LWIO client configuration for ss; tweak fields
// before client.New.
func (ss *Session) ClientConfig(p transport.Provider) client.Config {
	if p == nil {
		p = soft.New(soft.Options{})
	}
	return client.Config{
		Providers:   []transport.Provider{p},
		Negotiate:   ss.Tree.Negotiate,
		SessionID:   ss.C.SessionID(),
		SigningKey:  ss.C.SessionKey(),
		ClientName:  "rig",
		Connections: 1,
		Logger:      testutil.Logger("client"),
	}
}

// OpenKey creates (or opens) name read-write and returns its handle and
// resume key.
func (ss *Session) OpenKey(ctx context.Context, name string) (session.Handle, protocol.ResumeKey, error) {
	h, _, err := ss.Tree.Open(ctx, name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return 0, protocol.ResumeKey{}, fmt.Errorf("open %s: %w", name, err)
	}
	rk, err := ss.Tree.RequestResumeKey(ctx, h)
	if err != nil {
		return 0, protocol.ResumeKey{}, fmt.Errorf("resume key: %w", err)
	}
	return h, rk.Key, nil
}

var checks atomic.Uint64

// Check is a legitimate client's whole round trip: session setup, tree
// connect, open, resume key, negotiate, LWIO connect and AUTH, REGISTER,
// a 64 KiB WRITE, a READ of it, byte comparison, then everything closed.
// It fails the test if any step fails or takes longer than 20 s.
func (s *Server) Check(t testing.TB) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.check(ctx); err != nil {
		t.Fatalf("legitimate client: %v", err)
	}
	return time.Since(start)
}

// CheckErr is Check for use outside the test goroutine: it returns the
// failure instead of failing the test.
func (s *Server) CheckErr() (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.check(ctx)
	return time.Since(start), err
}

func (s *Server) check(ctx context.Context) error {
	ss, err := s.DialSession(ctx)
	if err != nil {
		return err
	}
	defer ss.Close()
	name := fmt.Sprintf("check-%d", checks.Add(1))
	h, rk, err := ss.OpenKey(ctx, name)
	if err != nil {
		return err
	}
	cl, err := client.New(ctx, ss.ClientConfig(nil))
	if err != nil {
		return fmt.Errorf("LWIO connect/AUTH: %w", err)
	}
	defer cl.Close()
	f, err := cl.Register(ctx, rk, 0)
	if err != nil {
		return fmt.Errorf("REGISTER: %w", err)
	}
	want := make([]byte, 64<<10)
	rand.Read(want)
	if n, err := f.WriteAt(ctx, want, 4096); err != nil || n != len(want) {
		return fmt.Errorf("WRITE: %d, %v", n, err)
	}
	got := make([]byte, len(want))
	if n, err := f.ReadAt(ctx, got, 4096); err != nil || n != len(got) {
		return fmt.Errorf("READ: %d, %v", n, err)
	}
	if !bytes.Equal(got, want) {
		return errors.New("READ returned other bytes than were written")
	}
	if err := f.Close(ctx); err != nil {
		return fmt.Errorf("CLOSE: %w", err)
	}
	if err := ss.Tree.CloseHandle(ctx, h); err != nil {
		return fmt.Errorf("close handle: %w", err)
	}
	return ss.Tree.Unlink(ctx, name)
}

// WaitConns waits until the engine has at most n live connections, for
// up to d; it returns the last count seen.
func (s *Server) WaitConns(n int, d time.Duration) int {
	deadline := time.Now().Add(d)
	for {
		got := s.Engine.NumConns()
		if got <= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
}
