package soft

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
)

// farClient is a client provider that takes every server for one on
// another host, as sameHost does when the connection's two ends have
// different, not both loopback, addresses (TestSameHostAddrs).
func farClient() *Provider {
	p := New(Options{})
	p.sameHost = func(*net.TCPConn) bool { return false }
	return p
}

func TestSameHostAddrs(t *testing.T) {
	for _, c := range []struct {
		l, r string
		same bool
	}{
		{"127.0.0.1", "127.0.0.1", true},
		{"127.0.0.1", "127.0.1.1", true}, // a hostname in /etc/hosts
		{"::1", "::1", true},
		{"10.0.0.5", "10.0.0.5", true},      // the host's own address
		{"10.0.0.5", "10.0.0.6", false},     // another host
		{"172.17.0.2", "172.17.0.1", false}, // a container's server, a host's client
		{"127.0.0.1", "10.0.0.6", false},
	} {
		l := &net.TCPAddr{IP: net.ParseIP(c.l), Port: 1}
		r := &net.TCPAddr{IP: net.ParseIP(c.r), Port: 2}
		if got := sameHostAddrs(l, r); got != c.same {
			t.Errorf("%s -> %s: same host %v, want %v", c.l, c.r, got, c.same)
		}
	}
}

// TestSameHostOtherHost: a client whose server is on another host never
// dials the name that server offers. A local user of the client's host
// who bound that name there (any TCP client of the server learns it)
// would read the client token; with an account on the server's host too,
// it would present the token there, relay the server token back and sit
// between the two. Here the server's unix socket is gone (it is on the
// other host) and a squatter holds the name on this one.
func TestSameHostOtherHost(t *testing.T) {
	ln, err := New(Options{}).Listen("127.0.0.1:0", transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ll := ln.(*listener).local
	name := localName(ll.id)
	ll.close()
	sq, err := net.Listen("unix", name)
	if err != nil {
		t.Fatal(err)
	}
	defer sq.Close()
	stolen := make(chan []byte, 1)
	go func() {
		c, err := sq.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, localTokSize)
		n, _ := io.ReadFull(c, b)
		stolen <- b[:n]
	}()
	cli, srv := conformance.Connect(t, farClient(), ln, ln.Addr(), transport.Config{}, 10*time.Second)
	select {
	case b := <-stolen:
		t.Fatalf("a squatter on the client's host read the client token %x", b)
	default:
	}
	if a, b := carrierOf(cli), carrierOf(srv); a != CarrierTCP || b != CarrierTCP {
		t.Fatalf("carriers %s/%s, want tcp", a, b)
	}
	sendOne(t, cli, srv)
}

// TestSameHostRelay: a hostile server on another host cannot hand its
// client the unix socket of a server on the client's host, by relaying an
// offer it got from that server as a client: the client would end up
// connected to a server it never dialled, and that server would take it
// for the relay's connection.
func TestSameHostRelay(t *testing.T) {
	local, err := New(Options{HandshakeTimeout: 2 * time.Second}).Listen("127.0.0.1:0", transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	go func() {
		c, h, err := fakeListenerHello(rl)
		if c == nil {
			return
		}
		defer c.Close()
		if err != nil || h.Flags&helloLocal == 0 {
			_, _ = io.Copy(io.Discard, c)
			return
		}
		// The client asked: relay the local server's offer, and the
		// client's decision back to it.
		up := helloLocalRaw(t, local.Addr())
		var ob [offerSize]byte
		if _, err := io.ReadFull(up, ob[:]); err != nil {
			return
		}
		_, _ = c.Write(ob[:])
		var d [1]byte
		if _, err := io.ReadFull(c, d[:]); err != nil {
			return
		}
		_, _ = up.Write(d[:])
		_, _ = io.Copy(io.Discard, c)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cli, err := farClient().Dial(ctx, rl.Addr().String(), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	actx, acancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer acancel()
	if c, err := local.Accept(actx); err == nil {
		c.Close()
		t.Fatalf("the server on this host accepted the connection dialled to %s (client carrier %s)", rl.Addr(), carrierOf(cli))
	}
	if carrierOf(cli) != CarrierTCP {
		t.Fatalf("client carrier %s, want tcp", carrierOf(cli))
	}
}

// fakeListenerHello accepts one connection on l and exchanges hellos as a
// listener offering the same-host path; c is nil if nothing connected.
func fakeListenerHello(l net.Listener) (c net.Conn, peer hello, err error) {
	c, err = l.Accept()
	if err != nil {
		return nil, hello{}, err
	}
	var b [helloSize]byte
	(&hello{RNRTimeout: time.Second, MaxMessageSize: 1 << 20, Flags: helloLocal}).encode(b[:])
	if _, err = c.Write(b[:]); err == nil {
		if _, err = io.ReadFull(c, b[:]); err == nil {
			err = peer.decode(b[:])
		}
	}
	return c, peer, err
}
