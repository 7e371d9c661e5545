package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// TestSealedSession: a sealed session's connections authenticate with
// nonces and seal; reads and writes of every size come through in every
// completion mode.
func TestSealedSession(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, server.Config{})
			e.auth.SealWith(smbauth.CipherAES128GCM)
			s := e.session()
			cfg := s.config(mode)
			cfg.Cipher = smbauth.CipherAES128GCM
			cl := s.client(t, cfg)
			content := testutil.RandBytes(2<<20 + 77)
			key, path := s.file(t, "f", content)
			f := s.register(t, cl, key, 0)
			ctx := ctxT(t)
			for _, n := range []int{1, 1000, 64 << 10, 1 << 20, 2<<20 + 77} {
				p := make([]byte, n)
				if got, err := f.ReadAt(ctx, p, 0); err != nil || got != n || !bytes.Equal(p, content[:n]) {
					t.Fatalf("ReadAt(0, %d) = %d, %v (equal %v)", n, got, err, bytes.Equal(p, content[:n]))
				}
			}
			for _, tc := range []struct{ off, n int }{{3, 100}, {8192, 64 << 10}, {1 << 20, 1<<20 + 7}} {
				data := testutil.RandBytes(tc.n)
				if got, err := f.WriteAt(ctx, data, int64(tc.off)); err != nil || got != tc.n {
					t.Fatalf("WriteAt(%d, %d) = %d, %v", tc.off, tc.n, got, err)
				}
				copy(content[tc.off:], data)
			}
			disk, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(disk, content) {
				t.Fatalf("file on disk differs after sealed writes (%v)", err)
			}
		})
	}
}

// TestSealedSessionNeedsSealingClient: a client that does not seal (no
// Cipher, so no nonce in its AUTH) cannot bring a connection to a sealed
// session, and a client that seals cannot to a server whose session is not
// sealed.
func TestSealedSessionNeedsSealingClient(t *testing.T) {
	for _, tc := range []struct {
		name           string
		server, client smbauth.Cipher
	}{
		{"client does not seal", smbauth.CipherAES128GCM, smbauth.CipherNone},
		{"server does not seal", smbauth.CipherNone, smbauth.CipherAES128GCM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, server.Config{})
			e.auth.SealWith(tc.server)
			s := e.session()
			cfg := s.config(Interrupt)
			cfg.Cipher = tc.client
			cfg.AuthTimeout = 5 * time.Second
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cl, err := New(ctx, cfg)
			if err == nil {
				cl.Close()
				t.Fatal("connection made with sealing mismatched")
			}
			if !errors.Is(err, errAuth) {
				t.Logf("error: %v", err)
			}
		})
	}
}

// unsealable is the soft provider with connections that cannot seal, as
// verbs connections cannot.
type unsealable struct{ transport.Provider }

type unsealableConn struct{ transport.Conn }

type unsealableListener struct{ transport.Listener }

func (p unsealable) Dial(ctx context.Context, addr string, cfg transport.Config) (transport.Conn, error) {
	c, err := p.Provider.Dial(ctx, addr, cfg)
	if err != nil {
		return nil, err
	}
	return unsealableConn{c}, nil
}

func (p unsealable) Listen(addr string, cfg transport.Config) (transport.Listener, error) {
	l, err := p.Provider.Listen(addr, cfg)
	if err != nil {
		return nil, err
	}
	return unsealableListener{l}, nil
}

func (l unsealableListener) Accept(ctx context.Context) (transport.Conn, error) {
	c, err := l.Listener.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return unsealableConn{c}, nil
}

// TestSealedSessionUnsealableProvider: a sealed session's connection on a
// provider that cannot seal is refused, with a message naming
// trusted_fabric, unless the server trusts its fabric; then it carries the
// data (in clear).
func TestSealedSessionUnsealableProvider(t *testing.T) {
	for _, trusted := range []bool{false, true} {
		t.Run(fmt.Sprintf("trusted=%v", trusted), func(t *testing.T) {
			p := unsealable{soft.New(soft.Options{})}
			e := newEnvOn(t, server.Config{TrustedFabric: trusted}, p)
			e.auth.SealWith(smbauth.CipherAES128GCM)
			s := e.session()
			cfg := s.config(Interrupt)
			cfg.Cipher = smbauth.CipherAES128GCM
			cfg.Providers = []transport.Provider{unsealable{soft.New(soft.Options{})}}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cl, err := New(ctx, cfg)
			if !trusted {
				if err == nil {
					cl.Close()
					t.Fatal("a sealed session's unsealable connection was accepted")
				}
				if !strings.Contains(err.Error(), "trusted_fabric") {
					t.Errorf("error does not explain the refusal: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("trusted fabric: %v", err)
			}
			defer cl.Close()
			f := s.newFile(t, cl, "f", []byte("hello"))
			b := make([]byte, 5)
			if n, err := f.ReadAt(ctxT(t), b, 0); n != 5 || string(b) != "hello" {
				t.Fatalf("ReadAt = %d %q %v", n, b, err)
			}
		})
	}
}

// flipProxy relays one address, flipping one bit of the client's stream at
// byte offset at (0: never).
func flipProxy(t *testing.T, target string, at int) string {
	t.Helper()
	return testutil.Relay(t, target, func(a, b net.Conn) {
		go func() { io.Copy(a, b); a.Close() }()
		go func() {
			defer b.Close()
			buf := make([]byte, 32<<10)
			for off := 0; ; {
				n, err := a.Read(buf)
				if at > off && at <= off+n {
					buf[at-1-off] ^= 0x04
				}
				off += n
				if _, werr := b.Write(buf[:n]); werr != nil || err != nil {
					return
				}
			}
		}()
	})
}

// TestSealedTamperedConnection: one bit flipped in a sealed data
// connection's stream fails that connection's requests; the server goes on
// serving another session.
func TestSealedTamperedConnection(t *testing.T) {
	e := newEnv(t, server.Config{})
	e.auth.SealWith(smbauth.CipherAES128GCM)
	s := e.session()
	s.via = flipProxy(t, e.addr, 2000) // inside the first sealed frame after AUTH
	cfg := s.config(Interrupt)
	cfg.Cipher = smbauth.CipherAES128GCM
	cfg.Connections = 1
	cl := s.client(t, cfg)
	key, path := s.file(t, "f", make([]byte, 1<<20))
	f := s.register(t, cl, key, 0)
	data := bytes.Repeat([]byte("tamper"), 20000)
	ctx := ctxT(t)
	if _, err := f.WriteAt(ctx, data, 0); err == nil {
		t.Fatal("a write through a tampered sealed connection succeeded")
	}
	if disk, _ := os.ReadFile(path); bytes.Contains(disk, []byte("tamper")) {
		t.Error("tampered data reached the file")
	}
	other := e.session()
	ocfg := other.config(Interrupt)
	ocfg.Cipher = smbauth.CipherAES128GCM
	ocl := other.client(t, ocfg)
	g := other.newFile(t, ocl, "g", []byte("still serving"))
	b := make([]byte, 13)
	if n, err := g.ReadAt(ctx, b, 0); n != 13 || string(b) != "still serving" {
		t.Fatalf("another session after the tamper: %d %q %v", n, b, err)
	}
}
