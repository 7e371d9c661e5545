package fs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/fileserver"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// reconnectMount mounts share "s" of a server serving a new directory
// through a Reconnector that waits up to wait for a lost server.
func reconnectMount(t *testing.T, wait time.Duration, registered *atomic.Int32) (dir, mnt string, srv *fileserver.Server) {
	t.Helper()
	needFUSE(t)
	dir = t.TempDir()
	srv = serve(t, dir, testutil.LoopbackAddr(t), testutil.LoopbackAddr(t), registered) // restarted on the same addresses
	log := logrus.New()
	log.SetLevel(logrus.PanicLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := NewReconnector(ctx, dialer(srv.SessionAddr(), client.Interrupt), wait, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return dir, mountOn(t, r, r), srv
}

// TestReconnect restarts the server under a mount with a file open: the
// open file carries on (re-opened and re-registered), calls made while the
// server is away wait for it, and nothing acknowledged is lost.
func TestReconnect(t *testing.T) {
	var registered atomic.Int32
	share, mnt, srv := reconnectMount(t, 20*time.Second, &registered)
	f, err := os.OpenFile(filepath.Join(mnt, "f"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Every write goes over LWIO: the file is registered (by its open).
	if _, err := f.WriteAt(bytes.Repeat([]byte("x"), 4096), 100); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("before "), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	before := registered.Load()
	if before == 0 {
		t.Fatal("the file was never registered over LWIO")
	}

	// The server goes away and comes back on the same addresses.
	srv.Close()
	restarted := make(chan struct{})
	go func() {
		time.Sleep(300 * time.Millisecond)
		serve(t, share, srv.SessionAddr(), srv.Listeners()[0].Addr, &registered)
		close(restarted)
	}()
	// Made while the server is down: waits, then succeeds.
	if _, err := f.WriteAt([]byte("after"), 7); err != nil {
		t.Fatalf("write across a server restart: %v", err)
	}
	<-restarted
	buf := make([]byte, 12)
	if n, err := f.ReadAt(buf, 0); err != nil || string(buf[:n]) != "before after" {
		t.Fatalf("read after reconnect: %q %v", buf[:n], err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync after reconnect: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(share, "f")); !bytes.Equal(got[:12], []byte("before after")) {
		t.Fatalf("server disk has %q", got[:12])
	}
	if registered.Load() <= before {
		t.Errorf("the open file was not re-registered over LWIO after the reconnect")
	}
	// New opens and namespace operations work on the new session.
	if err := os.WriteFile(filepath.Join(mnt, "g"), []byte("new"), 0o644); err != nil {
		t.Fatalf("create after reconnect: %v", err)
	}
	if err := os.Rename(filepath.Join(mnt, "g"), filepath.Join(mnt, "h")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(mnt, "h")); string(got) != "new" {
		t.Fatalf("read of a file created after reconnect: %q", got)
	}
}

// TestReconnectWaitBounded: with the server gone for good, calls fail
// (ENOTCONN) within the wait bound rather than hang.
func TestReconnectWaitBounded(t *testing.T) {
	_, mnt, srv := reconnectMount(t, time.Second, nil)
	if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	start := time.Now()
	_, err := os.Stat(filepath.Join(mnt, "nope"))
	if err == nil || time.Since(start) > 10*time.Second {
		t.Fatalf("stat with the server gone: %v after %v; want an error within the bound", err, time.Since(start))
	}
}

func TestRenameFollowsOpenFiles(t *testing.T) {
	r := &Reconnector{handles: map[session.Handle]*vhandle{}}
	paths := []string{"a", "a/b", "ab", "x/a", "c"}
	for i, p := range paths {
		r.handles[session.Handle(i+1)] = &vhandle{path: p}
	}
	r.cur = &Session{Tree: renameOK{}, Done: make(chan struct{})}
	r.gen = 1
	if err := r.Rename(context.Background(), "a", "z/a", 0); err != nil {
		t.Fatal(err)
	}
	want := []string{"z/a", "z/a/b", "ab", "x/a", "c"}
	for i, w := range want {
		if got := r.handles[session.Handle(i+1)].path; got != w {
			t.Errorf("handle of %q now at %q, want %q", paths[i], got, w)
		}
	}
	if err := r.Rename(context.Background(), "ab", "c", 0); err != nil {
		t.Fatal(err)
	}
	if !r.handles[5].unlinked || r.handles[3].path != "c" {
		t.Errorf("rename over an open file: replaced %v, moved to %q", r.handles[5].unlinked, r.handles[3].path)
	}
	if err := r.Rename(context.Background(), "x/a", "z/a", 2); err != nil { // RENAME_EXCHANGE
		t.Fatal(err)
	}
	if r.handles[4].path != "z/a" || r.handles[1].path != "x/a" || r.handles[2].path != "x/a/b" {
		t.Errorf("exchange: %q %q %q", r.handles[4].path, r.handles[1].path, r.handles[2].path)
	}
}

// renameOK is a session tree whose renames succeed.
type renameOK struct{ *dirTree }

func (renameOK) Rename(context.Context, string, string, uint32) error { return nil }

// TestReadOnLostSessionReplayed: a read sent on a session whose connection
// the server has just closed (a restart the mount has not noticed yet)
// fails with the session channel's lost-connection error, which wraps
// io.EOF. The read is replayed on the next session; it never comes back
// empty, as if the file ended.
func TestReadOnLostSessionReplayed(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("same file"), 0o644); err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int32
	dial := func(context.Context) (*Session, error) {
		var tree interface {
			Tree
			HandleIO
		} = newDirTree(dir)
		if dials.Add(1) == 1 {
			tree = closedReads{tree.(*dirTree)}
		}
		return &Session{Tree: tree, Data: SessionDataPath(tree), Done: make(chan struct{})}, nil
	}
	ctx := context.Background()
	r, err := NewReconnector(ctx, dial, 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	vh, _, err := r.Open(ctx, "f", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	df, err := r.Attach(ctx, vh, os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	b, err := df.ReadBuf(ctx, make([]byte, 64), 0)
	if err != nil || b == nil || string(b.Bytes()) != "same file" {
		t.Fatalf("read on a session lost under it: %v %v, want the file's data from the next session", b, err)
	}
	if dials.Load() != 2 {
		t.Errorf("%d dials, want 2 (the read replayed on a new session)", dials.Load())
	}
}

// closedReads is a session tree whose connection the server has closed:
// reads fail as the session client's do then.
type closedReads struct{ *dirTree }

func (closedReads) ReadAt(context.Context, session.Handle, []byte, int64) (int, error) {
	return 0, &protocol.ConnectionError{Conn: "session test", Err: fmt.Errorf("%w: %w", session.ErrClosed, io.EOF)}
}
