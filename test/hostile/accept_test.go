package hostile

import (
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/test/hostile/rig"
)

// emfileListener fails its first Accept calls with EMFILE, as a real
// listener does while the process is out of file descriptors (which a
// client flooding the port with idle connections can bring about), then
// accepts normally.
type emfileListener struct {
	net.Listener
	fail atomic.Int32
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.fail.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestSessionSurvivesEMFILE: running out of file descriptors for a moment
// must not stop the session server from accepting once they are back.
func TestSessionSurvivesEMFILE(t *testing.T) {
	s := newServer(t, rig.Options{})
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &emfileListener{Listener: inner}
	l.fail.Store(3)
	done := make(chan error, 1)
	go func() { done <- s.Sess.Serve(l) }()
	defer inner.Close()
	// Kick the listener: the first accepts fail with EMFILE.
	for i := 0; i < 3; i++ {
		if c, err := net.Dial("tcp", inner.Addr().String()); err == nil {
			defer c.Close()
		}
	}
	select {
	case err := <-done:
		t.Fatalf("session Serve returned after EMFILE: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	// Descriptors are back: a client on that listener is served.
	ctx := ctx10(t)
	c, err := session.Dial(ctx, inner.Addr().String(), session.ClientConfig{User: rig.User, Password: rig.Password, KeepAlive: -1})
	if err != nil {
		t.Fatalf("session setup after the EMFILE errors: %v", err)
	}
	if _, err := c.TreeConnect(ctx, rig.Share); err != nil {
		t.Fatal(err)
	}
	c.Close()
	figures.Add(t, "session listener survived 3 EMFILE accept errors and served a client after them")
}
