package server

import (
	"bytes"
	"crypto/rand"
	mrand "math/rand"
	"os"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server/servertest"
)

// FIG. 6A–C: the server writes its parameters to DataVa/DataMh, then
// completes AUTH with a STATUS_RESPONSE.
func TestAuth(t *testing.T) {
	e := newEnv(t, Config{Credits: 8})
	key, signing := e.session(5)
	p := e.dial()
	sp := p.auth(key, signing, 4)
	switch {
	case !sp.HasKey || sp.Key != key:
		t.Errorf("server Key %x, want %x", sp.Key, key)
	case !sp.HasSessionID || sp.SessionID != 5:
		t.Errorf("server SessionId %d, want 5", sp.SessionID)
	case !sp.Verify(signing):
		t.Error("server signature does not verify with the session key")
	case sp.BaseSequence != 8:
		t.Errorf("BaseSequence %d, want client's 7 + 1", sp.BaseSequence)
	case sp.Credits != 4:
		t.Errorf("Credits %d, want the 4 asked for", sp.Credits)
	case sp.HeaderSize != protocol.HeaderSize || sp.MaxRecvBufferSize != DefaultMaxRecvBufferSize || sp.MaxRdmaWindowSize != DefaultMaxRdmaWindowSize:
		t.Errorf("server limits %+v", sp)
	}
	if got := e.srv.budget.Used(); got != 4 {
		t.Errorf("budget used %d, want 4", got)
	}
}

func TestAuthViolations(t *testing.T) {
	// Only the timeout case has a short AuthTimeout: under load, dialling
	// and building an AUTH can take longer than 200 ms, and the others
	// must see their AUTH answered, not the connection timed out.
	setup := func(t *testing.T, authTimeout time.Duration) (*env, [16]byte, []byte) {
		e := newEnv(t, Config{AuthTimeout: authTimeout})
		key, signing := e.session(5)
		return e, key, signing
	}
	t.Run("opcode before AUTH", func(t *testing.T) {
		e, _, _ := setup(t, 0)
		p := e.dial()
		p.sendHeader(protocol.NewReadRequest(1, 0, 10, p.Data.Addr(), p.Data.Handle(), 1, protocol.InterruptMode(1, 1)))
		p.WantClosed("READ before AUTH")
	})
	t.Run("timeout", func(t *testing.T) {
		e, _, _ := setup(t, 200*time.Millisecond)
		p := e.dial()
		p.WantClosed("no AUTH within AuthTimeout")
	})
	t.Run("bad signature", func(t *testing.T) {
		e, key, _ := setup(t, 0)
		p := e.dial()
		ap := p.authParams(key, 4)
		ap.Sign([]byte("not the session key"))
		req := protocol.NewAuthRequest(ap, p.Data.Addr(), p.Data.Handle(), 9)
		p.sendMsg(req.Append(nil))
		if r := p.wantResponse("AUTH"); r.Ios.Status != protocol.StatusAccessDenied || r.Cookie != 9 {
			t.Fatalf("AUTH with a bad signature: %+v, want STATUS_ACCESS_DENIED", r)
		}
		p.WantClosed("after ACCESS_DENIED")
	})
	t.Run("wrong key", func(t *testing.T) {
		e, _, signing := setup(t, 0)
		p := e.dial()
		var other [16]byte
		rand.Read(other[:])
		if r := p.tryAuth(other, signing, 4, 9); r.Ios.Status != protocol.StatusAccessDenied {
			t.Fatalf("AUTH with an unknown Key: %+v, want STATUS_ACCESS_DENIED", r)
		}
		p.WantClosed("after ACCESS_DENIED")
	})
}

// FIG. 7A/B, 14A–D, 15A–D: register, then read and write in both modes.
func TestTranscriptIO(t *testing.T) {
	e := newEnv(t, Config{})
	key, signing := e.session(5)
	content := testutil.RandBytes(100 << 10)
	rk, f := e.file(5, "f", content)
	p := e.dial()
	p.auth(key, signing, 8)

	if r := p.register(rk, 6, 0); r.Ios.Status != protocol.StatusAccessDenied {
		t.Fatalf("REGISTER with another SessionId: %v", r.Ios.Status)
	}
	var bogus protocol.ResumeKey
	if r := p.register(bogus, 5, 0); r.Ios.Status != protocol.StatusInvalidHandle {
		t.Fatalf("REGISTER with an unknown resume key: %v", r.Ios.Status)
	}
	r := p.register(rk, 5, 0)
	if r.Ios.Status != protocol.StatusSuccess || r.Cookie != 77 || r.Ios.Information == 0 {
		t.Fatalf("REGISTER: %+v", r)
	}
	fid := uint16(r.Ios.Information)
	dst := p.Data.Bytes()

	// A full interrupt-mode read completes with the immediate cookie.
	p.sendHeader(protocol.NewReadRequest(fid, 1000, 8192, p.Data.Addr(), p.Data.Handle(), 1, protocol.InterruptMode(0xABCD, 5)))
	if imm := p.WantImm("READ"); imm != 0xABCD {
		t.Fatalf("immediate data %#x, want the ImmediateCookie 0xABCD", imm)
	}
	if !bytes.Equal(dst[:8192], content[1000:9192]) {
		t.Fatal("READ data differs")
	}
	// A short read completes with a STATUS_RESPONSE carrying the count.
	p.sendHeader(protocol.NewReadRequest(fid, uint64(len(content)-100), 4096, p.Data.Addr(), p.Data.Handle(), 1, protocol.InterruptMode(1, 6)))
	if r := p.wantResponse("short READ"); r.Cookie != 6 || r.Ios.Status != protocol.StatusSuccess || r.Ios.Information != 100 {
		t.Fatalf("short READ: %+v", r)
	}
	// Past the end: STATUS_END_OF_FILE.
	p.sendHeader(protocol.NewReadRequest(fid, uint64(len(content)+1), 4096, p.Data.Addr(), p.Data.Handle(), 1, protocol.InterruptMode(1, 7)))
	if r := p.wantResponse("READ past EOF"); r.Ios.Status != protocol.StatusEndOfFile {
		t.Fatalf("READ past EOF: %+v", r)
	}
	// Beyond MaxRdmaWindowSize: refused.
	p.sendHeader(protocol.NewReadRequest(fid, 0, DefaultMaxRdmaWindowSize+1, p.Data.Addr(), p.Data.Handle(), 1, protocol.InterruptMode(1, 8)))
	if r := p.wantResponse("READ beyond the window"); r.Ios.Status != protocol.StatusInvalidParameter {
		t.Fatalf("READ beyond the window: %+v", r)
	}
	// Polling mode: the status block lands at IosVa. An INTERRUPT after it
	// is answered once the read completes, so its arrival orders the test's
	// look at memory after the server's writes.
	iosOff := uint64(2 << 20)
	p.sendHeader(protocol.NewReadRequest(fid, 0, 4096, p.Data.Addr(), p.Data.Handle(), 1, protocol.PollingMode(p.Data.Addr()+iosOff, p.Data.Handle())))
	p.sendHeader(protocol.NewInterruptRequest(2, 99))
	if r := p.wantResponse("INTERRUPT"); r.Cookie != 99 || r.Ios.Status != protocol.StatusSuccess {
		t.Fatalf("INTERRUPT: %+v", r)
	}
	ios, _ := protocol.DecodeIOStatusBlock(dst[iosOff : iosOff+8])
	if ios.Status != protocol.StatusSuccess || ios.Information != 4096 || !bytes.Equal(dst[:4096], content[:4096]) {
		t.Fatalf("polling READ: status block %+v", ios)
	}

	// WRITE, interrupt mode.
	data := testutil.RandBytes(5000)
	w := protocol.NewWriteRequest(fid, 10, data, 1, protocol.InterruptMode(0, 11))
	p.sendMsg(w.Append(nil))
	if r := p.wantResponse("WRITE"); r.Cookie != 11 || r.Ios.Status != protocol.StatusSuccess || r.Ios.Information != 5000 {
		t.Fatalf("WRITE: %+v", r)
	}
	copy(content[10:], data)
	// WRITE, polling mode, then INTERRUPT to learn it is done.
	data = testutil.RandBytes(300)
	w = protocol.NewWriteRequest(fid, 20000, data, 1, protocol.PollingMode(p.Data.Addr()+iosOff, p.Data.Handle()))
	p.sendMsg(w.Append(nil))
	p.sendHeader(protocol.NewInterruptRequest(2, 100))
	p.wantResponse("INTERRUPT")
	ios, _ = protocol.DecodeIOStatusBlock(dst[iosOff : iosOff+8])
	if ios.Status != protocol.StatusSuccess || ios.Information != 300 {
		t.Fatalf("polling WRITE: status block %+v", ios)
	}
	copy(content[20000:], data)
	disk, _ := os.ReadFile(f.Name())
	if !bytes.Equal(disk, content) {
		t.Fatal("file differs from the writes")
	}

	// CLOSE: later requests on the Fid fail.
	p.sendHeader(protocol.NewCloseRequest(fid, 1, 13))
	if r := p.wantResponse("CLOSE"); r.Cookie != 13 || r.Ios.Status != protocol.StatusSuccess {
		t.Fatalf("CLOSE: %+v", r)
	}
	p.sendHeader(protocol.NewReadRequest(fid, 0, 10, p.Data.Addr(), p.Data.Handle(), 1, protocol.InterruptMode(1, 14)))
	if r := p.wantResponse("READ after CLOSE"); r.Ios.Status != protocol.StatusInvalidHandle {
		t.Fatalf("READ after CLOSE: %+v", r)
	}
	// CLOSE and CANCEL of a Fid no longer registered: INVALID_HANDLE, the
	// connection kept.
	p.sendHeader(protocol.NewCloseRequest(fid, 1, 15))
	if r := p.wantResponse("second CLOSE"); r.Cookie != 15 || r.Ios.Status != protocol.StatusInvalidHandle {
		t.Fatalf("second CLOSE: %+v, want STATUS_INVALID_HANDLE", r)
	}
	p.sendHeader(protocol.NewCancelRequest(fid, 1, 16))
	if r := p.wantResponse("CANCEL after CLOSE"); r.Cookie != 16 || r.Ios.Status != protocol.StatusInvalidHandle {
		t.Fatalf("CANCEL after CLOSE: %+v, want STATUS_INVALID_HANDLE", r)
	}
	// Length disagreeing with the data breaks a wire rule: the connection
	// ends, and nothing is written.
	w = protocol.NewWriteRequest(fid, 0, data, 1, protocol.InterruptMode(0, 12))
	w.Header.Length++
	p.sendMsg(w.Append(nil))
	p.WantClosed("WRITE with a bad Length")
	if disk, _ := os.ReadFile(f.Name()); !bytes.Equal(disk, content) {
		t.Fatal("a malformed WRITE changed the file")
	}
}

// FIG. 16A–D: one RDMA WRITE per region, the immediate data on the last.
func TestTranscriptVecRead(t *testing.T) {
	e := newEnv(t, Config{})
	key, signing := e.session(5)
	content := testutil.RandBytes(64 << 10)
	rk, _ := e.file(5, "f", content)
	p, fid := e.open(key, signing, 5, rk)
	// Four pages of 4 KiB scattered in reverse order, the last one 1 KiB.
	const ps = 4096
	length := 3*ps + 1024
	regions := make([]protocol.RDMARegion, 4)
	for i := range regions {
		regions[i] = protocol.RDMARegion{DataVa: p.Data.Addr() + uint64((3-i)*ps), DataMh: p.Data.Handle(), Length: ps}
	}
	regions[3].Length = 1024
	req := protocol.NewVecReadRequest(fid, 8192, uint32(length), ps, regions, 1, protocol.InterruptMode(0x1234, 3))
	p.sendMsg(req.Append(nil))
	if imm := p.WantImm("VEC_READ"); imm != 0x1234 {
		t.Fatalf("immediate %#x", imm)
	}
	dst := p.Data.Bytes()
	for i := 0; i < 4; i++ {
		n := ps
		if i == 3 {
			n = 1024
		}
		at := (3 - i) * ps
		if !bytes.Equal(dst[at:at+n], content[8192+i*ps:8192+i*ps+n]) {
			t.Fatalf("region %d holds the wrong page", i)
		}
	}
	// An intermediate region shorter than a page breaks FIG. 16A's rule:
	// the connection ends.
	regions[1].Length = 512
	req = protocol.NewVecReadRequest(fid, 0, uint32(length), ps, regions, 1, protocol.InterruptMode(1, 4))
	p.sendMsg(req.Append(nil))
	p.WantClosed("VEC_READ with a short middle region")
}

// FIG. 17A–C: VEC_WRITE, collapsed only on a file registered with
// FILE_NO_INTERMEDIATE_BUFFERING.
func TestTranscriptVecWrite(t *testing.T) {
	e := newEnv(t, Config{})
	key, signing := e.session(5)
	rk, f := e.file(5, "f", make([]byte, 64<<10))
	p := e.dial()
	p.auth(key, signing, 8)
	plain := uint16(p.register(rk, 5, 0).Ios.Information)
	direct := uint16(p.register(rk, 5, protocol.FileNoIntermediateBuffering).Ios.Information)
	page := testutil.RandBytes(4096)
	w := protocol.NewCollapsedVecWriteRequest(plain, 0, 3*4096+100, page, 1, protocol.InterruptMode(0, 1))
	p.sendMsg(w.Append(nil))
	if r := p.wantResponse("COLLAPSE without the flag"); r.Ios.Status != protocol.StatusInvalidParameter {
		t.Fatalf("COLLAPSE on a buffered file: %+v", r)
	}
	w = protocol.NewCollapsedVecWriteRequest(direct, 4096, 3*4096+100, page, 1, protocol.InterruptMode(0, 2))
	p.sendMsg(w.Append(nil))
	if r := p.wantResponse("COLLAPSE"); r.Ios.Status != protocol.StatusSuccess || r.Ios.Information != 3*4096+100 {
		t.Fatalf("COLLAPSE: %+v", r)
	}
	data := testutil.RandBytes(2 * 4096)
	w = protocol.NewVecWriteRequest(plain, 40000, data, 4096, 1, protocol.InterruptMode(0, 3))
	p.sendMsg(w.Append(nil))
	if r := p.wantResponse("VEC_WRITE"); r.Ios.Status != protocol.StatusSuccess || r.Ios.Information != 8192 {
		t.Fatalf("VEC_WRITE: %+v", r)
	}
	want := make([]byte, 64<<10)
	for i := 0; i < 3; i++ {
		copy(want[4096+i*4096:], page)
	}
	copy(want[4096+3*4096:], page[:100])
	copy(want[40000:], data)
	disk, _ := os.ReadFile(f.Name())
	if !bytes.Equal(disk, want) {
		t.Fatal("file differs")
	}
}

// A message longer than MaxRecvBufferSize ends the connection (FIG. 15).
func TestWriteAboveMaxRecvBufferSize(t *testing.T) {
	e := newEnv(t, Config{MaxRecvBufferSize: 8192})
	key, signing := e.session(5)
	rk, _ := e.file(5, "f", nil)
	p := e.dial()
	p.auth(key, signing, 4)
	fid := uint16(p.register(rk, 5, 0).Ios.Information)
	w := protocol.NewWriteRequest(fid, 0, testutil.RandBytes(8192), 1, protocol.InterruptMode(0, 1))
	p.sendMsg(w.Append(nil))
	p.WantClosed("write above MaxRecvBufferSize")
	testutil.Eventually(t, "no connection left", 5*time.Second, func() bool { return e.srv.NumConns() == 0 })
}

// A Fid is scoped to its session: another session's use is INVALID_HANDLE.
func TestFidOfAnotherSession(t *testing.T) {
	e := newEnv(t, Config{})
	keyA, sigA := e.session(1)
	keyB, sigB := e.session(2)
	rk, _ := e.file(1, "f", testutil.RandBytes(100))
	a := e.dial()
	a.auth(keyA, sigA, 4)
	fid := uint16(a.register(rk, 1, 0).Ios.Information)
	b := e.dial()
	b.auth(keyB, sigB, 4)
	b.sendHeader(protocol.NewReadRequest(fid, 0, 10, b.Data.Addr(), b.Data.Handle(), 1, protocol.InterruptMode(1, 1)))
	if r := b.wantResponse("READ with session A's Fid"); r.Ios.Status != protocol.StatusInvalidHandle {
		t.Fatalf("READ with another session's Fid: %+v", r)
	}
	// Session B cannot register A's resume key either.
	if r := b.register(rk, 2, 0); r.Ios.Status != protocol.StatusInvalidHandle {
		t.Fatalf("REGISTER of another session's resume key: %+v", r)
	}
}

// More requests outstanding than credits is a violation.
func TestBeyondCredits(t *testing.T) {
	e := newEnv(t, Config{})
	p, fid := heldReads(t, e)
	p.sendHeader(protocol.NewReadRequest(fid, 0, 10, p.Data.Addr(), p.Data.Handle(), 1, protocol.InterruptMode(1, 3)))
	p.WantClosed("third request on two credits")
}

// heldReads authenticates a connection of session 5 with two credits and
// has both used by READs of a file whose reads wait until the test ends.
func heldReads(t *testing.T, e *env) (*peer, uint16) {
	t.Helper()
	key, signing := e.session(5)
	f, err := os.CreateTemp(e.dir, "g")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	g := servertest.NewGatedFile(osFile{f})
	t.Cleanup(g.Open)
	rk := e.auth.AddFile(5, g)
	p := e.dial()
	p.auth(key, signing, 2)
	fid := uint16(p.register(rk, 5, 0).Ios.Information)
	for i := 0; i < 2; i++ {
		p.sendHeader(protocol.NewReadRequest(fid, 0, 10, p.Data.Addr(), p.Data.Handle(), 1, protocol.InterruptMode(1, uint64(i+1))))
	}
	<-g.Entered
	<-g.Entered
	return p, fid
}

// Malformed and hostile messages end only their own connection (or fail
// only their request); the server goes on serving everyone else.
func TestHostileMessages(t *testing.T) {
	e := newEnv(t, Config{Credits: 8})
	key, signing := e.session(5)
	content := testutil.RandBytes(64 << 10)
	rk, _ := e.file(5, "f", content)
	good := e.dial()
	good.auth(key, signing, 4)
	fid := uint16(good.register(rk, 5, 0).Ios.Information)
	// The hostile connections are another session (a Fid is the session's:
	// a CLOSE on the same session would rightly close the good one's file).
	hkey, hsigning := e.session(6)
	hrk, _ := e.file(6, "h", content)
	rng := mrand.New(mrand.NewSource(1))
	for i := 0; i < 60; i++ {
		p := e.dial()
		p.auth(e.auth.AnotherKey(hkey), hsigning, 8)
		p.register(hrk, 6, protocol.FileNoIntermediateBuffering)
		for j := 0; j < 4 && !p.Closed; j++ {
			h := protocol.Header{
				Length: uint32(rng.Intn(3 << 20)), Opcode: protocol.Opcode(rng.Intn(12)),
				Flags: uint8(rng.Intn(256)), Credits: uint8(rng.Intn(256)), Fid: uint16(rng.Intn(3)),
				Offset: rng.Uint64() >> uint(rng.Intn(64)), DataVa: rng.Uint64(), DataMh: rng.Uint32(),
				IosMh: rng.Uint32(), IosVa: rng.Uint64(),
			}
			msg := h.Append(nil)
			msg = append(msg, testutil.RandBytes(rng.Intn(200))...)
			if rng.Intn(4) == 0 {
				msg = msg[:rng.Intn(len(msg))]
			}
			if !p.trySend(msg) {
				break
			}
			// Whatever happens, it must not be a hang: a response, immediate
			// data, or the connection ending.
			if _, ok := p.next(); ok {
				continue
			}
		}
		p.Conn.Close()
	}
	// The well-behaved connection still works.
	good.sendHeader(protocol.NewReadRequest(fid, 0, 4096, good.Data.Addr(), good.Data.Handle(), 1, protocol.InterruptMode(7, 7)))
	if imm := good.WantImm("READ after the hostile ones"); imm != 7 || !bytes.Equal(good.Data.Bytes()[:4096], content[:4096]) {
		t.Fatal("the good connection was disturbed")
	}
	testutil.Eventually(t, "the good connection alone left", 5*time.Second, func() bool { return e.srv.NumConns() == 1 })
}
