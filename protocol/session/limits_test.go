package session

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// dialFrom opens a TCP connection to addr from the loopback address src
// (127.0.0.0/8 is all local on Linux), standing for a client host.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// refused reports whether the server closed c at accept: a read ends at
// once with EOF (or a reset), where an admitted connection waits for its
// session setup until the server's setup timeout (a minute here).
func refused(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return errors.Is(err, io.EOF) || !(errors.As(err, &ne) && ne.Timeout())
}

// TestPendingLimits: connections that do not log on are limited per
// source address (the excess closed at accept) and in all (the oldest
// closed to make room for a new one, so idle connections cannot starve
// logons); a logon from another address gets through; a connection that
// logged on no longer counts.
func TestPendingLimits(t *testing.T) {
	e := newEnv(t, func(c *ServerConfig) { c.MaxPending = 4; c.MaxPendingPerAddr = 2; c.SetupTimeout = time.Minute })
	oldest := dialFrom(t, "127.0.0.11", e.addr)
	dialFrom(t, "127.0.0.11", e.addr)
	if !refused(dialFrom(t, "127.0.0.11", e.addr)) {
		t.Error("a third pending connection from one address was accepted (max_pending_per_address 2)")
	}
	dialFrom(t, "127.0.0.12", e.addr)
	dialFrom(t, "127.0.0.13", e.addr)
	fifth := dialFrom(t, "127.0.0.14", e.addr)
	if !refused(oldest) {
		t.Error("with max_pending_connections (4) reached, the oldest pending connection was not closed for a new one")
	}
	if !e.waitLogged("connection refused at accept") {
		t.Error("no log line for the refusals")
	}
	// All the room is taken again by idle connections: a logon still
	// gets through, making room for itself, and once logged on it no
	// longer counts.
	c, err := e.dial(testUser, testPassword)
	if err != nil {
		t.Fatalf("a logon with every pending slot taken by idle connections: %v", err)
	}
	defer c.Close()
	// The logon closed the oldest idle connection to get in, then left
	// the count: three remain.
	if total, _ := e.srv.pending.counts("127.0.0.1"); total != 3 {
		t.Errorf("%d connections pending after the logon, want 3 (the logged-on one not among them)", total)
	}
	if refused(fifth) {
		t.Error("the newest idle connection was closed; the oldest should have been")
	}
}

// TestIdleTimeout: a logged-on session that sends nothing is closed after
// the idle timeout; one whose client sends its keepalive ECHO stays.
func TestIdleTimeout(t *testing.T) {
	const idle = time.Second
	e := newEnv(t, func(c *ServerConfig) { c.IdleTimeout = idle })
	// The keepalive interval is also how long the client waits for its
	// ECHO's answer before it drops the connection itself: 250 ms, not
	// less (a loaded -race run answers late), and still four ECHOs to an
	// idle timeout. It is dialed first, so it would be idle for longer
	// than the silent one.
	alive, err := Dial(ctxT(t), e.addr, ClientConfig{User: testUser, Password: testPassword, KeepAlive: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer alive.Close()
	silent, err := Dial(ctxT(t), e.addr, ClientConfig{User: testUser, Password: testPassword, KeepAlive: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	select {
	case <-silent.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("a silent session was not closed after its idle timeout")
	}
	if !e.waitLogged("closing a session idle for longer than idle_timeout") {
		t.Error("no log line for the idle session")
	}
	// The kept session outlives the silent one by another idle timeout
	// (the silent one's close alone proves nothing: the server may not
	// have checked the other yet).
	select {
	case <-alive.Done():
		t.Fatalf("the session with a keepalive was closed: %v", alive.Err())
	case <-time.After(idle):
	}
	tr, err := alive.TreeConnect(ctxT(t), "data")
	if err != nil {
		t.Fatalf("the session with a keepalive was closed: %v (session: %v)", err, alive.Err())
	}
	if _, err := tr.GetAttr(ctxT(t), ""); err != nil {
		t.Errorf("the session with a keepalive: %v", err)
	}
}

// TestHandleLimitsDurable: durable handles count against the user's
// limit — a parked one too, as it still holds its descriptor — and a
// REOPEN by identity after a restart takes a handle like an OPEN; the
// reclaim of a parked open takes none (it was counted when opened).
func TestHandleLimitsDurable(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	e := newEnv(t, func(c *ServerConfig) { c.MaxUserHandles = 2; c.StateDir = state })
	e.writeFile("f", "f")
	e.writeFile("g", "g")
	ctx := ctxT(t)
	c, _, _, id, fid := e.durableOpen("f", os.O_RDWR)
	c.Close() // the connection goes: the open is parked
	tr := e.tree("data")
	if _, _, err := tr.Open(ctx, "g", os.O_RDONLY, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tr.Open(ctx, "g", os.O_RDONLY, 0); ToErrno(err) != syscall.EMFILE {
		t.Errorf("a third open beside a parked durable one and a plain one: %v, want EMFILE", err)
	}
	if _, _, reclaimed, err := tr.Reopen(ctx, id, fid, "f", os.O_RDWR); err != nil || !reclaimed {
		t.Fatalf("reclaiming the parked open at the limit: reclaimed %v, %v", reclaimed, err)
	}

	e.srv.Close()
	e.serve()
	tr = e.tree("data")
	var hs []Handle
	for range 2 {
		hs = append(hs, e.open(tr, "g", os.O_RDONLY))
	}
	if _, _, _, err := tr.Reopen(ctx, id, fid, "f", os.O_RDWR); ToErrno(err) != syscall.EMFILE {
		t.Errorf("REOPEN by identity at the limit: %v, want EMFILE", err)
	}
	tr.CloseHandle(ctx, hs[0])
	if _, _, reclaimed, err := tr.Reopen(ctx, id, fid, "f", os.O_RDWR); err != nil || reclaimed {
		t.Errorf("REOPEN by identity below the limit: reclaimed %v, %v; want re-opened", reclaimed, err)
	}
}
