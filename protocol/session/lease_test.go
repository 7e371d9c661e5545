package session

import (
	"context"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
)

// TestLeaseBodiesGolden: the lease and batch bodies, written from the
// layouts in docs/session.md by hand.
func TestLeaseBodiesGolden(t *testing.T) {
	for _, tc := range []struct {
		m    message
		want string
	}{
		// LEASE_BREAK: BreakID u64, Ino u64, Flags u32 (1: ack
		// required), Current u32, New u32, Names (u32 count, strings).
		{&leaseBreakMsg{BreakID: 0x0102, Ino: 5, Flags: 1, Current: 3, New: 1, Names: []string{"a"}},
			"0201000000000000" + "0500000000000000" + "01000000" + "03000000" + "01000000" + "01000000" + "0100" + "61"},
		// LEASE_ACK: BreakID u64, Ino u64, State u32.
		{&leaseAckReq{BreakID: 9, Ino: 5, State: 1}, "0900000000000000" + "0500000000000000" + "01000000"},
		// LEASE: Path, Want u32, Release (u32 count, u64 each).
		{&leaseReq{Path: "d", Want: 1, Release: []uint64{7}}, "0100" + "64" + "01000000" + "01000000" + "0700000000000000"},
		// OPEN with the lease field: Path, Flags, Mode, DurableID
		// [16], Want.
		{&openReq{Path: "f", Flags: 0x42, Mode: 0o644, DurableID: DurableID{0: 0xaa, 15: 0xbb}, leaseTail: leaseTail{true, 7}},
			"0100" + "66" + "42000000" + "a4010000" + "aa0000000000000000000000000000bb" + "07000000"},
		// Its answer: Handle, Attr, FileID (blob), Lease.
		{&openResp{Handle: 9, FileID: []byte{0xcc}, leaseTail: leaseTail{true, 3}},
			"0900000000000000" + hex.EncodeToString(marshal(&attrMsg{})) + "01000000" + "cc" + "03000000"},
		// READDIR with the lease fields: ..., Want u32, EntryWant u32.
		{&readDirReq{Path: "d", MaxBytes: 0x100, leaseTail: leaseTail{true, 1}, EntryWant: 3}, "0100" + "64" + "0000" + "00010000" + "01000000" + "03000000"},
		// BATCH: Count u32, per request Command u32 and Body (blob).
		{&batchReq{Ops: []batchOp{{Command: 11, Body: marshal(&handleMsg{Handle: 7})}}}, "01000000" + "0b000000" + "08000000" + "0700000000000000"},
		// BATCH response: Count u32, per request Status u32 and Body.
		{&batchResp{Results: []batchResult{{Status: 0xC0000008}}}, "01000000" + "080000c0" + "00000000"},
	} {
		if got := hex.EncodeToString(marshal(tc.m)); got != tc.want {
			t.Errorf("%T = %s, want %s", tc.m, got, tc.want)
		}
	}
	// An older client's OPEN (no lease field) still decodes.
	var r openReq
	if err := unmarshal(marshal(&openReq{Path: "f", Flags: 2, Mode: 1}), &r); err != nil || r.Leased {
		t.Errorf("OPEN without the lease field: %v, leased %v", err, r.Leased)
	}
}

// leaseEnv is a server whose share "data" grants leases, and n clients
// connected to it that record their breaks.
func leaseEnv(t *testing.T, n int) (*env, []*Tree, []chan LeaseBreak) {
	t.Helper()
	e := newEnv(t, func(c *ServerConfig) {
		c.Shares[0].LeaseBreakTimeout = 2 * time.Second
	})
	var trees []*Tree
	var breaks []chan LeaseBreak
	for range n {
		tr := e.tree("data")
		if !tr.Leases() {
			t.Skip("the share grants no leases on this kernel")
		}
		ch := make(chan LeaseBreak, 100)
		tr.OnLeaseBreak(func(b LeaseBreak) LeaseState { ch <- b; return b.New })
		trees = append(trees, tr)
		breaks = append(breaks, ch)
	}
	return e, trees, breaks
}

func nextBreak(t *testing.T, ch chan LeaseBreak) LeaseBreak {
	t.Helper()
	select {
	case b := <-ch:
		return b
	case <-time.After(5 * time.Second):
		t.Fatal("no lease break")
	}
	return LeaseBreak{}
}

// TestLeaseBreakOverSession: a lease taken by one client is broken, with
// its acknowledgement, when another opens the file for writing; the
// writer's OPEN returns only after the holder handled the break.
func TestLeaseBreakOverSession(t *testing.T) {
	e, trees, breaks := leaseEnv(t, 2)
	a, b := trees[0], trees[1]
	ctx := ctxT(t)
	os.WriteFile(filepath.Join(e.share, "f"), []byte("x"), 0o644)
	attr, got, err := a.Lease(ctx, "f", LeaseRead|LeaseHandle)
	if err != nil || got != LeaseRead|LeaseHandle || attr.Size != 1 {
		t.Fatalf("Lease = %v, %v, %+v", got, err, attr)
	}
	handled := make(chan struct{})
	a.OnLeaseBreak(func(br LeaseBreak) LeaseState {
		time.Sleep(100 * time.Millisecond) // a slow holder
		close(handled)
		breaks[0] <- br
		return br.New
	})
	h, _, _, err := b.OpenLease(ctx, "f", syscall.O_WRONLY, 0, LeaseRead)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-handled:
	default:
		t.Fatal("the write open returned before the holder handled its break")
	}
	br := nextBreak(t, breaks[0])
	if br.Ino != attr.Ino || br.New != 0 || !br.Ack {
		t.Errorf("break %+v", br)
	}
	b.CloseHandle(ctx, h)
	a.OnLeaseBreak(func(br LeaseBreak) LeaseState { breaks[0] <- br; return br.New })

	// Directories: names, no acknowledgement.
	os.Mkdir(filepath.Join(e.share, "d"), 0o755)
	ents, leases, dl, err := a.ReadDirLease(ctx, "d", LeaseRead, LeaseRead)
	if err != nil || dl != LeaseRead || len(ents) != 0 || len(leases) != 0 {
		t.Fatalf("ReadDirLease = %v %v %v %v", ents, leases, dl, err)
	}
	if _, _, err := b.MkdirLease(ctx, "d/sub", 0o755, LeaseRead); err != nil {
		t.Fatal(err)
	}
	br = nextBreak(t, breaks[0])
	if !slices.Equal(br.Names, []string{"sub"}) || br.New != LeaseRead || br.Ack {
		t.Errorf("directory break %+v", br)
	}
	if err := a.ReleaseLeases(ctx, []uint64{br.Ino}); err != nil {
		t.Fatal(err)
	}
	if err := b.Rmdir(ctx, "d/sub"); err != nil {
		t.Fatal(err)
	}
	select {
	case br := <-breaks[0]:
		t.Errorf("break after the lease was released: %+v", br)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestBatch: requests run in order and stop at the first failure.
func TestBatch(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("data")
	ctx := ctxT(t)
	h, _, err := tr.Open(ctx, "f", syscall.O_CREAT|syscall.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	mtime := time.Unix(1500000000, 0)
	res, err := tr.Batch(ctx, []BatchOp{
		{Command: CmdWrite, Handle: h, Data: []byte("hello")},
		{Command: CmdWrite, Handle: h, Offset: 5, Data: []byte(" world")},
		{Command: CmdSetAttr, Handle: h, SetAttr: SetAttrIn{Valid: SetMode | SetMtime, Mode: 0o600, Mtime: mtime}},
		{Command: CmdFsync, Handle: h},
	})
	if err != nil || len(res) != 4 {
		t.Fatalf("Batch = %v, %v", res, err)
	}
	if res[0].Count != 5 || res[1].Count != 6 || res[2].Attr.Size != 11 || res[2].Attr.Mode&0o777 != 0o600 || !res[2].Attr.Mtime.Equal(mtime) {
		t.Errorf("results %+v", res)
	}
	if b, _ := os.ReadFile(filepath.Join(e.share, "f")); string(b) != "hello world" {
		t.Errorf("file %q", b)
	}
	// A failure stops the batch: the write after it does not happen.
	res, err = tr.Batch(ctx, []BatchOp{
		{Command: CmdWrite, Handle: h, Data: []byte("H")},
		{Command: CmdWrite, Handle: 999, Data: []byte("x")},
		{Command: CmdWrite, Handle: h, Data: []byte("J")},
	})
	if err != nil || len(res) != 2 || res[1].Status != protocol.StatusInvalidHandle {
		t.Fatalf("Batch with a bad handle = %+v, %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.share, "f")); string(b) != "Hello world" {
		t.Errorf("file %q after the failed batch", b)
	}
	if err := tr.CloseHandle(ctx, h); err != nil {
		t.Fatal(err)
	}
	// CloseHandles closes the others past a handle that fails.
	h1, _, _ := tr.Open(ctx, "f", syscall.O_RDONLY, 0)
	h2, _, _ := tr.Open(ctx, "f", syscall.O_RDONLY, 0)
	if err := tr.CloseHandles(ctx, []Handle{h1, 999, h2}); err != protocol.StatusInvalidHandle {
		t.Errorf("CloseHandles with a bad handle = %v", err)
	}
	for _, h := range []Handle{h1, h2} {
		if err := tr.CloseHandle(ctx, h); err != protocol.StatusInvalidHandle {
			t.Errorf("handle %d still open after CloseHandles: %v", h, err)
		}
	}
	// What may not be in a batch is refused whole.
	req := &batchReq{Ops: []batchOp{{Command: uint32(CmdRead), Body: marshal(&readReq{Handle: h, Length: 1})}}}
	if err := tr.call(ctx, CmdBatch, req, &batchResp{}); err != protocol.StatusInvalidParameter {
		t.Errorf("READ in a batch: %v, want INVALID_PARAMETER", err)
	}
}

// TestBatchOpen: an OPEN at the end of a BATCH runs after the held-back
// changes before it and answers its handle, attributes, durable file id
// and lease; when a change before it fails the OPEN is not run (O_EXCL
// then creates nothing), and an OPEN that fails on its own (O_EXCL on an
// existing name) leaves the changes before it done.
func TestBatchOpen(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("data")
	ctx := ctxT(t)
	h, _, err := tr.Open(ctx, "a", syscall.O_CREAT|syscall.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	excl := syscall.O_CREAT | syscall.O_EXCL | syscall.O_WRONLY
	res, err := tr.Batch(ctx, []BatchOp{
		{Command: CmdWrite, Handle: h, Data: []byte("first")},
		{Command: CmdSetAttr, Handle: h, SetAttr: SetAttrIn{Valid: SetMode, Mode: 0o600}},
		{Command: CmdOpen, Path: "b", Flags: excl, Mode: 0o640, Durable: NewDurableID(), Lease: LeaseRead | LeaseWrite},
	})
	if err != nil || len(res) != 3 || res[2].Status != protocol.StatusSuccess {
		t.Fatalf("Batch = %+v, %v", res, err)
	}
	o := res[2]
	if o.Handle == 0 || o.Attr.Mode&0o777 != 0o640 || o.Attr.Size != 0 || len(o.FileID) == 0 || o.Lease&LeaseWrite == 0 {
		t.Errorf("OPEN's result %+v", o)
	}
	if b, _ := os.ReadFile(filepath.Join(e.share, "a")); string(b) != "first" {
		t.Errorf("a holds %q", b)
	}
	if n, err := tr.WriteAt(ctx, o.Handle, []byte("second"), 0); err != nil || n != 6 {
		t.Fatalf("write through the batch's OPEN: %d, %v", n, err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.share, "b")); string(b) != "second" {
		t.Errorf("b holds %q", b)
	}
	// A change that fails: the OPEN does not run.
	res, err = tr.Batch(ctx, []BatchOp{
		{Command: CmdWrite, Handle: 999, Data: []byte("x")},
		{Command: CmdOpen, Path: "c", Flags: excl, Mode: 0o640},
	})
	if err != nil || len(res) != 1 || res[0].Status != protocol.StatusInvalidHandle {
		t.Fatalf("Batch with a bad handle before the OPEN = %+v, %v", res, err)
	}
	if _, err := os.Stat(filepath.Join(e.share, "c")); !os.IsNotExist(err) {
		t.Errorf("the OPEN after a failed change ran: %v", err)
	}
	// O_EXCL on an existing name: the change before it is done, the OPEN fails.
	res, err = tr.Batch(ctx, []BatchOp{
		{Command: CmdWrite, Handle: h, Offset: 5, Data: []byte("!")},
		{Command: CmdOpen, Path: "b", Flags: excl, Mode: 0o640},
	})
	if err != nil || len(res) != 2 || res[0].Status != protocol.StatusSuccess || res[1].Status != protocol.StatusObjectNameCollision {
		t.Fatalf("Batch with O_EXCL on an existing name = %+v, %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.share, "a")); string(b) != "first!" {
		t.Errorf("a holds %q", b)
	}
}

// TestMalformedBatchDropsConnection: a request inside a batch that does
// not decode ends the connection, as it would on its own.
func TestMalformedBatchDropsConnection(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("data")
	bad := &batchReq{Ops: []batchOp{{Command: uint32(CmdClose), Body: []byte{1, 2, 3}}}}
	tr.call(ctxT(t), CmdBatch, bad, &batchResp{})
	waitDone(t, tr.Client())
	if !e.waitLogged("malformed request") {
		t.Error("no log line")
	}
}

// establishedPipe is a client whose session is set up by hand with key,
// over a pipe whose other end the test plays as the server; what the
// client writes is read and discarded.
func establishedPipe(t *testing.T, key []byte) (*Client, net.Conn) {
	c, srv, _ := pipeServer(t, key)
	return c, srv
}

func breakFrame(id uint64, key []byte, ino uint64) []byte {
	raw := AppendFrame(nil, Header{MessageID: id, Command: CmdLeaseBreak, Flags: FlagResponse, TreeID: 1},
		marshal(&leaseBreakMsg{BreakID: 3, Ino: ino, Current: 1}))
	signFrame(key, raw)
	return raw
}

// TestClientRefusesReplayedBreak: a LEASE_BREAK reaches its tree's
// handler; the same frame again (its sequence number not above the last)
// or one with a bad signature ends the connection.
func TestClientRefusesReplayedBreak(t *testing.T) {
	key := []byte("0123456789abcdef")
	for _, tc := range []struct {
		name   string
		second []byte
		want   error
	}{
		{"replay", breakFrame(5, key, 8), ErrReplay},
		{"forged", breakFrame(6, []byte("another key....."), 8), ErrBadSignature},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, srv := establishedPipe(t, key)
			got := make(chan LeaseBreak, 2)
			c.mu.Lock()
			c.breakTo = map[uint32]func(LeaseBreak) LeaseState{1: func(b LeaseBreak) LeaseState { got <- b; return 0 }}
			c.mu.Unlock()
			srv.Write(breakFrame(5, key, 8))
			if b := nextBreak(t, got); b.Ino != 8 || b.ID != 3 {
				t.Errorf("break %+v", b)
			}
			srv.Write(tc.second)
			waitDone(t, c)
			if !errors.Is(c.Err(), tc.want) {
				t.Errorf("Err = %v, want %v", c.Err(), tc.want)
			}
		})
	}
}

// TestLeaseBreakSealed: on a sealing session a LEASE_BREAK is sealed too —
// a directory's break carries the names created in it, which must not
// cross the wire in the clear — and reaches the tree's handler.
func TestLeaseBreakSealed(t *testing.T) {
	e := newEnv(t, withEncrypt(EncryptRequired))
	p := newWireProxy(t, e.addr)
	a, err := e.dialSeal(p.addr, SealAuto)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.dialSeal("", SealAuto)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	ta, err := a.TreeConnect(ctx, "data")
	if err != nil {
		t.Fatal(err)
	}
	tb, err := b.TreeConnect(ctx, "data")
	if err != nil {
		t.Fatal(err)
	}
	if !ta.Leases() {
		t.Skip("the share grants no leases on this kernel")
	}
	got := make(chan LeaseBreak, 4)
	ta.OnLeaseBreak(func(br LeaseBreak) LeaseState { got <- br; return br.New })
	os.Mkdir(filepath.Join(e.share, "d"), 0o755)
	if _, _, l, err := ta.ReadDirLease(ctx, "d", LeaseRead, 0); err != nil || l != LeaseRead {
		t.Fatalf("ReadDirLease: %v %v", l, err)
	}
	const marker = "MARKER-3c1e7b-leased-name"
	if _, err := tb.Mkdir(ctx, "d/"+marker, 0o755); err != nil {
		t.Fatal(err)
	}
	br := nextBreak(t, got)
	if !slices.Equal(br.Names, []string{marker}) {
		t.Fatalf("break %+v", br)
	}
	if _, s2c := p.seen([]byte(marker)); s2c {
		t.Error("the break's names crossed the wire in the clear")
	}
}

// TestAbandonedBatchOpenIsClosed: when the caller of a BATCH ending with
// an OPEN gives up before the answer (the mount's timeout), the handle
// the server opened anyway is closed, as for an OPEN alone; one whose
// OPEN did not run leaves nothing to close. Before the fix the handle
// stayed open until the session ended.
func TestAbandonedBatchOpenIsClosed(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("data")
	c := tr.c
	ctx := ctxT(t)
	h, _, err := tr.Open(ctx, "a", syscall.O_CREAT|syscall.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	e.srv.mu.Lock()
	ss := e.srv.sessions[c.SessionID()]
	e.srv.mu.Unlock()
	handles := func() int {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		return len(ss.handles)
	}
	excl := syscall.O_CREAT | syscall.O_EXCL | syscall.O_WRONLY
	for _, tc := range []struct {
		name string
		ops  []BatchOp
	}{
		{"ran", []BatchOp{{Command: CmdWrite, Handle: h, Data: []byte("x")}, {Command: CmdOpen, Path: "b", Flags: excl, Mode: 0o644}}},
		{"not run", []BatchOp{{Command: CmdWrite, Handle: 999, Data: []byte("x")}, {Command: CmdOpen, Path: "c", Flags: excl, Mode: 0o644}}},
	} {
		// The server cannot answer until the caller has given up.
		ss.mu.Lock()
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := tr.Batch(cctx, tc.ops)
			done <- err
		}()
		eventually(t, "the BATCH sent", func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return len(c.pending) > 0
		})
		cancel()
		err := <-done
		ss.mu.Unlock()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: Batch = %v, want the caller's cancellation", tc.name, err)
		}
		eventually(t, tc.name+": only a's handle left open", func() bool {
			c.mu.Lock()
			n := len(c.pending)
			c.mu.Unlock()
			return n == 0 && handles() == 1
		})
	}
	if _, err := os.Stat(filepath.Join(e.share, "b")); err != nil {
		t.Errorf("the abandoned BATCH's OPEN did not run: %v", err)
	}
}

// TestBatchHostileAnswer: a server's BATCH answer that stops short of the
// requests without a failure — the OPEN at its end then looks not run
// while the server may have run it — or whose OPEN result does not
// decode is refused as a whole (StatusInvalidNetworkResp), never applied
// in part.
func TestBatchHostileAnswer(t *testing.T) {
	key := []byte("0123456789abcdef")
	ok := func(m message) batchResult {
		return batchResult{Status: uint32(protocol.StatusSuccess), Body: marshal(m)}
	}
	for _, tc := range []struct {
		name    string
		results []batchResult
	}{
		{"short, no failure", []batchResult{ok(&writeResp{Count: 1})}},
		{"bogus OPEN body", []batchResult{ok(&writeResp{Count: 1}), {Status: uint32(protocol.StatusSuccess), Body: []byte{1}}}},
		{"one too many", []batchResult{ok(&writeResp{Count: 1}), ok(&openResp{Handle: 7}), ok(&empty{})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, srv, ids := pipeServer(t, key)
			tr := &Tree{c: c, id: 1}
			done := make(chan error, 1)
			go func() {
				_, err := tr.Batch(ctxT(t), []BatchOp{
					{Command: CmdWrite, Handle: 3, Data: []byte("x")},
					{Command: CmdOpen, Path: "b", Flags: syscall.O_CREAT | syscall.O_EXCL | syscall.O_WRONLY},
				})
				done <- err
			}()
			id := <-ids
			raw := AppendFrame(nil, Header{MessageID: id, Command: CmdBatch, Flags: FlagResponse, TreeID: 1},
				marshal(&batchResp{Results: tc.results}))
			signFrame(key, raw)
			if _, err := srv.Write(raw); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != protocol.StatusInvalidNetworkResp {
				t.Errorf("Batch = %v, want %v", err, protocol.StatusInvalidNetworkResp)
			}
		})
	}
}
