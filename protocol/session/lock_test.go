package session

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

func wlock(owner, start, end uint64) Lock {
	return Lock{Owner: owner, Start: start, End: end, Type: LockWrite}
}

func (e *env) openRW(tr *Tree, p string) Handle {
	e.t.Helper()
	h, _, err := tr.Open(ctxT(e.t), p, os.O_RDWR, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return h
}

// waitLocked runs a waiting Lock in the background.
func waitLocked(ctx context.Context, tr *Tree, h Handle, lk Lock) chan error {
	ch := make(chan error, 1)
	go func() { ch <- tr.Lock(ctx, h, lk, true) }()
	return ch
}

// contended writes db and opens it on two sessions, A and B, A's owner 1
// holding a write lock on byte 0.
func (e *env) contended() (a, b *Tree, ha, hb Handle) {
	e.t.Helper()
	e.writeFile("db", "x")
	a, b = e.tree("data"), e.tree("data")
	ha, hb = e.openRW(a, "db"), e.openRW(b, "db")
	if err := a.Lock(ctxT(e.t), ha, wlock(1, 0, 0), false); err != nil {
		e.t.Fatal(err)
	}
	return a, b, ha, hb
}

func (e *env) waiting(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.srv.lockTab.Waiting() != n {
		if time.Now().After(deadline) {
			t.Fatalf("server has %d lock waits, want %d", e.srv.lockTab.Waiting(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLocksBetweenSessions: a lock held through one session conflicts with
// another session's, GETLK reports it, a wait is granted when the holder
// unlocks, and UNLOCK and CLOSE release.
func TestLocksBetweenSessions(t *testing.T) {
	e := newEnv(t)
	e.writeFile("db", "0123456789")
	ctx := ctxT(t)
	a, b := e.tree("data"), e.tree("data")
	ha, hb := e.openRW(a, "db"), e.openRW(b, "db")

	if err := a.Lock(ctx, ha, wlock(1, 0, 4), false); err != nil {
		t.Fatal(err)
	}
	if err := b.Lock(ctx, hb, wlock(1, 4, 4), false); ToErrno(err) != 11 { // EAGAIN
		t.Fatalf("B against A's lock: %v, want EAGAIN", err)
	}
	got, err := b.TestLock(ctx, hb, wlock(1, 0, LockToEOF))
	if err != nil || got.Type != LockWrite || got.Start != 0 || got.End != 4 {
		t.Errorf("TestLock = %+v %v, want write 0-4", got, err)
	}
	ch := waitLocked(ctx, b, hb, wlock(1, 2, 2))
	e.waiting(t, 1)
	if err := a.Lock(ctx, ha, Lock{Owner: 1, Start: 0, End: 4, Type: Unlock}, false); err != nil {
		t.Fatal(err)
	}
	if err := <-ch; err != nil {
		t.Fatalf("B's wait: %v", err)
	}
	if err := a.Lock(ctx, ha, wlock(2, 2, 2), false); ToErrno(err) != 11 {
		t.Errorf("A against B's granted lock: %v, want EAGAIN", err)
	}
	if err := b.Unlock(ctx, hb, 1); err != nil {
		t.Fatal(err)
	}
	if err := a.Lock(ctx, ha, wlock(2, 0, LockToEOF), false); err != nil {
		t.Fatalf("A after B's UNLOCK: %v", err)
	}
	if err := a.CloseHandle(ctx, ha); err != nil {
		t.Fatal(err)
	}
	if err := b.Lock(ctx, hb, Lock{Owner: 3, Type: LockWrite, Flock: true}, false); err != nil {
		t.Fatalf("B after A closed its handle: %v", err)
	}
	if err := b.Lock(ctx, hb, Lock{Owner: 3, Type: LockWrite, Start: 5, End: 1}, false); err != protocol.StatusInvalidParameter {
		t.Errorf("a lock ending before it starts: %v", err)
	}
}

// TestLockWaitCancelled: a wait whose caller gives up is cancelled on the
// server (CANCEL by MessageID): nothing waits there any more and the lock
// is not taken later behind the caller's back. A wait whose connection
// dies ends too.
func TestLockWaitCancelled(t *testing.T) {
	e := newEnv(t)
	a, b, ha, hb := e.contended()
	ctx := ctxT(t)
	wctx, cancel := context.WithCancel(ctx)
	ch := waitLocked(wctx, b, hb, wlock(1, 0, 0))
	e.waiting(t, 1)
	cancel()
	if err := <-ch; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v, want context.Canceled", err)
	}
	e.waiting(t, 0)
	if err := a.Lock(ctx, ha, Lock{Owner: 1, Start: 0, End: 0, Type: Unlock}, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := a.Lock(ctx, ha, wlock(1, 0, 0), false); err != nil {
		t.Fatalf("the cancelled wait took the lock after all: %v", err)
	}
	// A CANCEL naming nothing.
	if err := b.c.call(ctx, CmdCancel, 0, &cancelReq{MessageID: 1}, &empty{}); err != StatusNotFound {
		t.Errorf("CANCEL of nothing: %v, want NOT_FOUND", err)
	}

	// The waiting session's connection dies.
	c := e.client()
	tc, err := c.TreeConnect(ctx, "data")
	if err != nil {
		t.Fatal(err)
	}
	hc := e.openRW(tc, "db")
	ch = waitLocked(ctx, tc, hc, wlock(7, 0, 0))
	e.waiting(t, 1)
	c.Close()
	if err := <-ch; !protocol.IsConnectionLost(err) {
		t.Errorf("wait on a closed connection: %v", err)
	}
	e.waiting(t, 0)
}

// TestLockWaitsHoldNoSlot: waits do not occupy the connection's request
// slots: with MaxInFlight 2, five waits and an ordinary request proceed.
func TestLockWaitsHoldNoSlot(t *testing.T) {
	e := newEnv(t, func(c *ServerConfig) { c.MaxInFlight = 2 })
	a, b, ha, hb := e.contended()
	ctx := ctxT(t)
	var chs []chan error
	for i := range 5 {
		chs = append(chs, waitLocked(ctx, b, hb, Lock{Owner: uint64(10 + i), Type: LockRead}))
	}
	e.waiting(t, 5)
	if _, err := b.GetAttr(ctx, "db"); err != nil {
		t.Fatalf("GETATTR with five waits pending: %v", err)
	}
	if err := a.Unlock(ctx, ha, 1); err != nil {
		t.Fatal(err)
	}
	for _, ch := range chs {
		if err := <-ch; err != nil {
			t.Errorf("read-lock wait: %v", err)
		}
	}
}

// TestSessionAppend: WRITE at WriteToEndOfFile appends whatever the handle
// was opened with, and reports the end it left; appends of two sessions
// and a local writer interleave without loss.
func TestSessionAppend(t *testing.T) {
	e := newEnv(t)
	e.writeFile("log", "0123")
	ctx := ctxT(t)
	a, b := e.tree("data"), e.tree("data")
	ha := e.openRW(a, "log")
	hb, _, err := b.Open(ctx, "log", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n, end, err := a.Append(ctx, ha, []byte("ab")); n != 2 || end != 6 || err != nil {
		t.Fatalf("Append = %d %d %v, want 2 6", n, end, err)
	}
	if n, err := a.WriteAt(ctx, ha, []byte("X"), 0); n != 1 || err != nil {
		t.Fatal(err)
	}
	local, err := os.OpenFile(filepath.Join(e.share, "log"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	var wg sync.WaitGroup
	for _, w := range []func(i int) error{
		func(i int) error { _, _, err := a.Append(ctx, ha, []byte("a-line\n")); return err },
		func(i int) error { _, err := b.WriteAt(ctx, hb, []byte("b-line\n"), -1); return err },
		func(i int) error { _, err := local.Write([]byte("l-line\n")); return err },
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				if err := w(i); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	data, _ := os.ReadFile(filepath.Join(e.share, "log"))
	if !strings.HasPrefix(string(data), "X123ab") {
		t.Errorf("log starts %q", data[:6])
	}
	for _, l := range []string{"a-line\n", "b-line\n", "l-line\n"} {
		if n := strings.Count(string(data), l); n != 100 {
			t.Errorf("%q %d times, want 100", l, n)
		}
	}
	ro, _, _ := a.Open(ctx, "log", os.O_RDONLY, 0)
	if _, _, err := a.Append(ctx, ro, []byte("no")); err != protocol.StatusAccessDenied {
		t.Errorf("append through a read-only handle: %v", err)
	}
	if err := a.call(ctx, CmdWrite, &writeReq{Handle: ha, Offset: 1 << 63, Data: []byte("x")}, &writeResp{}); ntstatus.ToErrno(err) != 22 {
		t.Errorf("WRITE at 2^63: %v, want EINVAL", err)
	}
}
