package soft

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
)

// moveLocal does the client's same-host step by hand on nc, whose hellos
// (the client's asking for it) are done: it reads the offer, presents the
// client token on the unix socket, checks the server token and says 'U'.
func moveLocal(t *testing.T, nc net.Conn) net.Conn {
	t.Helper()
	var b [offerSize]byte
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		t.Fatalf("reading the offer: %v", err)
	}
	_ = nc.SetReadDeadline(time.Time{})
	var o offer
	o.decode(b[:])
	uc, err := net.Dial("unix", localName(o.id))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uc.Close() })
	if _, err := uc.Write(o.cli[:]); err != nil {
		t.Fatal(err)
	}
	var tok [localTokSize]byte
	if _, err := io.ReadFull(uc, tok[:]); err != nil || tok != o.serv {
		t.Fatalf("server token %x, %v; want %x", tok, err, o.serv)
	}
	if _, err := nc.Write([]byte{decideUnix}); err != nil {
		t.Fatal(err)
	}
	return uc
}

func carrierOf(c transport.Conn) string { return c.(*conn).Carrier() }

// TestConformanceUnix runs the suite with the frames on the same-host unix
// socket (TestConformance runs it on pipes).
func TestConformanceUnix(t *testing.T) {
	opts := Options{RNRTimeout: testRNR, NoPipes: true}
	conformance.Run(t, conformance.Env{Client: New(opts), Server: New(opts), RNRTimeout: testRNR})
}

// TestConformanceTCP runs the suite with the same-host path off, as
// between two hosts (TestConformance runs it on pipes).
func TestConformanceTCP(t *testing.T) {
	opts := Options{RNRTimeout: testRNR, TCPOnly: true}
	conformance.Run(t, conformance.Env{Client: New(opts), Server: New(opts), RNRTimeout: testRNR})
}

// TestSameHostCarrier: two providers on one host move to the unix socket
// (TestConformanceUnix), with shared memory unless either end has
// NoSharedMemory, on to pipes passed over it unless either end has NoPipes
// (TestConformance), and stay on TCP if either end is TCPOnly, as a
// peer from before the same-host path is; the connection carries data and
// is named by its TCP addresses either way.
func TestSameHostCarrier(t *testing.T) {
	for _, tc := range []struct {
		name           string
		cli, srv       bool // TCPOnly
		cliNoM, srvNoM bool // NoSharedMemory
		cliNoP, srvNoP bool // NoPipes
		wantCarier     string
	}{
		{"both", false, false, false, false, false, false, CarrierPipeShm},
		{"client TCPOnly", true, false, false, false, false, false, CarrierTCP},
		{"server TCPOnly", false, true, false, false, false, false, CarrierTCP},
		// A listener that does not offer shared memory (as one from
		// before it) or a dialer that does not ask: the pipes carry
		// every byte.
		{"server NoSharedMemory", false, false, false, true, false, false, CarrierPipe},
		{"client NoSharedMemory", false, false, true, false, false, false, CarrierPipe},
		// Pipes only when both ends have them; with shared memory or not.
		{"server NoPipes", false, false, false, false, false, true, CarrierShm},
		{"client NoPipes", false, false, false, false, true, false, CarrierShm},
		{"NoPipes, NoSharedMemory", false, false, true, true, true, true, CarrierUnix},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := New(Options{TCPOnly: tc.cli, NoSharedMemory: tc.cliNoM, NoPipes: tc.cliNoP})
			sp := New(Options{TCPOnly: tc.srv, NoSharedMemory: tc.srvNoM, NoPipes: tc.srvNoP})
			cli, srv := pair(t, cp, sp, transport.Config{})
			if a, b := carrierOf(cli), carrierOf(srv); a != tc.wantCarier || b != tc.wantCarier {
				t.Fatalf("carriers %s/%s, want %s", a, b, tc.wantCarier)
			}
			if cli.RemoteAddr() != srv.LocalAddr() || cli.LocalAddr() != srv.RemoteAddr() {
				t.Errorf("addresses %s->%s and %s->%s", cli.LocalAddr(), cli.RemoteAddr(), srv.LocalAddr(), srv.RemoteAddr())
			}
			sendOne(t, cli, srv)
			writeOne(t, srv, cli)
			if got, want := sp.shmRefs.Load() > 0 && sp.shmCopies.Load() > 0, tc.wantCarier == CarrierShm || tc.wantCarier == CarrierPipeShm; got != want {
				t.Errorf("shared memory used: %v (%d references, %d copies), want %v", got, sp.shmRefs.Load(), sp.shmCopies.Load(), want)
			}
		})
	}
}

// sendOne SENDs 1 MiB from cli to srv and checks it arrived. The source
// is open to remote write, as the engine's pooled data buffers are: on
// shared memory it goes by reference.
func sendOne(t *testing.T, cli, srv transport.Conn) {
	t.Helper()
	src := mustAlloc(t, cli, 1<<20, transport.AccessLocal|transport.AccessRemoteWrite)
	dst := mustAlloc(t, srv, 1<<20, transport.AccessLocal)
	_, _ = rand.Read(src.Bytes())
	if err := srv.PostRecv(transport.RecvWR{ID: 1, Buf: transport.Segment{Region: dst, Length: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	if err := cli.Post(transport.SendWR{ID: 2, Op: transport.OpSend, SGL: []transport.Segment{{Region: src, Length: 1 << 20}}}); err != nil {
		t.Fatal(err)
	}
	if c := waitOne(t, srv, 5*time.Second); c.Status != transport.StatusSuccess || c.Len != 1<<20 {
		t.Fatalf("receive: %+v", c)
	}
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("payload differs")
	}
}

// TestSameHostFallback: when the offered unix socket cannot be reached
// (another host, another network namespace; here closed under the
// listener) the client stays on TCP.
func TestSameHostFallback(t *testing.T) {
	sp := New(Options{})
	ln, err := sp.Listen("127.0.0.1:0", transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ln.(*listener).local.close()
	cli, srv := conformance.Connect(t, New(Options{}), ln, ln.Addr(), transport.Config{}, 10*time.Second)
	if a, b := carrierOf(cli), carrierOf(srv); a != CarrierTCP || b != CarrierTCP {
		t.Fatalf("carriers %s/%s, want tcp", a, b)
	}
	sendOne(t, cli, srv)
}

// TestSameHostHostile: the unix socket serves only the client the offer
// was made to.
func TestSameHostHostile(t *testing.T) {
	p := New(Options{HandshakeTimeout: 2 * time.Second})
	ln, err := p.Listen("127.0.0.1:0", transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	name := localName(ln.(*listener).local.id)
	noAccept := func(t *testing.T) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if c, err := ln.Accept(ctx); err == nil {
			t.Fatalf("accepted %v", c)
		}
	}
	t.Run("unknown token", func(t *testing.T) {
		uc, err := net.Dial("unix", name)
		if err != nil {
			t.Fatal(err)
		}
		defer uc.Close()
		var tok [localTokSize]byte
		_, _ = rand.Read(tok[:])
		_, _ = uc.Write(tok[:])
		if got := readAll(t, uc); len(got) != 0 {
			t.Fatalf("the listener answered an unknown token with %x", got)
		}
		noAccept(t)
	})
	t.Run("another client's token", func(t *testing.T) {
		// A local user who got an offer of its own cannot use the token
		// of a connection it does not own, nor its own twice.
		nc := helloLocalRaw(t, ln.Addr())
		var b [offerSize]byte
		if _, err := io.ReadFull(nc, b[:]); err != nil {
			t.Fatal(err)
		}
		var o offer
		o.decode(b[:])
		for i, tok := range [][localTokSize]byte{o.serv, o.cli, o.cli} {
			uc, err := net.Dial("unix", name)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = uc.Write(tok[:])
			var got []byte
			if i == 1 { // once answered, the token is no longer pending
				got = make([]byte, localTokSize)
				if _, err := io.ReadFull(uc, got); err != nil {
					t.Fatal(err)
				}
				ll := ln.(*listener).local
				ll.mu.Lock()
				po := ll.pending[o.cli]
				ll.mu.Unlock()
				if po != nil {
					t.Fatal("the client token is still pending after it was presented")
				}
			}
			got = append(got, readAll(t, uc)...)
			uc.Close()
			if want := i == 1; (len(got) > 0) != want {
				t.Fatalf("token %d: answer %x, want one: %v", i, got, want)
			}
		}
	})
	t.Run("moves without its token", func(t *testing.T) {
		nc := helloLocalRaw(t, ln.Addr())
		var b [offerSize]byte
		if _, err := io.ReadFull(nc, b[:]); err != nil {
			t.Fatal(err)
		}
		_, _ = nc.Write([]byte{decideUnix})
		if got := readAll(t, nc); len(got) != 0 {
			t.Fatalf("got %x", got)
		}
		noAccept(t)
	})
	// The listener still serves a real client, on the unix socket.
	cli, srv := conformance.Connect(t, New(Options{}), ln, ln.Addr(), transport.Config{}, 10*time.Second)
	if carrierOf(cli) != CarrierPipeShm || carrierOf(srv) != CarrierPipeShm {
		t.Fatalf("carriers %s/%s", carrierOf(cli), carrierOf(srv))
	}
}

// helloLocalRaw dials addr and exchanges hellos asking for the same-host
// path.
func helloLocalRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	var b [helloSize]byte
	(&hello{RNRTimeout: time.Second, MaxMessageSize: 1 << 20, Flags: helloLocal}).encode(b[:])
	if _, err := nc.Write(b[:]); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		t.Fatal(err)
	}
	return nc
}

// TestSameHostImpostor: a server whose offer names a unix socket that
// does not answer with the server token (a squatter, a stale name) keeps
// the client on TCP.
func TestSameHostImpostor(t *testing.T) {
	var o offer
	_, _ = rand.Read(o.id[:])
	_, _ = rand.Read(o.cli[:])
	_, _ = rand.Read(o.serv[:])
	ul, err := net.Listen("unix", localName(o.id))
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	go func() {
		for {
			c, err := ul.Accept()
			if err != nil {
				return
			}
			var tok [localTokSize]byte
			_, _ = io.ReadFull(c, tok[:])
			_, _ = c.Write(tok[:]) // echoes the client token: not the server's
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	decided := make(chan byte, 1)
	go func() {
		c, _, _ := fakeListenerHello(tl)
		if c == nil {
			return
		}
		defer c.Close()
		var ob [offerSize]byte
		o.encode(ob[:])
		_, _ = c.Write(ob[:])
		var d [1]byte
		_, _ = io.ReadFull(c, d[:])
		decided <- d[0]
		_, _ = io.Copy(io.Discard, c)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cli, err := New(Options{}).Dial(ctx, tl.Addr().String(), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if d := <-decided; d != decideTCP || carrierOf(cli) != CarrierTCP {
		t.Fatalf("client said %q, carrier %s; want it to stay on TCP", d, carrierOf(cli))
	}
}

// TestSameHostBuffer: both ends of a unix connection get localBuffer of
// send buffer (up to net.core.wmem_max), so a 1 MiB frame goes in one
// write rather than five fills and wake-ups.
func TestSameHostBuffer(t *testing.T) {
	cli, srv := pair(t, New(Options{NoPipes: true}), New(Options{NoPipes: true}), transport.Config{})
	want := localBuffer
	if b, err := os.ReadFile("/proc/sys/net/core/wmem_max"); err == nil {
		if m, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && m < want {
			want = m
		}
	}
	for side, c := range map[string]transport.Conn{"client": cli, "server": srv} {
		uc, ok := c.(*conn).nc.(*net.UnixConn)
		if !ok {
			t.Fatalf("%s: not on a unix socket", side)
		}
		rc, err := uc.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		_ = rc.Control(func(fd uintptr) {
			got, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		})
		if err != nil || got < want { // the kernel reports twice what was set
			t.Errorf("%s: SO_SNDBUF %d (%v), want ≥ %d", side, got, err, want)
		}
	}
}
