package soft

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// rawPeer connects to a softrdma listener with a plain socket and does the
// hello by hand, so a test can send whatever it likes; it also returns the
// connection the listener accepted.
func rawPeer(t *testing.T, ln transport.Listener) (net.Conn, transport.Conn) {
	return rawPeerOn(t, ln, false)
}

// rawPeerOn is rawPeer on TCP, or with local on the listener's same-host
// unix socket, moved to by hand.
func rawPeerOn(t *testing.T, ln transport.Listener, local bool) (net.Conn, transport.Conn) {
	t.Helper()
	nc, err := net.Dial("tcp", ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	var b [helloSize]byte
	h := hello{RNRTimeout: 100 * time.Millisecond, MaxMessageSize: 1 << 20}
	if local {
		h.Flags = helloLocal
	}
	h.encode(b[:])
	if _, err := nc.Write(b[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		t.Fatal(err)
	}
	if local {
		nc = moveLocal(t, nc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return nc, c
}

func frame(h frameHeader, payload []byte) []byte {
	b := make([]byte, frameHeaderSize, frameHeaderSize+len(payload))
	h.Length = uint32(len(payload))
	h.encode(b)
	return append(b, payload...)
}

// readAll reads what the provider sends until it closes (or 5 s).
func readAll(t *testing.T, nc net.Conn) []byte {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("provider did not close the connection; sent %x", b)
	}
	return b
}

// TestHostileFrames: a peer that is not a well-behaved softrdma provider
// gets a NAK or a closed connection, never placement or a crash, and the
// accepted connection ends flushed.
func TestHostileFrames(t *testing.T) {
	t.Run("tcp", func(t *testing.T) { hostileFrames(t, false) })
	t.Run("unix", func(t *testing.T) { hostileFrames(t, true) })
}

func hostileFrames(t *testing.T, local bool) {
	p := New(Options{})
	ln, err := p.Listen("127.0.0.1:0", transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	secret, _ := p.Domain().Alloc(4096, transport.AccessLocal)
	open, _ := p.Domain().Alloc(4096, transport.AccessLocal|transport.AccessRemoteWrite)
	for _, tc := range []struct {
		name    string
		send    []byte
		wantNak transport.Status // 0: just closed
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789"), 0},
		{"write with a guessed handle", frame(frameHeader{Type: frameWrite, RKey: 1, Addr: open.Addr()}, make([]byte, 8)), transport.StatusRemoteAccess},
		{"write to a local-only region", frame(frameHeader{Type: frameWrite, RKey: secret.Handle(), Addr: secret.Addr()}, make([]byte, 8)), transport.StatusRemoteAccess},
		{"write past the end", frame(frameHeader{Type: frameWrite, RKey: open.Handle(), Addr: open.Addr() + 4090}, make([]byte, 8)), transport.StatusRemoteAccess},
		{"oversized message", frame(frameHeader{Type: frameWrite, RKey: open.Handle(), Addr: open.Addr(), Length: 1 << 30}, nil)[:frameHeaderSize], transport.StatusRemoteInvalidRequest},
		{"ack for nothing", frame(frameHeader{Type: frameAck, Ack: 5}, nil), 0},
		{"nak for nothing", frame(frameHeader{Type: frameNak, Status: uint8(transport.StatusRemoteAccess)}, nil), 0},
		{"send with no receive", frame(frameHeader{Type: frameSend}, make([]byte, 8)), transport.StatusRNRRetryExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, c := rawPeerOn(t, ln, local)
			if tc.name == "oversized message" {
				// A header announcing 1 GiB (the bytes never follow).
				var h frameHeader
				_ = h.decode(tc.send)
				h.Length = 1 << 30
				h.encode(tc.send)
			}
			if _, err := nc.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			got := readAll(t, nc)
			nc.Close() // the provider stops draining at once
			if tc.wantNak != 0 {
				var h frameHeader
				if len(got) < frameHeaderSize || h.decode(got[len(got)-frameHeaderSize:]) != nil || h.Type != frameNak || transport.Status(h.Status) != tc.wantNak {
					t.Fatalf("provider sent %x, want a NAK with %v", got, tc.wantNak)
				}
			}
			if cs := drain(t, c); len(cs) != 0 {
				t.Errorf("completions on the accepted connection: %v", cs)
			}
		})
	}
	for i, b := range secret.Bytes() {
		if b != 0 {
			t.Fatalf("local-only region byte %d changed", i)
		}
	}
	for i, b := range open.Bytes() {
		if b != 0 {
			t.Fatalf("remote-write region byte %d changed", i)
		}
	}
}

// TestHostileHandshakes: random bytes and silence on the listener are
// dropped without an Accept, and the listener keeps serving.
func TestHostileHandshakes(t *testing.T) {
	p := New(Options{HandshakeTimeout: 100 * time.Millisecond})
	ln, err := p.Listen("127.0.0.1:0", transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for i := 0; i < 20; i++ {
		nc, err := net.Dial("tcp", ln.Addr())
		if err != nil {
			t.Fatal(err)
		}
		junk := make([]byte, 1+i*7)
		_, _ = rand.Read(junk)
		if i%4 == 0 {
			junk = nil // a silent client
		}
		_, _ = nc.Write(junk)
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.Copy(io.Discard, nc)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("attempt %d: the listener kept a bad client open", i)
		}
		nc.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if c, err := ln.Accept(ctx); err == nil {
		t.Fatalf("a bad client was accepted: %v", c.RemoteAddr())
	}
	// The same listener still serves a real client.
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cli, err := New(Options{}).Dial(ctx, ln.Addr(), transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	srv, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
}
