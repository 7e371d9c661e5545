package soft

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
)

func testAEAD(t testing.TB, k byte) cipher.AEAD {
	t.Helper()
	key := bytes.Repeat([]byte{k}, 16)
	b, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	a, err := cipher.NewGCM(b)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// sealPair keys cli and srv as one sealed connection: c2s with key 1,
// s2c with key 2; the client leads, the server follows unless bothLead.
func sealPair(t testing.TB, cli, srv transport.Conn, bothLead bool) {
	t.Helper()
	if err := transport.Seal(cli, transport.SealConfig{Send: testAEAD(t, 1), Recv: testAEAD(t, 2), Lead: true}); err != nil {
		t.Fatal(err)
	}
	if err := transport.Seal(srv, transport.SealConfig{Send: testAEAD(t, 2), Recv: testAEAD(t, 1), Lead: bothLead}); err != nil {
		t.Fatal(err)
	}
}

// TestConformanceSealed runs the transport suite over sealed connections.
func TestConformanceSealed(t *testing.T) {
	env := twoProviders()
	env.Connected = func(t *testing.T, cli, srv transport.Conn) { sealPair(t, cli, srv, true) }
	conformance.Run(t, env)
}

// tapProxy forwards one TCP connection between a dialer and target,
// records both directions, and lets a test alter the client's bytes.
type tapProxy struct {
	addr string
	mu   sync.Mutex
	c2s  []byte
	s2c  []byte
	// alter, when set, may change the client's bytes (at stream offset
	// off) before they are forwarded; it returns what to forward.
	alter func(off int, b []byte) []byte
}

func newTapProxy(t testing.TB, target string) *tapProxy {
	t.Helper()
	p := &tapProxy{}
	p.addr = testutil.Relay(t, target, func(a, b net.Conn) {
		go p.pipe(a, b, true)
		go p.pipe(b, a, false)
	})
	return p
}

func (p *tapProxy) pipe(from, to net.Conn, c2s bool) {
	defer to.Close()
	defer from.Close()
	buf := make([]byte, 64<<10)
	off := 0
	for {
		n, err := from.Read(buf)
		if n > 0 {
			b := append([]byte(nil), buf[:n]...)
			p.mu.Lock()
			if c2s {
				p.c2s = append(p.c2s, b...)
			} else {
				p.s2c = append(p.s2c, b...)
			}
			alter := p.alter
			p.mu.Unlock()
			if c2s && alter != nil {
				b = alter(off, b)
			}
			off += n
			if _, werr := to.Write(b); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *tapProxy) wire() (c2s, s2c []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Clone(p.c2s), bytes.Clone(p.s2c)
}

// proxiedPair connects a client to a server through a tapProxy, on TCP
// (the same-host path would go around the proxy); the server's provider
// logs to log, when not nil.
func proxiedPair(t *testing.T, log ...logrus.FieldLogger) (cli, srv transport.Conn, p *tapProxy) {
	t.Helper()
	opts := Options{RNRTimeout: testRNR, TCPOnly: true}
	sopts := opts
	if len(log) > 0 {
		sopts.Logger = log[0]
	}
	cli, srv = pairVia(t, New(opts), New(sopts), transport.Config{}, func(addr string) string {
		p = newTapProxy(t, addr)
		return p.addr
	})
	return cli, srv, p
}

var marker = []byte("LWIO-SEAL-MARKER-7f3a9c")

// exchange sends marker both ways, by SEND and by RDMA WRITE, and checks it
// arrived.
func exchange(t *testing.T, cli, srv transport.Conn) {
	t.Helper()
	size := 3*sealChunk + 100 // several chunks, the last short
	payload := bytes.Repeat(marker, size/len(marker)+1)[:size]
	for _, dir := range []struct {
		name     string
		from, to transport.Conn
	}{{"c2s", cli, srv}, {"s2c", srv, cli}} {
		src := mustAlloc(t, dir.from, size, transport.AccessLocal)
		copy(src.Bytes(), payload)
		recv := mustAlloc(t, dir.to, size, transport.AccessLocal)
		target := mustAlloc(t, dir.to, size, transport.AccessLocal|transport.AccessRemoteWrite)
		if err := dir.to.PostRecv(transport.RecvWR{ID: 7, Buf: transport.Whole(recv)}); err != nil {
			t.Fatal(err)
		}
		// The WRITE gathers two segments, so a chunk straddles them.
		half := sealChunk + 10
		err := dir.from.Post(
			transport.SendWR{ID: 1, Op: transport.OpWrite, RemoteAddr: target.Addr(), RKey: target.Handle(),
				SGL: []transport.Segment{{Region: src, Length: half}, {Region: src, Offset: half, Length: size - half}}},
			transport.SendWR{ID: 2, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}})
		if err != nil {
			t.Fatal(err)
		}
		if wc := waitOne(t, dir.to, 5*time.Second); wc.Status != transport.StatusSuccess || wc.Len != size {
			t.Fatalf("%s: receive %+v", dir.name, wc)
		}
		if !bytes.Equal(recv.Bytes(), payload) || !bytes.Equal(target.Bytes(), payload) {
			t.Fatalf("%s: payload garbled", dir.name)
		}
		for i := 0; i < 2; i++ {
			if wc := waitOne(t, dir.from, 5*time.Second); wc.Status != transport.StatusSuccess {
				t.Fatalf("%s: send %+v", dir.name, wc)
			}
		}
	}
}

// TestSealedWireHidesPayload: with the connection sealed, neither a SEND
// nor an RDMA WRITE shows its payload on the wire; without, both do.
func TestSealedWireHidesPayload(t *testing.T) {
	for _, sealed := range []bool{false, true} {
		cli, srv, p := proxiedPair(t)
		if sealed {
			sealPair(t, cli, srv, false)
		}
		exchange(t, cli, srv)
		c2s, s2c := p.wire()
		for name, b := range map[string][]byte{"c2s": c2s, "s2c": s2c} {
			if got := bytes.Contains(b, marker); got == sealed {
				t.Errorf("sealed=%v: marker on the wire %s: %v (%d bytes)", sealed, name, got, len(b))
			}
		}
	}
}

// TestSealedTamperEndsConnection flips one bit of a sealed payload, of a
// sealed header, or replays a sealed frame: the receiving end fails the
// connection (and reports no corrupt receive as a success), while a fresh
// connection to the same provider still works.
func TestSealedTamperEndsConnection(t *testing.T) {
	cases := map[string]func(off int, b []byte) []byte{
		"payload bit": flipAt(helloSize + sealedHdrSize + 40),
		"header bit":  flipAt(helloSize + 5),
		"tag bit":     flipAt(helloSize + sealedHdrSize - 1),
		"replay":      replayFirstFrame(),
	}
	for name, alter := range cases {
		t.Run(name, func(t *testing.T) {
			logger, hook := logtest.NewNullLogger()
			cli, srv, p := proxiedPair(t, logger)
			sealPair(t, cli, srv, false)
			p.mu.Lock()
			p.alter = alter
			p.mu.Unlock()
			recv := mustAlloc(t, srv, 4096, transport.AccessLocal)
			for i := 0; i < 2; i++ {
				if err := srv.PostRecv(transport.RecvWR{ID: uint64(i), Buf: transport.Whole(recv)}); err != nil {
					t.Fatal(err)
				}
			}
			src := mustAlloc(t, cli, 200, transport.AccessLocal)
			copy(src.Bytes(), marker)
			if err := cli.Post(transport.SendWR{ID: 1, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var wcs [4]transport.Completion
			for {
				n, err := srv.CQ().Wait(ctx, wcs[:])
				if errors.Is(err, transport.ErrClosed) {
					break // failed and drained: what we want
				}
				if err != nil {
					t.Fatalf("server connection did not fail: %v", err)
				}
				for _, wc := range wcs[:n] {
					if wc.Status == transport.StatusSuccess {
						if name == "replay" && wc.ID == 0 {
							continue // the original frame, before its replay
						}
						t.Fatalf("tampered frame delivered: %+v", wc)
					}
				}
			}
			warned := false
			for _, en := range hook.AllEntries() {
				warned = warned || (en.Level == logrus.WarnLevel && en.Data["why"] == whySealRefused)
			}
			if !warned {
				t.Errorf("no warning %q logged; log: %v", whySealRefused, hook.AllEntries())
			}
			// The provider still serves a new connection.
			cli2, srv2, _ := proxiedPair(t)
			sealPair(t, cli2, srv2, false)
			exchange(t, cli2, srv2)
		})
	}
}

func flipAt(pos int) func(off int, b []byte) []byte {
	return func(off int, b []byte) []byte {
		if pos >= off && pos < off+len(b) {
			b[pos-off] ^= 0x10
		}
		return b
	}
}

// replayFirstFrame sends the client's first sealed frame (a 200-byte SEND)
// twice.
func replayFirstFrame() func(off int, b []byte) []byte {
	var seen []byte
	start, done := -1, false
	n := sealedHdrSize + sealedLen(200)
	return func(off int, b []byte) []byte {
		if done {
			return b
		}
		if start < 0 {
			start = off
		}
		seen = append(seen, b...) // the stream from start
		if start+len(seen) < helloSize+n {
			return b
		}
		done = true
		f := seen[helloSize-start : helloSize-start+n]
		return append(append([]byte(nil), b...), f...)
	}
}

// TestSealedClearFrameRefused: once a connection is sealed, a SEND in clear
// from the peer ends it.
func TestSealedClearFrameRefused(t *testing.T) {
	sp := New(Options{RNRTimeout: testRNR})
	ln, err := sp.Listen("127.0.0.1:0", transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	nc, c := rawPeer(t, ln)
	if err := transport.Seal(c, transport.SealConfig{Send: testAEAD(t, 2), Recv: testAEAD(t, 1)}); err != nil {
		t.Fatal(err)
	}
	recv := mustAlloc(t, c, 4096, transport.AccessLocal)
	if err := c.PostRecv(transport.RecvWR{ID: 1, Buf: transport.Whole(recv)}); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write(frame(frameHeader{Type: frameSend}, marker)); err != nil {
		t.Fatal(err)
	}
	_ = readAll(t, nc) // the provider closes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wcs [2]transport.Completion
	n, err := c.CQ().Wait(ctx, wcs[:])
	if err == nil && (n == 0 || wcs[0].Status == transport.StatusSuccess) {
		t.Fatalf("clear SEND accepted on a sealed connection: %+v", wcs[:n])
	}
}

// TestSealedFrameLayout checks a sealed frame against the layout in
// docs/transport.md with an independent AES-GCM: type 0x80 in clear, the
// header's bytes 1–31 (real type in byte 3) sealed with nonce seq‖0 and
// byte 0 as associated data, then 64 KiB chunks each with nonce seq‖i+1.
func TestSealedFrameLayout(t *testing.T) {
	var s sealBuf
	s.seq = 6 // this frame is number 7
	r, err := newDomain().Alloc(sealChunk+5, transport.AccessLocal)
	if err != nil {
		t.Fatal(err)
	}
	for i := range r.Bytes() {
		r.Bytes()[i] = byte(i)
	}
	h := frameHeader{Type: frameWrite, Flags: flagImm, Ack: 0x01020304, Length: sealChunk + 5, Imm: 9, RKey: 0x55, Addr: 0x7f00}
	out := s.seal(testAEAD(t, 1), &h, []transport.Segment{transport.Whole(r)}, sealChunk+5)
	if len(out) != 48+sealChunk+16+5+16 || out[0] != 0x80 {
		t.Fatalf("sealed frame: %d bytes, type %#x", len(out), out[0])
	}
	a := testAEAD(t, 1)
	nonce := func(seq uint64, i uint32) []byte {
		n := make([]byte, 12)
		for k := 0; k < 8; k++ {
			n[k] = byte(seq >> (8 * k))
		}
		for k := 0; k < 4; k++ {
			n[8+k] = byte(i >> (8 * k))
		}
		return n
	}
	hdr, err := a.Open(nil, nonce(7, 0), out[1:48], out[:1])
	if err != nil {
		t.Fatalf("header does not open with nonce 7‖0: %v", err)
	}
	var want [32]byte
	h.encode(want[:])
	want[3], want[0] = want[0], 0
	if !bytes.Equal(hdr, want[1:]) {
		t.Errorf("header bytes 1–31 = %x, want %x", hdr, want[1:])
	}
	c1, err := a.Open(nil, nonce(7, 1), out[48:48+sealChunk+16], nil)
	if err != nil || !bytes.Equal(c1, r.Bytes()[:sealChunk]) {
		t.Errorf("chunk 1: %v", err)
	}
	c2, err := a.Open(nil, nonce(7, 2), out[48+sealChunk+16:], nil)
	if err != nil || !bytes.Equal(c2, r.Bytes()[sealChunk:]) {
		t.Errorf("chunk 2: %v", err)
	}
}
