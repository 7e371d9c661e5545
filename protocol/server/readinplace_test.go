package server

import (
	"bytes"
	"os"
	"syscall"
	"testing"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
	"github.com/lwiofs/lwiofs/protocol/server/servertest"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// readsInPlace runs large READs on a peer dialled through prov: a full
// one in interrupt mode (the immediate data completes it), a short one
// at the end of the file (a STATUS_RESPONSE with the count), one past the
// end, and a small one; it checks the data and returns how many READs the
// server read in place.
func readsInPlace(t *testing.T, prov transport.Provider) uint64 {
	e := newEnv(t, Config{})
	key, signing := e.session(5)
	content := testutil.RandBytes(3<<20 + 5000)
	rk, _ := e.file(5, "f", content)
	p := &peer{servertest.DialPeer(t, prov, e.addr, servertest.PeerShape{Recvs: peerRecvs, RecvSize: peerRecvSize, SendSize: 64 << 10, DataSize: peerDataSize})}
	p.auth(key, signing, 8)
	fid := uint16(p.register(rk, 5, 0).Ios.Information)
	dst := p.Data.Bytes()

	p.sendHeader(protocol.NewReadRequest(fid, 4096, 1<<20, p.Data.Addr()+8192, p.Data.Handle(), 1, protocol.InterruptMode(0xBEEF, 5)))
	if imm := p.WantImm("1 MiB READ"); imm != 0xBEEF {
		t.Fatalf("immediate data %#x", imm)
	}
	if !bytes.Equal(dst[8192:8192+1<<20], content[4096:4096+1<<20]) {
		t.Fatal("1 MiB READ: data differs")
	}
	p.sendHeader(protocol.NewReadRequest(fid, 3<<20, 1<<20, p.Data.Addr(), p.Data.Handle(), 1, protocol.InterruptMode(1, 6)))
	if r := p.wantResponse("short READ"); r.Ios.Status != protocol.StatusSuccess || r.Ios.Information != 5000 {
		t.Fatalf("short READ: %+v", r)
	}
	if !bytes.Equal(dst[:5000], content[3<<20:]) {
		t.Fatal("short READ: data differs")
	}
	p.sendHeader(protocol.NewReadRequest(fid, 4<<20, 1<<20, p.Data.Addr(), p.Data.Handle(), 1, protocol.InterruptMode(1, 7)))
	if r := p.wantResponse("READ past EOF"); r.Ios.Status != protocol.StatusEndOfFile {
		t.Fatalf("READ past EOF: %+v", r)
	}
	p.sendHeader(protocol.NewReadRequest(fid, 100, 4096, p.Data.Addr(), p.Data.Handle(), 1, protocol.InterruptMode(0xAB, 8)))
	p.WantImm("4 KiB READ")
	if !bytes.Equal(dst[:4096], content[100:4196]) {
		t.Fatal("4 KiB READ: data differs")
	}
	return e.srv.Stats().ReadsInPlace
}

// TestReadInPlace: to a client on this host sharing its memory, a large
// READ is read straight into the client's buffer (the three large READs
// above; the 4 KiB one is below the transport's threshold and goes as
// before), with the same answers as through a buffer.
func TestReadInPlace(t *testing.T) {
	if n := readsInPlace(t, soft.New(soft.Options{})); n != 3 {
		t.Fatalf("%d READs read in place, want 3", n)
	}
}

// TestReadInPlaceFallback: a client that shares no memory (its provider
// refuses it) gets the same data through the server's buffer.
func TestReadInPlaceFallback(t *testing.T) {
	if n := readsInPlace(t, soft.New(soft.Options{NoSharedMemory: true})); n != 0 {
		t.Fatalf("%d READs read in place over a connection sharing no memory", n)
	}
}

// TestReadInPlaceBadTarget: a READ naming memory the client does not
// have open to remote write (a forged key, a range past its region) is
// not read in place; it goes as an ordinary RDMA WRITE, which the
// client's own provider refuses, and the connection ends as before.
func TestReadInPlaceBadTarget(t *testing.T) {
	for name, target := range map[string]func(p *peer) (uint64, uint32){
		"forged key":      func(p *peer) (uint64, uint32) { return p.Data.Addr(), p.Data.Handle() ^ 1<<20 },
		"past the region": func(p *peer) (uint64, uint32) { return p.Data.Addr() + peerDataSize - 4096, p.Data.Handle() },
		"the send area":   func(p *peer) (uint64, uint32) { return p.Send.Addr(), p.Send.Handle() },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, Config{})
			key, signing := e.session(5)
			rk, _ := e.file(5, "f", testutil.RandBytes(2<<20))
			p := e.dial()
			p.auth(key, signing, 8)
			fid := uint16(p.register(rk, 5, 0).Ios.Information)
			va, mh := target(p)
			p.sendHeader(protocol.NewReadRequest(fid, 0, 1<<20, va, mh, 1, protocol.InterruptMode(1, 5)))
			p.WantClosed("READ into memory the client did not open")
			if n := e.srv.Stats().ReadsInPlace; n != 0 {
				t.Fatalf("%d READs read in place", n)
			}
		})
	}
}

// failingFile reads at most k bytes of its file, then fails with EIO: a
// disk error part-way through a READ (k > 0) or at once (k 0).
type failingFile struct {
	osFile
	k int
}

func (f failingFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.osFile.ReadAt(p[:min(len(p), f.k)], off)
	if err == nil {
		err = syscall.EIO
	}
	return n, err
}

// TestReadInPlacePartial: a READ whose pread fails part-way answers the
// bytes it read and leaves the rest of the client's buffer as it was; one
// that fails at once answers the error: the same read in place as
// through the server's buffer.
func TestReadInPlacePartial(t *testing.T) {
	for name, opts := range map[string]soft.Options{"in place": {}, "through the buffer": {NoSharedMemory: true}} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, Config{})
			key, signing := e.session(5)
			content := testutil.RandBytes(1 << 20)
			_, f := e.file(5, "f", content)
			part := e.auth.AddFile(5, failingFile{osFile{f}, 20000})
			none := e.auth.AddFile(5, failingFile{osFile{f}, 0})
			p := &peer{servertest.DialPeer(t, soft.New(opts), e.addr, servertest.PeerShape{Recvs: peerRecvs, RecvSize: peerRecvSize, SendSize: 64 << 10, DataSize: peerDataSize})}
			p.auth(key, signing, 8)
			dst := p.Data.Bytes()[:1<<20]
			for i, rk := range []protocol.ResumeKey{part, none} {
				fid := uint16(p.register(rk, 5, 0).Ios.Information)
				for j := range dst {
					dst[j] = 0xEE
				}
				p.sendHeader(protocol.NewReadRequest(fid, 0, 1<<20, p.Data.Addr(), p.Data.Handle(), 1, protocol.InterruptMode(9, uint64(10+i))))
				r := p.wantResponse("READ failing part-way")
				want, got := 20000, int(r.Ios.Information)
				if i == 1 {
					want = 0
				}
				if wst := ntstatus.FromError(syscall.EIO); i == 1 && r.Ios.Status != wst || i == 0 && r.Ios.Status != protocol.StatusSuccess || got != want {
					t.Fatalf("READ %d: %v, %d bytes; want %d bytes", i, r.Ios.Status, got, want)
				}
				if !bytes.Equal(dst[:got], content[:got]) {
					t.Fatalf("READ %d: data differs", i)
				}
				if bytes.Count(dst[got:], []byte{0xEE}) != len(dst)-got {
					t.Fatalf("READ %d: the client's buffer changed past the %d bytes read", i, got)
				}
			}
			if n := e.srv.Stats().ReadsInPlace; (n == 2) != (opts == soft.Options{}) {
				t.Fatalf("%d READs read in place", n)
			}
		})
	}
}

// TestLargeReadInPlaceRunsInline: a lone 1 MiB READ on a connection that
// reads in place (shared memory) runs inline on the reaper, as small
// requests do: no hand-off to a request goroutine, one thread wake-up
// fewer per read. On a connection that does not (the data goes through
// the server's buffer), or behind another request in flight (a deep
// queue: the reaper must keep taking requests in), it still goes to a
// request goroutine.
func TestLargeReadInPlaceRunsInline(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   soft.Options
		behind bool
		inline bool
	}{
		{"shared memory", soft.Options{}, false, true},
		{"no shared memory", soft.Options{NoSharedMemory: true}, false, false},
		{"shared memory, another in flight", soft.Options{}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{})
			key, signing := e.session(5)
			content := testutil.RandBytes(1 << 20)
			f, err := os.CreateTemp(e.dir, "g")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			if _, err := f.Write(content); err != nil {
				t.Fatal(err)
			}
			g := servertest.NewGatedFile(osFile{f})
			t.Cleanup(g.Open)
			p := &peer{servertest.DialPeer(t, soft.New(tc.opts), e.addr, servertest.PeerShape{Recvs: peerRecvs, RecvSize: peerRecvSize, SendSize: 64 << 10, DataSize: peerDataSize})}
			p.auth(key, signing, 8)
			fid := uint16(p.register(e.auth.AddFile(5, g), 5, 0).Ios.Information)
			c := e.serverConn()
			if tc.behind {
				// A polling READ never runs inline: it holds a request
				// goroutine, gated, while the 1 MiB READ comes in.
				p.sendHeader(protocol.NewReadRequest(fid, 0, 4096, p.Data.Addr()+2<<20, p.Data.Handle(), 1, protocol.PollingMode(p.Data.Addr()+3<<20, p.Data.Handle())))
				<-g.Entered
			}
			epoch := c.hand.Load() >> 1
			p.read(fid, 0, 1<<20, 1, 0x1234)
			<-g.Entered
			if inline := c.hand.Load()&1 != 0 || c.hand.Load()>>1 != epoch; inline != tc.inline {
				t.Errorf("the 1 MiB READ runs inline on the reaper: %v, want %v", inline, tc.inline)
			}
			g.Open()
			if imm := p.WantImm("1 MiB READ"); imm != 0x1234 {
				t.Fatalf("immediate data %#x", imm)
			}
			if !bytes.Equal(p.Data.Bytes()[:1<<20], content) {
				t.Fatal("1 MiB READ: data differs")
			}
		})
	}
}

// TestSealedConnNotInPlace: a connection that seals stops counting as one
// that reads in place, though its carrier keeps its "+shm" name: its READs
// go through the server's buffer and are encrypted, so a large one must
// not run inline on the reaper (onRecv).
func TestSealedConnNotInPlace(t *testing.T) {
	e := newEnv(t, Config{})
	key, signing := e.session(5)
	p := &peer{servertest.DialPeer(t, soft.New(soft.Options{}), e.addr, servertest.PeerShape{Recvs: peerRecvs, RecvSize: peerRecvSize, SendSize: 64 << 10, DataSize: peerDataSize})}
	p.auth(key, signing, 8)
	c := e.serverConn()
	if !c.inPlace.Load() {
		t.Fatalf("a same-host connection with shared memory (%q) does not read in place", transport.CarrierOf(c.tc))
	}
	if err := c.startSeal(dataSeal{cipher: smbauth.CipherAES128GCM}, make([]byte, 16), [16]byte{1}, [16]byte{2}); err != nil {
		t.Fatal(err)
	}
	if c.inPlace.Load() {
		t.Error("a sealed connection still counts as reading in place")
	}
}
