package session

import (
	"net"
	"sync"
	"testing"
	"time"
)

// lateConn is a connection whose reader sets its first deadline (the
// setup timeout) only after the server's Close has told it to stop
// (stopReading's deadline of now): a connection accepted just before a
// SIGTERM, whose reader had not yet started when the shutdown began.
type lateConn struct {
	net.Conn
	entered chan struct{} // the reader came to its first deadline
	stopped chan struct{} // Close set a deadline of now
	once    sync.Once
	stop    sync.Once
}

func (c *lateConn) SetReadDeadline(d time.Time) error {
	if time.Until(d) <= 0 {
		c.stop.Do(func() { close(c.stopped) })
		return c.Conn.SetReadDeadline(d)
	}
	first := false
	c.once.Do(func() { first = true; close(c.entered) })
	if first {
		select {
		case <-c.stopped:
		case <-time.After(10 * time.Second):
		}
	}
	return c.Conn.SetReadDeadline(d)
}

type lateListener struct {
	net.Listener
	conns chan *lateConn
}

func (l *lateListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &lateConn{Conn: nc, entered: make(chan struct{}), stopped: make(chan struct{})}
	l.conns <- c
	return c, nil
}

// TestCloseStopsConnectionAcceptedJustBefore: a connection whose reader
// starts after Close began does not hold the shutdown for ShutdownTimeout
// (its setup deadline must not undo Close's stop): SIGTERM right after a
// client connected stops the server at once, and Close does not report
// requests that never were.
func TestCloseStopsConnectionAcceptedJustBefore(t *testing.T) {
	e := newEnv(t)
	cfg := e.cfg
	cfg.ShutdownTimeout = 5 * time.Second
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ll := &lateListener{Listener: l, conns: make(chan *lateConn, 1)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ll) }()
	nc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := <-ll.conns
	select {
	case <-c.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection's reader never started")
	}
	start := time.Now()
	err = srv.Close()
	took := time.Since(start)
	if took > 2*time.Second {
		t.Errorf("Close took %v with one connection that sent nothing", took)
	}
	if err != nil {
		t.Errorf("Close = %v, want nil: no request was running", err)
	}
	if err := <-served; err != ErrServerClosed {
		t.Errorf("Serve = %v, want ErrServerClosed", err)
	}
}
