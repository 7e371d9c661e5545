package hostile

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/server/servertest"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/test/hostile/rig"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// Limits of the hostile tests' server: the engine's shape with smaller
// buffers, so that many connections stay cheap.
const (
	testMaxRecv   = 128<<10 + 4096
	testWindow    = 128 << 10
	testCredits   = 16
	testAuthLimit = 5 * time.Second
)

func newServer(t *testing.T, o rig.Options) *rig.Server {
	t.Helper()
	if o.Engine.AuthTimeout == 0 {
		o.Engine.AuthTimeout = testAuthLimit
	}
	if o.Engine.MaxRecvBufferSize == 0 {
		o.Engine.MaxRecvBufferSize = testMaxRecv
	}
	if o.Engine.MaxRdmaWindowSize == 0 {
		o.Engine.MaxRdmaWindowSize = testWindow
	}
	if o.Engine.Credits == 0 {
		o.Engine.Credits = testCredits
	}
	if o.Session.SetupTimeout == 0 {
		o.Session.SetupTimeout = 5 * time.Second
	}
	s := rig.Start(t, o)
	s.Check(t)
	return s
}

func ctx10(t testing.TB) context.Context { return testutil.Context(t, 10*time.Second) }

// victim is a legitimate client with one registered file, whose Fid a
// hostile peer aims at.
type victim struct {
	ls      *lwioSession
	cl      *client.Client
	f       *client.File
	key     protocol.ResumeKey
	path    string
	content []byte
}

func newVictim(t *testing.T, s *rig.Server, name string) *victim {
	t.Helper()
	v := &victim{ls: newLWIOSession(t, s), path: filepath.Join(s.Dir, name), content: make([]byte, 8192)}
	rand.Read(v.content)
	v.key = v.ls.file(t, name, v.content)
	ctx := ctx10(t)
	cl, err := client.New(ctx, v.ls.ClientConfig(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	v.cl = cl
	if v.f, err = cl.Register(ctx, v.key, 0); err != nil {
		t.Fatal(err)
	}
	return v
}

// intact checks the victim's file on disk and through its own Fid.
func (v *victim) intact(t *testing.T) {
	t.Helper()
	disk, err := os.ReadFile(v.path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(disk, v.content) {
		t.Fatalf("victim's file changed on disk (%d bytes, want %d)", len(disk), len(v.content))
	}
	got := make([]byte, len(v.content))
	if n, err := v.f.ReadAt(ctx10(t), got, 0); err != nil || n != len(got) || !bytes.Equal(got, v.content) {
		t.Fatalf("victim's own Fid no longer reads its file: %d, %v", n, err)
	}
}

// TestOpcodesBeforeAuth sends every LWIO opcode (and unknown ones) as a
// connection's first message, aimed at a Fid another session holds: the
// connection must end at once, with no answer and nothing executed.
func TestOpcodesBeforeAuth(t *testing.T) {
	s := newServer(t, rig.Options{})
	v := newVictim(t, s, "victim")
	fid := v.f.Fid()
	evil := bytes.Repeat([]byte("EVIL"), 1024)
	cases := []struct {
		name string
		msg  func(p *peer) []byte
	}{
		{"READ", func(p *peer) []byte {
			h := protocol.NewReadRequest(fid, 0, 4096, p.Data.Addr(), p.Data.Handle(), 0, protocol.InterruptMode(1, 9))
			return h.Append(nil)
		}},
		{"READ polling", func(p *peer) []byte {
			h := protocol.NewReadRequest(fid, 0, 4096, p.Data.Addr(), p.Data.Handle(), 0, protocol.PollingMode(p.Data.Addr()+8192, p.Data.Handle()))
			return h.Append(nil)
		}},
		{"WRITE", func(p *peer) []byte {
			r := protocol.NewWriteRequest(fid, 0, evil, 0, protocol.InterruptMode(0, 9))
			return r.Append(nil)
		}},
		{"VEC_READ", func(p *peer) []byte {
			regs := []protocol.RDMARegion{{DataVa: p.Data.Addr(), DataMh: p.Data.Handle(), Length: 4096}, {DataVa: p.Data.Addr() + 4096, DataMh: p.Data.Handle(), Length: 4096}}
			r := protocol.NewVecReadRequest(fid, 0, 8192, 4096, regs, 0, protocol.InterruptMode(1, 9))
			return r.Append(nil)
		}},
		{"VEC_WRITE", func(p *peer) []byte {
			r := protocol.NewVecWriteRequest(fid, 0, evil, 4096, 0, protocol.InterruptMode(0, 9))
			return r.Append(nil)
		}},
		{"CLOSE", func(p *peer) []byte { h := protocol.NewCloseRequest(fid, 0, 9); return h.Append(nil) }},
		{"CANCEL", func(p *peer) []byte { h := protocol.NewCancelRequest(fid, 0, 9); return h.Append(nil) }},
		{"REGISTER (the victim's own resume key and session)", func(p *peer) []byte {
			r := protocol.NewRegisterRequest(protocol.FidParams{ResumeKey: v.key, SessionID: v.ls.id}, 0, 9)
			return r.Append(nil)
		}},
		{"CREDIT", func(p *peer) []byte { h := protocol.NewCreditRequest(5, 0, 9); return h.Append(nil) }},
		{"INTERRUPT", func(p *peer) []byte { h := protocol.NewInterruptRequest(0, 9); return h.Append(nil) }},
	}
	for _, op := range []protocol.Opcode{10, 0x3f, 0xff} {
		cases = append(cases, struct {
			name string
			msg  func(p *peer) []byte
		}{fmt.Sprintf("opcode %#x", uint8(op)), func(p *peer) []byte {
			h := protocol.Header{Length: protocol.HeaderSize, Opcode: op, Flags: protocol.FlagInterrupt, Fid: fid}
			return h.Append(nil)
		}})
	}
	var worst time.Duration
	for _, c := range cases {
		p := dialPeer(t, s)
		if err := p.sendMsg(c.msg(p)); err != nil {
			t.Fatal(err)
		}
		d := p.WantClosed(c.name + " before AUTH")
		// Dropped at the message, not at the AUTH timeout.
		if d > testAuthLimit/2 {
			t.Errorf("%s before AUTH: connection ended after %v (AUTH timeout %v)", c.name, d, testAuthLimit)
		}
		worst = max(worst, d)
		if !p.untouched(0, 16384) {
			t.Errorf("%s before AUTH: the server wrote into the peer's memory", c.name)
		}
		v.intact(t)
		if n := s.WaitConns(1, 5*time.Second); n > 1 {
			t.Fatalf("%s before AUTH: %d server connections remain, want the victim's 1", c.name, n)
		}
		s.Check(t)
	}
	figures.Add(t, "%d opcodes sent before AUTH: %d connections dropped without an answer, slowest drop %v; victim's file intact, legitimate client served after each",
		len(cases), len(cases), worst.Round(time.Microsecond))
}

// TestAuthRefused presents AUTHs that must not authenticate: each gets
// STATUS_ACCESS_DENIED, the server writes nothing to the peer, and the
// connection ends.
func TestAuthRefused(t *testing.T) {
	s := newServer(t, rig.Options{})
	a := newLWIOSession(t, s)
	b := newLWIOSession(t, s)
	// A session that ended: its negotiate key must die with it.
	gone := newLWIOSession(t, s)
	gone.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, ok := s.Sess.SessionByKey(gone.key); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("negotiate key still valid 5 s after its session ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	var randomKey [16]byte
	rand.Read(randomKey[:])
	randomSigning := make([]byte, 16)
	rand.Read(randomSigning)

	signed := func(key [16]byte, signing []byte) protocol.AuthParams {
		ap := authParams(key, 4)
		ap.Sign(signing)
		return ap
	}
	cases := []struct {
		name   string
		params func() protocol.AuthParams
	}{
		{"unknown Key", func() protocol.AuthParams { return signed(randomKey, a.signing) }},
		{"wrong signature (random signing key)", func() protocol.AuthParams { return signed(a.key, randomSigning) }},
		{"signature of another session's key", func() protocol.AuthParams { return signed(a.key, b.signing) }},
		{"signature replayed from another session's AUTH", func() protocol.AuthParams {
			ap := authParams(b.key, 4)
			ap.HasSignature, ap.Signature = true, signed(a.key, a.signing).Signature
			return ap
		}},
		{"signature with one bit flipped", func() protocol.AuthParams {
			ap := signed(a.key, a.signing)
			ap.Signature[7] ^= 0x10
			return ap
		}},
		{"no signature", func() protocol.AuthParams { return authParams(a.key, 4) }},
		{"no Key", func() protocol.AuthParams {
			ap := signed(a.key, a.signing)
			ap.HasKey = false
			return ap
		}},
		{"SessionId of another session", func() protocol.AuthParams {
			ap := authParams(a.key, 4)
			ap.HasSessionID, ap.SessionID = true, b.id
			ap.Sign(a.signing)
			return ap
		}},
		{"HeaderSize 64", func() protocol.AuthParams {
			ap := authParams(a.key, 4)
			ap.HeaderSize = 64
			ap.Sign(a.signing)
			return ap
		}},
		{"Key of an ended session", func() protocol.AuthParams { return signed(gone.key, gone.signing) }},
	}
	for _, c := range cases {
		p := dialPeer(t, s)
		if err := p.sendMsg(p.authMsg(c.params(), 5)); err != nil {
			t.Fatal(err)
		}
		r, ok := p.response()
		if !ok {
			t.Fatalf("%s: connection ended without STATUS_ACCESS_DENIED", c.name)
		}
		if r.Ios.Status != protocol.StatusAccessDenied || r.Cookie != 5 {
			t.Fatalf("%s: AUTH answered %+v, want STATUS_ACCESS_DENIED", c.name, r)
		}
		p.WantClosed(c.name + ": after ACCESS_DENIED")
		if !p.untouched(0, 4096) {
			t.Errorf("%s: the server wrote its AUTH parameters although it refused", c.name)
		}
		s.Check(t)
	}
	// The legitimate AUTHs still work on the same keys.
	pa := dialPeer(t, s)
	pa.auth(a, 4)
	pb := dialPeer(t, s)
	pb.auth(b, 4)
	figures.Add(t, "%d forged AUTHs: %d answered STATUS_ACCESS_DENIED and disconnected, 0 authenticated; the genuine AUTHs of both sessions still succeed",
		len(cases), len(cases))
}

// TestFidGuessing has session B, which registered nothing, aim READ,
// WRITE, CLOSE and CANCEL at Fids session A holds and at a wide range of
// others: every one is STATUS_INVALID_HANDLE, nothing is read or written,
// and A's Fids keep working.
func TestFidGuessing(t *testing.T) {
	s := newServer(t, rig.Options{})
	var vs []*victim
	for i := 0; i < 3; i++ {
		vs = append(vs, newVictim(t, s, fmt.Sprintf("a%d", i)))
	}
	b := newLWIOSession(t, s)
	p := dialPeer(t, s)
	credits := p.auth(b, testCredits)

	// Fids to try with READ: all 65536 (about 5 s under -race); with
	// -short 0–4096, 4096 random ones and the top; the victims' too.
	var fids []uint16
	if !testing.Short() {
		for f := 0; f <= 0xFFFF; f++ {
			fids = append(fids, uint16(f))
		}
	} else {
		for f := 0; f <= 4096; f++ {
			fids = append(fids, uint16(f))
		}
		r := mrand.New(mrand.NewPCG(1, 2))
		for i := 0; i < 4096; i++ {
			fids = append(fids, uint16(4097+r.IntN(0xFFFF-4097)))
		}
		fids = append(fids, 0xFFFE, 0xFFFF)
	}
	for _, v := range vs {
		fids = append(fids, v.f.Fid())
	}
	start := time.Now()
	reads := guess(t, p, credits, fids, func(i int, fid uint16) []byte {
		h := protocol.NewReadRequest(fid, 0, 4096, p.Data.Addr(), p.Data.Handle(), 0, protocol.InterruptMode(uint32(i), uint64(i+1)))
		return h.Append(nil)
	})
	readTime := time.Since(start)
	if !p.untouched(0, 4096) {
		t.Error("a guessed-Fid READ wrote data into the peer's memory")
	}
	// The other operations on the low Fids (those the victims hold) and
	// the victims' own.
	var low []uint16
	for f := 0; f <= 64; f++ {
		low = append(low, uint16(f))
	}
	evil := bytes.Repeat([]byte{0xEE}, 4096)
	writes := guess(t, p, credits, low, func(i int, fid uint16) []byte {
		r := protocol.NewWriteRequest(fid, 0, evil, 0, protocol.InterruptMode(0, uint64(i+1)))
		return r.Append(nil)
	})
	cancels := guess(t, p, credits, low, func(i int, fid uint16) []byte {
		h := protocol.NewCancelRequest(fid, 0, uint64(i+1))
		return h.Append(nil)
	})
	closes := guess(t, p, credits, low, func(i int, fid uint16) []byte {
		h := protocol.NewCloseRequest(fid, 0, uint64(i+1))
		return h.Append(nil)
	})
	for _, v := range vs {
		v.intact(t)
	}
	// B's own registration gets B's own Fid space: its Fid reads B's file,
	// never A's.
	mine := make([]byte, 4096)
	rand.Read(mine)
	st, fid := p.register(b, b.file(t, "b0", mine))
	if st != protocol.StatusSuccess {
		t.Fatalf("B's REGISTER of its own file: %v", st)
	}
	if err := p.sendHeader(protocol.NewReadRequest(fid, 0, 4096, p.Data.Addr(), p.Data.Handle(), 0, protocol.InterruptMode(0xfeed, 1))); err != nil {
		t.Fatal(err)
	}
	p.WantImm("B's READ of its own Fid")
	if !bytes.Equal(p.Data.Bytes()[:4096], mine) {
		t.Errorf("B's Fid %d does not read B's file", fid)
	}
	s.Check(t)
	figures.Add(t, "session B guessed Fids: %d READs (%d distinct Fids, incl. session A's %d) in %v, %d WRITEs, %d CANCELs, %d CLOSEs — all STATUS_INVALID_HANDLE, 0 bytes read or written, A's Fids intact",
		reads, distinct(fids), len(vs), readTime.Round(time.Millisecond), writes, cancels, closes)
}

func distinct(f []uint16) int {
	m := map[uint16]bool{}
	for _, v := range f {
		m[v] = true
	}
	return len(m)
}

// guess sends one message per Fid, at most credits outstanding, and
// requires STATUS_INVALID_HANDLE for each. It returns the count.
func guess(t *testing.T, p *peer, credits int, fids []uint16, msg func(i int, fid uint16) []byte) int {
	t.Helper()
	window := min(credits, peerRecvs/2)
	sent, got := 0, 0
	for got < len(fids) {
		var batch [][]byte
		for sent < len(fids) && sent-got < window {
			batch = append(batch, msg(sent, fids[sent]))
			sent++
		}
		if len(batch) > 0 {
			if err := p.sendChain(batch); err != nil {
				t.Fatal(err)
			}
		}
		r, ok := p.response()
		if !ok {
			t.Fatalf("connection ended after %d of %d guesses", got, len(fids))
		}
		if r.Ios.Status != protocol.StatusInvalidHandle {
			i := int(r.Cookie) - 1
			t.Fatalf("guess %d (Fid %d) answered %v, want STATUS_INVALID_HANDLE", i, fids[max(i, 0)], r.Ios.Status)
		}
		got++
	}
	return got
}

// TestOversizeWrite sends a WRITE exactly as large as the receive buffers
// (served) and one byte larger (the connection ends, nothing written).
func TestOversizeWrite(t *testing.T) {
	s := newServer(t, rig.Options{})
	ls := newLWIOSession(t, s)
	p := dialPeer(t, s)
	p.auth(ls, 4)
	orig := make([]byte, 100)
	rk := ls.file(t, "big", orig)
	st, fid := p.register(ls, rk)
	if st != protocol.StatusSuccess {
		t.Fatal(st)
	}
	fits := bytes.Repeat([]byte{1}, testMaxRecv-protocol.HeaderSize)
	w := protocol.NewWriteRequest(fid, 0, fits, 0, protocol.InterruptMode(0, 1))
	if err := p.sendMsg(w.Append(nil)); err != nil {
		t.Fatal(err)
	}
	if r := p.wantResponse("WRITE of MaxRecvBufferSize"); r.Ios.Status != protocol.StatusSuccess || int(r.Ios.Information) != len(fits) {
		t.Fatalf("WRITE filling the receive buffer: %+v", r)
	}
	over := bytes.Repeat([]byte{2}, testMaxRecv-protocol.HeaderSize+1)
	w = protocol.NewWriteRequest(fid, 0, over, 0, protocol.InterruptMode(0, 2))
	if err := p.sendMsg(w.Append(nil)); err != nil {
		t.Fatal(err)
	}
	d := p.WantClosed("WRITE one byte over MaxRecvBufferSize")
	disk, err := os.ReadFile(filepath.Join(s.Dir, "big"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(disk, fits) {
		t.Errorf("file after the refused write: %d bytes, first %#x; want the %d-byte accepted write", len(disk), disk[0], len(fits))
	}
	// And a lot larger, on a fresh connection.
	p2 := dialPeer(t, s)
	p2.auth(ls, 4)
	st, fid = p2.register(ls, rk)
	if st != protocol.StatusSuccess {
		t.Fatal(st)
	}
	huge := bytes.Repeat([]byte{3}, 3<<20)
	w = protocol.NewWriteRequest(fid, 0, huge, 0, protocol.InterruptMode(0, 3))
	if err := p2.sendMsg(w.Append(nil)); err != nil {
		t.Fatal(err)
	}
	p2.WantClosed("3 MiB WRITE")
	if disk, _ := os.ReadFile(filepath.Join(s.Dir, "big")); !bytes.Equal(disk, fits) {
		t.Error("the 3 MiB write changed the file")
	}
	s.Check(t)
	figures.Add(t, "WRITE of %d bytes (MaxRecvBufferSize) served; %d and %d bytes: connection ended (after %v), 0 bytes written",
		testMaxRecv, testMaxRecv+1, len(huge)+protocol.HeaderSize, d.Round(time.Microsecond))
}

// gate holds reads and writes of wrapped files until it opens.
type gate struct {
	share.File
	open    chan struct{}
	entered chan struct{}
}

func (g *gate) ReadAt(p []byte, off int64) (int, error) {
	g.entered <- struct{}{}
	<-g.open
	return g.File.ReadAt(p, off)
}

func (g *gate) WriteAt(p []byte, off int64) (int, error) {
	g.entered <- struct{}{}
	<-g.open
	return g.File.WriteAt(p, off)
}

// TestBeyondCredits holds a connection's requests executing and sends one
// more than it was granted: the connection ends; the server goes on.
func TestBeyondCredits(t *testing.T) {
	s := newServer(t, rig.Options{})
	ls := newLWIOSession(t, s)
	open := make(chan struct{})
	entered := make(chan struct{}, 64)
	var once sync.Once
	release := func() { once.Do(func() { close(open) }) }
	t.Cleanup(release)
	s.WrapFiles(func(f share.File) share.File { return &gate{File: f, open: open, entered: entered} })
	rk := ls.file(t, "held", make([]byte, 4096))
	p := dialPeer(t, s)
	credits := p.auth(ls, 3)
	if credits != 3 {
		t.Fatalf("granted %d credits, asked 3", credits)
	}
	st, fid := p.register(ls, rk)
	s.WrapFiles(nil)
	if st != protocol.StatusSuccess {
		t.Fatal(st)
	}
	for i := 0; i < credits; i++ {
		if err := p.sendHeader(protocol.NewReadRequest(fid, 0, 10, p.Data.Addr(), p.Data.Handle(), 0, protocol.InterruptMode(1, uint64(i+1)))); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < credits; i++ {
		select {
		case <-entered:
		case <-time.After(5 * time.Second):
			t.Fatalf("only %d of %d requests executing", i, credits)
		}
	}
	if err := p.sendHeader(protocol.NewReadRequest(fid, 0, 10, p.Data.Addr(), p.Data.Handle(), 0, protocol.InterruptMode(1, 99))); err != nil {
		t.Fatal(err)
	}
	d := p.WantClosed("a request beyond the credits granted")
	release()
	if n := s.WaitConns(0, 5*time.Second); n != 0 {
		t.Errorf("%d server connections remain after the violation", n)
	}
	s.Check(t)
	figures.Add(t, "%d requests held on %d credits, request %d: connection ended after %v; legitimate client served",
		credits, credits, credits+1, d.Round(time.Microsecond))
}

// TestNoRemoteWritableServerMemory proves the asymmetric model: the
// server never registers memory a peer may write, and RDMA WRITEs aimed at
// the server's real regions (handles and addresses it does use) and at
// guessed ones fail with a remote access error.
func TestNoRemoteWritableServerMemory(t *testing.T) {
	s := newServer(t, rig.Options{})
	ls := newLWIOSession(t, s)
	// A live authenticated connection with a registered file and a read
	// done: receives, slots and a read buffer are all registered now.
	live := dialPeer(t, s)
	live.auth(ls, 4)
	st, fid := live.register(ls, ls.file(t, "f", bytes.Repeat([]byte{7}, 8192)))
	if st != protocol.StatusSuccess {
		t.Fatal(st)
	}
	if err := live.sendHeader(protocol.NewReadRequest(fid, 0, 8192, live.Data.Addr(), live.Data.Handle(), 0, protocol.InterruptMode(0xfeed, 1))); err != nil {
		t.Fatal(err)
	}
	live.WantImm("READ")
	regions := s.Regions.Snapshot()
	if len(regions) == 0 {
		t.Fatal("the rig saw no server registrations")
	}
	if n := s.Regions.RemoteWritable(); n != 0 {
		t.Fatalf("the server registered %d regions with AccessRemoteWrite", n)
	}
	var total int64
	receives := 0
	for _, r := range regions {
		total += int64(r.Len)
		// A receive is posted 4096−48 bytes into its region (so that
		// write data lands page-aligned).
		if r.Len == testMaxRecv+4096-protocol.HeaderSize {
			receives++
		}
	}
	// The log sees the engine's own registrations: the live connection's
	// receive buffers (one per credit) are among them.
	if receives < 4 {
		t.Fatalf("the rig saw %d receive-buffer registrations, want at least the 4 credits' worth", receives)
	}
	// Targets: the newest regions (the live connection's receive buffers,
	// slots, read buffer: the handles exist), then guesses.
	var targets []rig.RegionInfo
	for i := len(regions) - 1; i >= 0 && len(targets) < 6; i-- {
		targets = append(targets, regions[i])
	}
	r := mrand.New(mrand.NewPCG(3, 4))
	for i := 0; i < 3; i++ {
		targets = append(targets, rig.RegionInfo{Addr: regions[0].Addr + uint64(r.IntN(1<<20)), Handle: r.Uint32(), Len: 16})
	}
	targets = append(targets, rig.RegionInfo{Addr: 0, Handle: 0, Len: 16})
	refused := 0
	for i, tg := range targets {
		// A raw softrdma connection: an RDMA WRITE needs no LWIO AUTH,
		// only the NIC's handle check.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		tc, err := soft.New(soft.Options{}).Dial(ctx, s.SoftAddr, transport.Config{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		src := servertest.Alloc(t, tc.Domain(), 16, transport.AccessLocal)
		copy(src.Bytes(), "overwrite server")
		if err := tc.Post(transport.SendWR{ID: 1, Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(src)}, RemoteAddr: tg.Addr, RKey: tg.Handle}); err != nil {
			t.Fatal(err)
		}
		wc := waitSend(t, tc, 1)
		tc.Close()
		if wc.Status != transport.StatusRemoteAccess {
			t.Fatalf("RDMA WRITE to server region %d (addr %#x handle %#x, %d bytes, access %v): %v, want %v",
				i, tg.Addr, tg.Handle, tg.Len, tg.Access, wc.Status, transport.StatusRemoteAccess)
		}
		refused++
	}
	// The authenticated connection itself: its own write at the server's
	// memory is refused the same way, and ends it.
	src := servertest.Alloc(t, live.Conn.Domain(), 16, transport.AccessLocal)
	if err := live.Conn.Post(transport.SendWR{ID: 2, Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(src)}, RemoteAddr: targets[0].Addr, RKey: targets[0].Handle}); err != nil {
		t.Fatal(err)
	}
	if wc := waitSend(t, live.Conn, 2); wc.Status != transport.StatusRemoteAccess {
		t.Fatalf("authenticated RDMA WRITE at the server: %v", wc.Status)
	}
	refused++
	s.Check(t)
	if n := s.Regions.RemoteWritable(); n != 0 {
		t.Fatalf("the server registered %d regions with AccessRemoteWrite", n)
	}
	figures.Add(t, "server registered %d regions (%d bytes), %d with remote-write access; %d RDMA WRITEs at its real and guessed handles: %d remote access errors, 0 landed",
		s.Regions.Count(), total, s.Regions.RemoteWritable(), len(targets)+1, refused)
}

// waitSend returns the completion of send work request id, or the
// failure that ended the connection first.
func waitSend(t *testing.T, tc transport.Conn, id uint64) transport.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		var wcs [16]transport.Completion
		n, err := tc.CQ().Wait(ctx, wcs[:])
		if err != nil {
			t.Fatalf("no send completion: %v", err)
		}
		for _, wc := range wcs[:n] {
			if wc.Op != transport.OpRecv && (wc.ID == id || wc.Status != transport.StatusSuccess) {
				return wc
			}
		}
	}
}

// TestRandomLWIOMessages sends random bytes as LWIO messages: as the first
// message (the connection ends, or AUTH is refused and it ends), and after
// AUTH with an opcode no client may send (the connection ends).
func TestRandomLWIOMessages(t *testing.T) {
	s := newServer(t, rig.Options{})
	ls := newLWIOSession(t, s)
	closed, denied := 0, 0
	for seed := uint64(1); seed <= 3; seed++ {
		r := mrand.New(mrand.NewPCG(seed, 0xb5))
		for _, n := range []int{1, 47, 48, 49, 200, 1024, 1025, 4096, 65536} {
			p := dialPeer(t, s)
			msg := make([]byte, n)
			for i := range msg {
				msg[i] = byte(r.Uint32())
			}
			if err := p.sendMsg(msg); err != nil {
				t.Fatal(err)
			}
			if resp, ok := p.response(); ok {
				if resp.Ios.Status != protocol.StatusAccessDenied {
					t.Fatalf("random %d-byte first message (seed %d) answered %+v", n, seed, resp)
				}
				denied++
				p.WantClosed("after ACCESS_DENIED")
			}
			closed++
			if !p.untouched(0, 4096) {
				t.Errorf("random %d-byte first message: the server wrote to the peer", n)
			}
		}
		for _, n := range []int{48, 100, 4096} {
			p := dialPeer(t, s)
			p.auth(ls, 2)
			msg := make([]byte, n)
			for i := range msg {
				msg[i] = byte(r.Uint32())
			}
			msg[4] = byte(protocol.NumOpcodes + r.IntN(256-protocol.NumOpcodes))
			if err := p.sendMsg(msg); err != nil {
				t.Fatal(err)
			}
			p.WantClosed(fmt.Sprintf("random %d-byte message after AUTH", n))
			closed++
		}
		s.Check(t)
	}
	if n := s.WaitConns(0, 5*time.Second); n != 0 {
		t.Errorf("%d server connections remain", n)
	}
	figures.Add(t, "%d random LWIO messages: %d connections ended (%d of them after STATUS_ACCESS_DENIED), 0 authenticated", closed, closed, denied)
}

// TestBadTargets has an authenticated peer name memory it does not own as
// the destination of the server's RDMA WRITEs: READ data, a polling status
// block, one VEC_READ region. The NIC check refuses the write, the
// connection ends, nothing lands in the peer's real memory, and the
// server serves others.
func TestBadTargets(t *testing.T) {
	s := newServer(t, rig.Options{})
	ls := newLWIOSession(t, s)
	rk := ls.file(t, "t", bytes.Repeat([]byte{9}, 16384))
	r := mrand.New(mrand.NewPCG(5, 6))
	cases := []struct {
		name string
		msg  func(p *peer, fid uint16) []byte
	}{
		{"READ into a guessed handle", func(p *peer, fid uint16) []byte {
			h := protocol.NewReadRequest(fid, 0, 4096, p.Data.Addr(), r.Uint32()|1, 0, protocol.InterruptMode(1, 1))
			return h.Append(nil)
		}},
		{"READ past the end of the peer's region", func(p *peer, fid uint16) []byte {
			h := protocol.NewReadRequest(fid, 0, 8192, p.Data.Addr()+peerDataSize-4096, p.Data.Handle(), 0, protocol.InterruptMode(1, 1))
			return h.Append(nil)
		}},
		{"READ into the peer's local-only send buffer", func(p *peer, fid uint16) []byte {
			h := protocol.NewReadRequest(fid, 0, 4096, p.Send.Addr(), p.Send.Handle(), 0, protocol.InterruptMode(1, 1))
			return h.Append(nil)
		}},
		{"polling status block at a guessed handle", func(p *peer, fid uint16) []byte {
			h := protocol.NewReadRequest(fid, 0, 4096, p.Data.Addr(), p.Data.Handle(), 0, protocol.PollingMode(p.Data.Addr(), r.Uint32()|1))
			return h.Append(nil)
		}},
		{"VEC_READ with one region at a guessed handle", func(p *peer, fid uint16) []byte {
			regs := []protocol.RDMARegion{{DataVa: p.Data.Addr(), DataMh: p.Data.Handle(), Length: 4096}, {DataVa: p.Data.Addr() + 4096, DataMh: r.Uint32() | 1, Length: 4096}}
			v := protocol.NewVecReadRequest(fid, 0, 8192, 4096, regs, 0, protocol.InterruptMode(1, 1))
			return v.Append(nil)
		}},
	}
	for _, c := range cases {
		p := dialPeer(t, s)
		p.auth(ls, 4)
		st, fid := p.register(ls, rk)
		if st != protocol.StatusSuccess {
			t.Fatal(st)
		}
		if err := p.sendMsg(c.msg(p, fid)); err != nil {
			t.Fatal(err)
		}
		p.WantClosed(c.name)
		if c.name != "VEC_READ with one region at a guessed handle" && !p.untouched(peerDataSize-4096, 4096) {
			t.Errorf("%s: data landed in the peer's region", c.name)
		}
		if n := s.WaitConns(0, 5*time.Second); n != 0 {
			t.Fatalf("%s: %d server connections remain", c.name, n)
		}
		s.Check(t)
	}
	figures.Add(t, "%d requests aiming the server's RDMA WRITEs at memory the peer does not own: %d connections ended by the remote access check, legitimate client served after each", len(cases), len(cases))
}
