package fs

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// resumeKeysOnly is the session's tree as a ResumeKeyer that knows no Fid
// from OPEN, so every Attach registers by resume key + REGISTER; garble
// spoils the key the server gave, so that its REGISTER is refused.
type resumeKeysOnly struct {
	*session.Tree
	garble bool
}

func (k resumeKeysOnly) Fid(session.Handle) (session.OpenFid, bool) { return session.OpenFid{}, false }

func (k resumeKeysOnly) RequestResumeKey(ctx context.Context, h session.Handle) (protocol.ResumeKeyResponse, error) {
	rk, err := k.Tree.RequestResumeKey(ctx, h)
	if k.garble {
		for i := range rk.Key {
			rk.Key[i] ^= 0x5a
		}
	}
	return rk, err
}

// countedPath counts the files attached through a DataPath.
type countedPath struct {
	DataPath
	n atomic.Int32
}

func (p *countedPath) Attach(ctx context.Context, h session.Handle, flags int) (DataFile, error) {
	p.n.Add(1)
	return p.DataPath.Attach(ctx, h, flags)
}

// TestLWIORegistrationFallback: a file whose REGISTER the server refuses
// goes over the session channel, with a warning; a registration whose
// session was lost neither falls back to that dead session nor warns: it
// fails as a lost connection, which a Reconnector answers by re-opening
// and re-registering the file on the next session.
func TestLWIORegistrationFallback(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := serve(t, dir, "127.0.0.1:0", "127.0.0.1:0", nil)
	px := newProxy(t, srv.SessionAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := dialer(px.addr, client.Interrupt)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	tree := s.Tree.(*session.Tree)
	h, _, err := tree.Open(ctx, "f", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	warnings := func() (n int) {
		for _, e := range hook.AllEntries() {
			if e.Level <= logrus.WarnLevel {
				n++
			}
		}
		return n
	}
	fallback := &countedPath{DataPath: SessionDataPath(tree)}

	// The key as the server gave it registers over LWIO.
	df, err := lwioDataPath(resumeKeysOnly{tree, false}, s.LWIO, fallback, log).Attach(ctx, h, os.O_RDWR)
	if err != nil {
		t.Fatalf("registration: %v", err)
	}
	if _, ok := df.(*client.File); !ok || fallback.n.Load() != 0 || warnings() != 0 {
		t.Fatalf("registration: data file %T, %d fallbacks, %d warnings; want a registered *client.File, none, none",
			df, fallback.n.Load(), warnings())
	}
	df.Close(ctx)

	// A key the server does not know: REGISTER refused.
	df, err = lwioDataPath(resumeKeysOnly{tree, true}, s.LWIO, fallback, log).Attach(ctx, h, os.O_RDWR)
	if err != nil {
		t.Fatalf("refused registration with a fallback: %v", err)
	}
	if fallback.n.Load() != 1 || warnings() != 1 {
		t.Errorf("refused registration: %d fallbacks, %d warnings; want 1, 1", fallback.n.Load(), warnings())
	}
	b := make([]byte, 4)
	if n, err := df.ReadAt(ctx, b, 0); err != nil || string(b[:n]) != "data" {
		t.Errorf("read through the fallback: %q, %v", b[:n], err)
	}

	// The session channel lost.
	hook.Reset()
	px.cut()
	select {
	case <-s.Done:
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end when its connection was cut")
	}
	df, err = lwioDataPath(resumeKeysOnly{tree, false}, s.LWIO, fallback, log).Attach(ctx, h, os.O_RDWR)
	if !protocol.IsConnectionLost(err) {
		t.Errorf("registration on a lost session: %T %v, %v; want a lost connection (protocol.ConnectionError)", df, df, err)
	}
	if fallback.n.Load() != 1 || warnings() != 0 {
		t.Errorf("registration on a lost session: %d more fallbacks, %d warnings; want none, none", fallback.n.Load()-1, warnings())
	}
}
