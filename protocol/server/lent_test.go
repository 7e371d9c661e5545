package server

import (
	"bytes"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server/servertest"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// postLent sends req, whose data is at off in p.Data, as the mount does:
// one SEND (header, data) or, past a receive buffer, the fragmented
// write's messages, each SEND lent.
func (p *peer) postLent(req protocol.WriteRequest, off int) {
	p.T.Helper()
	per := protocol.FragmentData(DefaultMaxRecvBufferSize)
	n := len(req.Data)
	send := p.Send.Bytes()
	var wrs []transport.SendWR
	if n <= per {
		req.Header.Put(send)
		wrs = append(wrs, transport.SendWR{ID: 1, Op: transport.OpSend, Lend: true, SGL: []transport.Segment{
			{Region: p.Send, Length: protocol.HeaderSize}, {Region: p.Data, Offset: off, Length: n}}})
	} else {
		first := req.Fragment(per)
		first.Header.Put(send)
		for i, done := 0, 0; done < n; i++ {
			k := min(per, n-done)
			if i > 0 {
				h := protocol.NewFragmentHeader(&first.Header, req.Header.Offset+uint64(done), uint32(k), req.Header.Credits)
				h.Put(send[i*protocol.HeaderSize:])
			}
			wrs = append(wrs, transport.SendWR{ID: 1, Op: transport.OpSend, Lend: true, SGL: []transport.Segment{
				{Region: p.Send, Offset: i * protocol.HeaderSize, Length: protocol.HeaderSize}, {Region: p.Data, Offset: off + done, Length: k}}})
			done += k
		}
	}
	if err := p.Conn.Post(wrs...); err != nil {
		p.T.Fatal(err)
	}
}

// writesLent writes a 100 KiB WRITE and a 1 MiB fragmented one with lent
// data through prov; punch, when set, punches a page of the fragmented
// write's data out of the peer's memory after it is sent (the server's
// pin is refused; it writes the zeros a hole reads as). It checks the
// file and returns how many WRITEs the server wrote in place.
func writesLent(t *testing.T, prov transport.Provider, punch bool) uint64 {
	e := newEnv(t, Config{})
	key, signing := e.session(5)
	rk, f := e.file(5, "f", nil)
	p := &peer{servertest.DialPeer(t, prov, e.addr, servertest.PeerShape{Recvs: peerRecvs, RecvSize: peerRecvSize, SendSize: 64 << 10, DataSize: peerDataSize})}
	p.auth(key, signing, 16)
	fid := uint16(p.register(rk, 5, 0).Ios.Information)
	want := testutil.RandBytes(100<<10 + 1<<20)
	data := p.Data.Bytes()
	copy(data, want)

	p.postLent(protocol.NewWriteRequest(fid, 0, data[:100<<10], 1, protocol.InterruptMode(0, 5)), 0)
	if r := p.wantResponse("100 KiB WRITE"); r.Ios.Status != protocol.StatusSuccess || r.Ios.Information != 100<<10 {
		t.Fatalf("100 KiB WRITE: %+v", r)
	}
	if punch {
		// A page of the data goes (MADV_REMOVE: a hole in the memfd)
		// before the server has it: the pin is refused, the copy reads
		// zeros.
		pg := data[100<<10+512<<10 : 100<<10+516<<10]
		if err := unix.Madvise(pg, unix.MADV_REMOVE); err != nil {
			t.Fatal(err)
		}
		clear(want[100<<10+512<<10 : 100<<10+516<<10])
	}
	req := protocol.NewWriteRequest(fid, 100<<10, data[100<<10:100<<10+1<<20], 8, protocol.InterruptMode(0, 6))
	p.postLent(req, 100<<10)
	if r := p.wantResponse("1 MiB WRITE"); r.Ios.Status != protocol.StatusSuccess || r.Ios.Information != 1<<20 {
		t.Fatalf("1 MiB WRITE: %+v", r)
	}
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the file's bytes differ from those written")
	}
	return e.srv.Stats().WritesInPlace
}

// TestWriteLent: a client on this host that lends its WRITE data gets
// both WRITEs written straight from its memory, the fragmented one's
// eight messages with one pwrite, and the file right.
func TestWriteLent(t *testing.T) {
	if n := writesLent(t, soft.New(soft.Options{}), false); n != 2 {
		t.Fatalf("%d WRITEs written in place, want 2", n)
	}
}

// TestWriteLentFallback: a client sharing no memory lends nothing; a page
// of lent data gone before the server pins it has the write's data placed
// in the receive buffers (the hole reads as zeros) and written from there.
func TestWriteLentFallback(t *testing.T) {
	if n := writesLent(t, soft.New(soft.Options{NoSharedMemory: true}), false); n != 0 {
		t.Fatalf("%d WRITEs written in place without shared memory", n)
	}
	if n := writesLent(t, soft.New(soft.Options{}), true); n != 1 {
		t.Fatalf("%d WRITEs written in place, want the first (the punched one placed)", n)
	}
}

// fakeLender places 0xBB and counts its calls.
type fakeLender struct{ placed int }

func (f *fakeLender) PinLent(transport.Lent) ([]byte, bool) { return nil, false }
func (f *fakeLender) UnpinLent(transport.Lent)              {}
func (f *fakeLender) PlaceLent(l transport.Lent, dst []byte) error {
	f.placed++
	for i := range dst {
		dst[i] = 0xBB
	}
	return nil
}

// TestReceivedLentUnplaced: a lent message's unplaced bytes (the receive
// buffer holds 0xEE: another message's) are never its data: a lendable
// WRITE decodes with its full length and no Data until placed; anything
// else (a READ, an append) is placed first; a lent message on a
// connection that cannot read it fails.
func TestReceivedLentUnplaced(t *testing.T) {
	dom := soft.New(soft.Options{}).Domain()
	buf, err := dom.Alloc(4096, transport.AccessLocal)
	if err != nil {
		t.Fatal(err)
	}
	fl := &fakeLender{}
	c := &conn{lend: fl}
	rb := &recvBuf{seg: transport.Whole(buf)}
	for name, tc := range map[string]struct {
		h      protocol.Header
		placed bool
	}{
		"WRITE":  {protocol.NewWriteRequest(1, 0, make([]byte, 1000), 1, protocol.InterruptMode(0, 1)).Header, false},
		"append": {protocol.NewWriteRequest(1, protocol.WriteToEndOfFile, make([]byte, 1000), 1, protocol.InterruptMode(0, 1)).Header, true},
		"READ":   {protocol.NewReadRequest(1, 0, 1000, 0, 0, 1, protocol.InterruptMode(0, 1)), true},
	} {
		for i := range buf.Bytes() {
			buf.Bytes()[i] = 0xEE
		}
		fl.placed = 0
		tc.h.Put(buf.Bytes())
		wc := &transport.Completion{Len: protocol.HeaderSize, Lent: transport.Lent{Handle: 1, Addr: 2, Length: 1000}}
		msg, err := c.received(rb, wc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if (fl.placed == 1) != tc.placed || len(msg) != protocol.HeaderSize+1000 {
			t.Fatalf("%s: placed %d times, message of %d bytes", name, fl.placed, len(msg))
		}
		req, _ := protocol.DecodeRequest(msg)
		if d := rb.placed(req.Data); !tc.placed && len(d) != 0 || bytes.IndexByte(d, 0xEE) >= 0 {
			t.Fatalf("%s: Data of %d bytes with the buffer's old bytes", name, len(d))
		}
	}
	c.lend = nil
	if _, err := c.received(rb, &transport.Completion{Len: protocol.HeaderSize, Lent: transport.Lent{Length: 10}}); err == nil {
		t.Fatal("a lent message on a connection without a LentReader was taken")
	}
}
