package servertest

import (
	"testing"

	"github.com/lwiofs/lwiofs/transport"
)

// Engine is what ServeOn needs of the LWIO server (server.Server; this
// package cannot import it, the server's own tests import this one).
type Engine interface {
	Listen(p transport.Provider, addr string) (transport.Listener, error)
	Serve(l transport.Listener) error
}

// ServeOn has srv listen on p at a free loopback port and serve there in
// the background; it returns the listener's address. Closing srv ends it.
func ServeOn(t testing.TB, srv Engine, p transport.Provider) string {
	t.Helper()
	l, err := srv.Listen(p, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	return l.Addr()
}
