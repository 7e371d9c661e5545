package session

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
)

// durableOpen opens p read-write as a durable open on a client of its own
// and returns that client's tree, the handle, its id and FileID.
func (e *env) durableOpen(p string, flags int) (*Client, *Tree, Handle, DurableID, []byte) {
	e.t.Helper()
	c, err := e.dial(testUser, testPassword)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	tr, err := c.TreeConnect(ctxT(e.t), "data")
	if err != nil {
		e.t.Fatal(err)
	}
	id := NewDurableID()
	h, _, fid, err := tr.OpenDurable(ctxT(e.t), p, flags, 0o644, id)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(fid) == 0 {
		e.t.Fatal("a durable OPEN answered no FileID")
	}
	return c, tr, h, id, fid
}

// droppedHolder opens db durably on a client of its own, write-locks
// bytes 0-9 for owner 1, opens db on another session, and drops the first
// client's connection without a goodbye (the network goes). It returns the
// open's id and FileID and the other session's handle.
func (e *env) droppedHolder() (id DurableID, fid []byte, other *Tree, ho Handle) {
	e.t.Helper()
	e.writeFile("db", "0123456789")
	c, tr, h, id, fid := e.durableOpen("db", os.O_RDWR)
	if err := tr.Lock(ctxT(e.t), h, wlock(1, 0, 9), false); err != nil {
		e.t.Fatal(err)
	}
	other = e.tree("data")
	ho = e.openRW(other, "db")
	c.Close()
	return id, fid, other, ho
}

// TestDurableReclaim: the connection drops with a lock held; the server
// keeps the open, and its lock, until the client reclaims it on a new
// session — which then still holds the lock.
func TestDurableReclaim(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	id, fid, other, ho := e.droppedHolder()
	time.Sleep(50 * time.Millisecond)
	if err := other.Lock(ctx, ho, wlock(5, 0, 0), false); ToErrno(err) != 11 {
		t.Fatalf("lock of a dropped connection's durable open: %v, want still held (EAGAIN)", err)
	}
	tr2 := e.tree("data")
	h2, a, reclaimed, err := tr2.Reopen(ctx, id, fid, "db", os.O_RDWR)
	if err != nil || !reclaimed || a.Size != 10 {
		t.Fatalf("Reopen = reclaimed %v, size %d, %v", reclaimed, a.Size, err)
	}
	if err := other.Lock(ctx, ho, wlock(5, 0, 0), false); ToErrno(err) != 11 {
		t.Errorf("after the reclaim: %v, want the lock still held", err)
	}
	// The reclaiming session is the owner now: it unlocks and relocks.
	if err := tr2.Lock(ctx, h2, Lock{Owner: 1, Start: 0, End: 9, Type: Unlock}, false); err != nil {
		t.Fatal(err)
	}
	if err := other.Lock(ctx, ho, wlock(5, 0, 0), false); err != nil {
		t.Errorf("after the reclaimed lock's unlock: %v", err)
	}
	// Another user cannot take it.
	tb := e.treeAs("bob", "bob's", "data")
	if _, _, _, err := tb.Reopen(ctx, id, nil, "db", os.O_RDWR); err != protocol.StatusAccessDenied {
		t.Errorf("bob reclaiming alice's open: %v, want ACCESS_DENIED", err)
	}
}

// TestDurableTimeout: an open nobody reclaims closes after DurableTimeout,
// releasing its locks; the client then gets the file back by identity,
// told its locks are gone.
func TestDurableTimeout(t *testing.T) {
	e := newEnv(t, func(c *ServerConfig) { c.DurableTimeout = 200 * time.Millisecond })
	ctx := ctxT(t)
	id, fid, other, ho := e.droppedHolder()
	if err := other.Lock(ctx, ho, wlock(2, 0, 0), true); err != nil {
		t.Fatalf("waiting for the abandoned lock: %v", err)
	}
	_, _, reclaimed, err := e.tree("data").Reopen(ctx, id, fid, "db", os.O_RDWR)
	if err != nil || reclaimed {
		t.Errorf("Reopen after the timeout = reclaimed %v, %v; want re-opened by identity", reclaimed, err)
	}
}

// TestDurableLogoff: a client that logs off keeps nothing.
func TestDurableLogoff(t *testing.T) {
	e := newEnv(t)
	e.writeFile("db", "x")
	ctx := ctxT(t)
	c, tr, h, _, _ := e.durableOpen("db", os.O_RDWR)
	if err := tr.Lock(ctx, h, wlock(1, 0, 0), false); err != nil {
		t.Fatal(err)
	}
	if err := c.call(ctx, CmdLogoff, 0, &empty{}, &empty{}); err != nil {
		t.Fatal(err)
	}
	other := e.tree("data")
	ho := e.openRW(other, "db")
	eventually(t, "the lock to go with the logoff", func() bool { return other.Lock(ctx, ho, wlock(2, 0, 0), false) == nil })
}

// TestDurableCreateReplay: an O_EXCL create whose answer was lost is sent
// again with the same id on the next session: it gets the file it made,
// not EEXIST.
func TestDurableCreateReplay(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c, _, _, id, _ := e.durableOpen("new", os.O_RDWR|os.O_CREATE|os.O_EXCL)
	c.Close()
	tr := e.tree("data")
	h, _, fid, err := tr.OpenDurable(ctx, "new", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644, id)
	if err != nil || len(fid) == 0 {
		t.Fatalf("replayed O_EXCL create: %v", err)
	}
	if _, err := tr.WriteAt(ctx, h, []byte("mine"), 0); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := tr.OpenDurable(ctx, "new", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644, NewDurableID()); ToErrno(err) != 17 {
		t.Errorf("a new O_EXCL create of the same name: %v, want EEXIST", err)
	}
}

// TestDurableServerRestart: the server restarts (its state directory
// kept): REOPEN finds the same file by its identity — not the new file a
// local process put under the old name — and says the locks are gone.
func TestDurableServerRestart(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	e := newEnv(t, func(c *ServerConfig) { c.StateDir = state })
	e.writeFile("keep", "kept")
	e.writeFile("swap", "old")
	ctx := ctxT(t)
	_, _, _, idK, fidK := e.durableOpen("keep", os.O_RDWR)
	_, _, _, idS, fidS := e.durableOpen("swap", os.O_RDWR)

	e.srv.Close()
	os.Remove(filepath.Join(e.share, "swap"))
	e.writeFile("swap", "new")
	e.serve()

	tr := e.tree("data")
	h, a, reclaimed, err := tr.Reopen(ctx, idK, fidK, "keep", os.O_RDWR)
	if err != nil || reclaimed || a.Size != 4 {
		t.Fatalf("Reopen after a restart = reclaimed %v size %d %v; want re-opened by identity", reclaimed, a.Size, err)
	}
	buf := make([]byte, 8)
	if n, _ := tr.ReadAt(ctx, h, buf, 0); string(buf[:n]) != "kept" {
		t.Errorf("read %q", buf[:n])
	}
	if _, _, _, err := tr.Reopen(ctx, idS, fidS, "swap", os.O_RDWR); ToErrno(err) != 116 { // ESTALE
		t.Errorf("Reopen of a file replaced during the restart: %v, want ESTALE", err)
	}
	// Without a state directory the key does not survive: nothing is
	// found by identity, and no other file either.
	e.cfg.StateDir = ""
	e.srv.Close()
	e.serve()
	if _, _, _, err := e.tree("data").Reopen(ctx, idK, fidK, "keep", os.O_RDWR); err == nil {
		t.Error("a FileID sealed with another key opened a file")
	}
}

// BenchmarkOpenClose is OPEN and CLOSE of an existing file at queue depth
// 1, plain and durable: what a durable open (its FileID — statx,
// name_to_handle_at, an HMAC — and its registration) adds to each open.
func BenchmarkOpenClose(b *testing.B) {
	e := newEnv(b)
	e.writeFile("f", "x")
	tr := e.tree("data")
	ctx := context.Background()
	for _, durable := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "durable"}[durable], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var h Handle
				var err error
				if durable {
					h, _, _, err = tr.OpenDurable(ctx, "f", os.O_RDWR, 0, NewDurableID())
				} else {
					h, _, err = tr.Open(ctx, "f", os.O_RDWR, 0)
				}
				if err != nil {
					b.Fatal(err)
				}
				if err := tr.CloseHandle(ctx, h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
