package soft

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// fillWith is a fill that writes b's bytes, counting its calls.
type fillWith struct {
	b     byte
	calls int
}

func (f *fillWith) fill(dst []byte) (int, error) {
	f.calls++
	for i := range dst {
		dst[i] = f.b
	}
	return len(dst), nil
}

// fillPost fills dst's n bytes in place from srv and posts the WRITE;
// ok false: srv refused the fill.
func fillPost(t *testing.T, srv transport.Conn, dst transport.Region, n int, f *fillWith, imm bool) bool {
	t.Helper()
	placed, ok, err := srv.(transport.RemoteFiller).FillRemote(dst.Handle(), dst.Addr(), n, f.fill)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		if f.calls != 0 {
			t.Fatal("a refused fill ran")
		}
		return false
	}
	if placed.Length != n {
		t.Fatalf("placed %d bytes, want %d", placed.Length, n)
	}
	if err := srv.Post(transport.SendWR{ID: 7, Op: transport.OpWrite, SGL: []transport.Segment{placed},
		RemoteAddr: dst.Addr(), RKey: dst.Handle(), Imm: 0x1234, HasImm: imm}); err != nil {
		t.Fatal(err)
	}
	if c := waitOne(t, srv, 5*time.Second); c.Status != transport.StatusSuccess {
		t.Fatalf("filled write: %+v", c)
	}
	return true
}

// fillAsync fills n bytes of dst from srv on a goroutine; the channel
// says whether the fill ran.
func fillAsync(srv transport.Conn, dst transport.Region, n int, f *fillWith) <-chan bool {
	done := make(chan bool, 1)
	go func() {
		_, ok, _ := srv.(transport.RemoteFiller).FillRemote(dst.Handle(), dst.Addr(), n, f.fill)
		done <- ok
	}()
	return done
}

// TestFillRemote: a listener fills a dialer's region in place and posts
// the WRITE as a notice; the dialer completes it (with immediate data, a
// receive) and its region holds the bytes. Nothing is copied.
func TestFillRemote(t *testing.T) {
	cp, sp := New(Options{}), New(Options{})
	cli, srv := pair(t, cp, sp, transport.Config{})
	if carrierOf(srv) != CarrierPipeShm {
		t.Fatalf("carrier %s, want %s", carrierOf(srv), CarrierPipeShm)
	}
	const n = 1 << 20
	dst := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
	rbuf := mustAlloc(t, cli, 64, transport.AccessLocal)
	if err := cli.PostRecv(transport.RecvWR{ID: 9, Buf: transport.Whole(rbuf)}); err != nil {
		t.Fatal(err)
	}
	f := &fillWith{b: 0x6B}
	if !fillPost(t, srv, dst, n, f, true) {
		t.Fatal("the fill was refused")
	}
	c := waitOne(t, cli, 5*time.Second)
	if c.Status != transport.StatusSuccess || !c.HasImm || c.Imm != 0x1234 {
		t.Fatalf("the dialer's receive: %+v", c)
	}
	if bytes.Count(dst.Bytes(), []byte{0x6B}) != n {
		t.Fatal("the filled bytes are not in the dialer's region")
	}
	if sp.shmFills.Load() != 1 || sp.shmCopies.Load() != 0 {
		t.Fatalf("%d fills, %d copies; want 1, 0", sp.shmFills.Load(), sp.shmCopies.Load())
	}
	// Without immediate data: placed, no receive.
	f = &fillWith{b: 0x6C}
	fillPost(t, srv, dst, n/2, f, false)
	writeOne(t, srv, cli) // a later WRITE by copy still lands, in order
	if bytes.Count(dst.Bytes()[:n/2], []byte{0x6C}) != n/2 {
		t.Fatal("the second fill did not land")
	}
}

// TestFillRemoteRefused: every target a copy would not be made into, and
// every connection that carries no WRITE by shared memory, refuses the
// fill without running it; the caller then posts its data as usual.
func TestFillRemoteRefused(t *testing.T) {
	const n = 64 << 10
	cases := []struct {
		name string
		opts Options
		run  func(t *testing.T, cp *Provider, cli, srv transport.Conn) (transport.Conn, uint32, uint64, int)
	}{
		{"forged handle", Options{}, func(t *testing.T, _ *Provider, cli, srv transport.Conn) (transport.Conn, uint32, uint64, int) {
			a := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
			b := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
			return srv, a.Handle()&^(shmSlots-1) | b.Handle()&(shmSlots-1), b.Addr(), n
		}},
		{"past the region's end", Options{}, func(t *testing.T, _ *Provider, cli, srv transport.Conn) (transport.Conn, uint32, uint64, int) {
			a := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
			return srv, a.Handle(), a.Addr() + 4096, n
		}},
		{"before the region", Options{}, func(t *testing.T, _ *Provider, cli, srv transport.Conn) (transport.Conn, uint32, uint64, int) {
			a := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
			return srv, a.Handle(), a.Addr() - 4096, n
		}},
		{"local-only region", Options{}, func(t *testing.T, cp *Provider, cli, srv transport.Conn) (transport.Conn, uint32, uint64, int) {
			cp.pd.arena.Load().localToo = true
			a := mustAlloc(t, cli, n, transport.AccessLocal)
			if a.(*region).slot == 0 {
				t.Fatal("the region is not in the arena: the case proves nothing")
			}
			return srv, a.Handle(), a.Addr(), n
		}},
		{"retired region", Options{}, func(t *testing.T, _ *Provider, cli, srv transport.Conn) (transport.Conn, uint32, uint64, int) {
			a := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
			if err := a.Deregister(); err != nil {
				t.Fatal(err)
			}
			return srv, a.Handle(), a.Addr(), n
		}},
		{"punched page", Options{}, func(t *testing.T, cp *Provider, cli, srv transport.Conn) (transport.Conn, uint32, uint64, int) {
			a := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
			punch(t, cp.pd.arena.Load(), a, n-pageSize, pageSize)
			return srv, a.Handle(), a.Addr(), n
		}},
		{"too small", Options{}, func(t *testing.T, _ *Provider, cli, srv transport.Conn) (transport.Conn, uint32, uint64, int) {
			a := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
			return srv, a.Handle(), a.Addr(), shmMinCopy - 1
		}},
		{"sealed", Options{}, func(t *testing.T, _ *Provider, cli, srv transport.Conn) (transport.Conn, uint32, uint64, int) {
			sealPair(t, cli, srv, false)
			a := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
			return srv, a.Handle(), a.Addr(), n
		}},
		{"the dialer's end", Options{}, func(t *testing.T, _ *Provider, cli, srv transport.Conn) (transport.Conn, uint32, uint64, int) {
			a := mustAlloc(t, srv, n, transport.AccessLocal|transport.AccessRemoteWrite)
			return cli, a.Handle(), a.Addr(), n
		}},
		{"no shared memory", Options{NoSharedMemory: true}, func(t *testing.T, _ *Provider, cli, srv transport.Conn) (transport.Conn, uint32, uint64, int) {
			a := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
			return srv, a.Handle(), a.Addr(), n
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cp, sp := New(Options{}), New(tc.opts)
			cli, srv := pair(t, cp, sp, transport.Config{})
			on, rkey, addr, ln := tc.run(t, cp, cli, srv)
			f := &fillWith{b: 1}
			_, ok, err := on.(transport.RemoteFiller).FillRemote(rkey, addr, ln, f.fill)
			if ok || err != nil || f.calls != 0 {
				t.Fatalf("FillRemote: ok %v, err %v, %d fills; want a refusal", ok, err, f.calls)
			}
		})
	}
}

// TestFillRemoteRetiredMidFill: the dialer's Deregister that comes while
// the listener fills waits for the fill, so the block, reused at once by
// the next Alloc, is never written by it; the WRITE's notice then arrives
// for a region that is gone, and changes nothing.
func TestFillRemoteRetiredMidFill(t *testing.T) {
	cp, sp := New(Options{}), New(Options{})
	inFill := holdFirstCopy(sp)
	cli, srv := pair(t, cp, sp, transport.Config{})
	const n = 64 << 10
	dst := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
	done := fillAsync(srv, dst, n, &fillWith{b: 0xA5})
	<-inFill
	if err := dst.Deregister(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Fatal("Deregister returned while the fill held the region")
	}
	again := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
	if again.(*region).off != dst.(*region).off {
		t.Fatalf("the block was not reused (%d, %d): the test proves nothing", again.(*region).off, dst.(*region).off)
	}
	if i := bytes.IndexByte(again.Bytes(), 0xA5); i >= 0 {
		t.Fatalf("the fill landed in the reused block at %d after Deregister returned", i)
	}
	// A fill after the Deregister is refused.
	f := &fillWith{b: 0xA6}
	if _, ok, _ := srv.(transport.RemoteFiller).FillRemote(dst.Handle(), dst.Addr(), n, f.fill); ok {
		t.Fatal("a fill of a retired region ran")
	}
}

// filledPair is a same-host pair whose listener filled 1 MiB of dst, a
// region of the dialer's, in place; placed is the fill's token.
func filledPair(t *testing.T) (cli, srv transport.Conn, dst transport.Region, placed transport.Segment) {
	t.Helper()
	cli, srv = pair(t, New(Options{}), New(Options{}), transport.Config{})
	dst = mustAlloc(t, cli, 1<<20, transport.AccessLocal|transport.AccessRemoteWrite)
	f := &fillWith{b: 2}
	placed, ok, _ := srv.(transport.RemoteFiller).FillRemote(dst.Handle(), dst.Addr(), 1<<20, f.fill)
	if !ok {
		t.Fatal("refused")
	}
	return cli, srv, dst, placed
}

// TestFillRemoteToken: the token a fill returns is accepted only alone,
// in a WRITE, on the connection that filled.
func TestFillRemoteToken(t *testing.T) {
	_, srv, dst, placed := filledPair(t)
	_, srv2 := pair(t, New(Options{}), New(Options{}), transport.Config{})
	other := mustAlloc(t, srv, 4096, transport.AccessLocal)
	for name, wr := range map[string]struct {
		c  transport.Conn
		wr transport.SendWR
	}{
		"another connection": {srv2, transport.SendWR{Op: transport.OpWrite, SGL: []transport.Segment{placed}, RemoteAddr: dst.Addr(), RKey: dst.Handle()}},
		"a SEND":             {srv, transport.SendWR{Op: transport.OpSend, SGL: []transport.Segment{placed}}},
		"with another segment": {srv, transport.SendWR{Op: transport.OpWrite, SGL: []transport.Segment{placed, transport.Whole(other)},
			RemoteAddr: dst.Addr(), RKey: dst.Handle()}},
	} {
		if err := wr.c.Post(wr.wr); err == nil {
			t.Errorf("%s: posted", name)
		}
	}
}

// TestFillRemoteThenSealed: a peer that turns sealing on between a fill
// and its WRITE's turn to go fails the connection (the bytes are in its
// memory; a sealed frame cannot say so): the WRITE does not complete
// successfully, and nothing goes in clear.
func TestFillRemoteThenSealed(t *testing.T) {
	cli, srv, dst, placed := filledPair(t)
	rbuf := mustAlloc(t, srv, 64, transport.AccessLocal)
	if err := srv.PostRecv(transport.RecvWR{ID: 1, Buf: transport.Whole(rbuf)}); err != nil {
		t.Fatal(err)
	}
	sealPair(t, cli, srv, false)
	msg := mustAlloc(t, cli, 16, transport.AccessLocal)
	if err := cli.Post(transport.SendWR{ID: 2, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(msg)}}); err != nil {
		t.Fatal(err)
	}
	if c := waitOne(t, srv, 5*time.Second); c.Op != transport.OpRecv || c.Status != transport.StatusSuccess {
		t.Fatalf("the sealed SEND: %+v", c)
	}
	if !srv.(*conn).sealOut.Load() {
		t.Fatal("the listener does not seal yet: the test proves nothing")
	}
	if err := srv.Post(transport.SendWR{ID: 3, Op: transport.OpWrite, SGL: []transport.Segment{placed},
		RemoteAddr: dst.Addr(), RKey: dst.Handle()}); err != nil {
		return // refused at once: as good
	}
	if c := waitOne(t, srv, 5*time.Second); c.ID != 3 || c.Status == transport.StatusSuccess {
		t.Fatalf("the filled WRITE on a sealed connection: %+v, want a failure", c)
	}
	sc := srv.(*conn)
	sc.mu.Lock()
	why := sc.fail1.err
	sc.mu.Unlock()
	if !errors.Is(why, errPlacedSealed) {
		t.Fatalf("the listener failed for %v, want %v (its WRITE's header went in clear)", why, errPlacedSealed)
	}
}

// TestFillRemoteHungFillClose: a fill that does not return (the pread of a
// hung export) holds its region, but neither the connection's end nor the
// fills after it: Close returns at once, a fill on the closed connection
// is refused without waiting for the hung one (it would hold a disk
// worker of the caller's), and the mapping goes once the hung fill
// returns. The hook holds the first fill with the slot taken.
func TestFillRemoteHungFillClose(t *testing.T) {
	cp, sp := New(Options{}), New(Options{})
	entered, release := make(chan struct{}), make(chan struct{})
	var once, unblock sync.Once
	sp.shmCopyHook = func() { once.Do(func() { close(entered); <-release }) }
	cli, srv := pair(t, cp, sp, transport.Config{})
	const n = 64 << 10
	a := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
	b := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
	open := func() { unblock.Do(func() { close(release) }) }
	t.Cleanup(open) // before the Deregisters, which wait for the fill
	hung := fillAsync(srv, a, n, &fillWith{b: 1})
	<-entered

	closed := make(chan struct{})
	go func() { _ = srv.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Second):
		t.Error("Close waits for a fill that does not return")
	}
	f2 := &fillWith{b: 2}
	later := fillAsync(srv, b, n, f2)
	select {
	case ok := <-later:
		if ok || f2.calls != 0 {
			t.Errorf("a fill on the closed connection ran (ok %v, %d calls)", ok, f2.calls)
		}
	case <-time.After(time.Second):
		t.Error("a fill on the closed connection waits for the hung one")
	}

	open()
	if !<-hung {
		t.Fatal("the hung fill was refused: the test proves nothing")
	}
	waitUnmapped(t, srv.(*conn).peer, "the hung fill returned")
}

// waitUnmapped waits up to 5s for pa's mapping to go, after what.
func waitUnmapped(t *testing.T, pa *peerArena, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		pa.mu.RLock()
		gone := pa.mem == nil
		pa.mu.RUnlock()
		if gone {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the mapping is still there after %s", what)
		}
	}
}
