package client

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/smbauth"
)

// TestSealedSession: a sealed session's connections authenticate with
// nonces and seal; reads and writes of every size come through in every
// completion mode.
func TestSealedSession(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, server.Config{})
			e.auth.cipher = smbauth.CipherAES128GCM
			s := e.session()
			cfg := s.config(mode)
			cfg.Cipher = smbauth.CipherAES128GCM
			cl := s.client(t, cfg)
			content := randBytes(2<<20 + 77)
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
				data := randBytes(tc.n)
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
			e.auth.cipher = tc.server
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
