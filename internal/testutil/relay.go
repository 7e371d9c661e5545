package testutil

import (
	"net"
	"testing"
)

// Relay listens on a loopback port and relays every connection to target:
// for each client it accepts it dials target and hands both connections to
// pipe, which starts the copying (in goroutines of its own) and returns. A
// client whose dial fails is closed. Relay returns the address it listens
// on; when the test ends the listener closes and Relay waits for its
// accepting goroutine, so pipe is not called after that.
func Relay(t testing.TB, target string, pipe func(client, server net.Conn)) string {
	t.Helper()
	return RelayFunc(t, func() string { return target }, pipe)
}

// RelayFunc is Relay to target(), asked at each connection: for a relay
// that must start before the server it relays to.
func RelayFunc(t testing.TB, target func() string, pipe func(client, server net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target())
			if err != nil {
				c.Close()
				continue
			}
			pipe(c, s)
		}
	}()
	return l.Addr().String()
}
