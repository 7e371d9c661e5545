package soft

import (
	"bytes"
	"crypto/rand"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
)

// writeOne RDMA WRITEs 1 MiB from srv into a region of cli and checks it
// landed.
func writeOne(t *testing.T, srv, cli transport.Conn) {
	t.Helper()
	src := mustAlloc(t, srv, 1<<20, transport.AccessLocal)
	dst := mustAlloc(t, cli, 1<<20, transport.AccessLocal|transport.AccessRemoteWrite)
	_, _ = rand.Read(src.Bytes())
	writeAll(t, srv, src, dst)
}

// writeAll RDMA WRITEs all of src from srv into dst and checks it landed.
func writeAll(t *testing.T, srv transport.Conn, src, dst transport.Region) {
	t.Helper()
	if err := srv.Post(transport.SendWR{ID: 3, Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(src)},
		RemoteAddr: dst.Addr(), RKey: dst.Handle()}); err != nil {
		t.Fatal(err)
	}
	if c := waitOne(t, srv, 5*time.Second); c.Status != transport.StatusSuccess {
		t.Fatalf("write: %+v", c)
	}
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("written bytes differ")
	}
}

// shmPair is two providers on this host whose thresholds send every
// WRITE and every SEND segment through the shared memory.
func shmPair(t *testing.T, cp, sp *Provider) (cli, srv transport.Conn) {
	t.Helper()
	cp.shmMinCopy, cp.shmMinRef, sp.shmMinCopy, sp.shmMinRef = 1, 1, 1, 1
	cli, srv = pair(t, cp, sp, transport.Config{})
	if carrierOf(cli) != CarrierPipeShm || carrierOf(srv) != CarrierPipeShm {
		t.Fatalf("carriers %s/%s, want %s", carrierOf(cli), carrierOf(srv), CarrierPipeShm)
	}
	return cli, srv
}

// TestConformanceShm runs the suite with the listener's end as the
// initiator, so its WRITEs (every one, at any size) go by copy into the
// dialer's arena and the dialer's SENDs by reference: protection errors
// (a bad handle, bounds, a deregistered or local-only region) must still
// fail the connection, with the target untouched.
func TestConformanceShm(t *testing.T) {
	cp, sp := New(Options{RNRTimeout: testRNR}), New(Options{RNRTimeout: testRNR})
	cp.shmMinCopy, cp.shmMinRef, sp.shmMinCopy, sp.shmMinRef = 1, 1, 1, 1
	cp.shmLocalToo = true // the suite SENDs from local-only regions
	conformance.Run(t, conformance.Env{Client: cp, Server: sp, RNRTimeout: testRNR, Reverse: true,
		Connected: func(t *testing.T, cli, srv transport.Conn) {
			if carrierOf(cli) != CarrierPipeShm || carrierOf(srv) != CarrierPipeShm {
				t.Fatalf("carriers %s/%s, want %s", carrierOf(cli), carrierOf(srv), CarrierPipeShm)
			}
		}})
	if sp.shmCopies.Load() == 0 || sp.shmRefs.Load() == 0 {
		t.Fatalf("the listener copied %d WRITEs and %d SEND references: the suite did not run over shared memory",
			sp.shmCopies.Load(), sp.shmRefs.Load())
	}
}

// TestShmHostileArena: a dialer that passes a memfd it could shrink or
// grow (no seals, no F_SEAL_SHRINK), one of another size than it
// announces, or no memfd at all is refused: the listener maps nothing and
// the connection carries its data on the socket.
func TestShmHostileArena(t *testing.T) {
	memfd := func(t *testing.T, size int64, seals int) int {
		fd, err := unix.MemfdCreate("hostile", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Close(fd) })
		if err := unix.Ftruncate(fd, size); err != nil {
			t.Fatal(err)
		}
		if seals != 0 {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
				t.Fatal(err)
			}
		}
		return fd
	}
	const size = shmTableSize + 1<<20
	for _, tc := range []struct {
		name string
		hook func(t *testing.T, a *arena) (int, int64)
	}{
		{"unsealed", func(t *testing.T, _ *arena) (int, int64) { return memfd(t, size, 0), size }},
		{"larger than the default", func(t *testing.T, _ *arena) (int, int64) {
			return memfd(t, shmArenaSize+pageSize, shmSeals), shmArenaSize + pageSize
		}},
		{"shrinkable", func(t *testing.T, _ *arena) (int, int64) {
			return memfd(t, size, unix.F_SEAL_GROW|unix.F_SEAL_SEAL), size
		}},
		{"seals open", func(t *testing.T, _ *arena) (int, int64) {
			return memfd(t, size, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW), size
		}},
		{"announced larger", func(t *testing.T, a *arena) (int, int64) { return a.fd, a.size + pageSize }},
		{"announced smaller", func(t *testing.T, a *arena) (int, int64) { return a.fd, a.size - pageSize }},
		{"not a memfd", func(t *testing.T, _ *arena) (int, int64) {
			fds := make([]int, 2)
			if err := unix.Pipe2(fds, unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = unix.Close(fds[0]); _ = unix.Close(fds[1]) })
			return fds[0], size
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, sp := New(Options{ArenaSize: size}), New(Options{})
			cp.arenaHook = func(a *arena) (int, int64) { return tc.hook(t, a) }
			cli, srv := pair(t, cp, sp, transport.Config{})
			if carrierOf(cli) != CarrierPipe || carrierOf(srv) != CarrierPipe {
				t.Fatalf("carriers %s/%s, want %s", carrierOf(cli), carrierOf(srv), CarrierPipe)
			}
			if srv.(*conn).peer != nil {
				t.Fatal("the listener mapped the memfd")
			}
			sendOne(t, cli, srv)
			writeOne(t, srv, cli)
		})
	}
}

// TestShmNoShrink: the arena cannot be shrunk or grown once it is shared;
// the listener's copies go on after the attempt.
func TestShmNoShrink(t *testing.T) {
	cp, sp := New(Options{}), New(Options{})
	cli, srv := shmPair(t, cp, sp)
	a := cp.pd.arena.Load()
	if err := unix.Ftruncate(a.fd, shmTableSize); !errors.Is(err, unix.EPERM) {
		t.Fatalf("shrinking the arena: %v, want EPERM", err)
	}
	if err := unix.Ftruncate(a.fd, a.size+pageSize); !errors.Is(err, unix.EPERM) {
		t.Fatalf("growing the arena: %v, want EPERM", err)
	}
	if _, err := unix.FcntlInt(uintptr(a.fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); !errors.Is(err, unix.EPERM) {
		t.Fatalf("adding a seal: %v, want EPERM", err)
	}
	writeOne(t, srv, cli)
	sendOne(t, cli, srv)
	if sp.shmCopies.Load() == 0 {
		t.Fatal("no copy through the shared memory")
	}
}

// corruptSlot makes r's slot in the dialer's table say what a hostile
// dialer wants: its bytes at off, len bytes long.
func corruptSlot(a *arena, r transport.Region, off, ln uint64) {
	base := r.(*region).slot * shmSlotSize
	atomic.StoreUint64(word64(a.mem, base+16), off)
	atomic.StoreUint64(word64(a.mem, base+24), ln)
}

// TestShmTableOutOfBounds: a table entry that points outside the mapping
// (past its end, into the table, or longer than it) is not followed: the
// listener's WRITE goes on the socket (where the dialer's own check
// places it), and a SEND referencing the region is refused, the listener
// unharmed.
func TestShmTableOutOfBounds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		off, ln func(a *arena) uint64
	}{
		{"past the end", func(a *arena) uint64 { return uint64(a.size) }, func(*arena) uint64 { return 1 << 20 }},
		{"into the table", func(*arena) uint64 { return 0 }, func(*arena) uint64 { return 1 << 20 }},
		{"wrapping", func(*arena) uint64 { return shmTableSize }, func(*arena) uint64 { return ^uint64(0) - 100 }},
		{"longer than the mapping", func(*arena) uint64 { return shmTableSize }, func(a *arena) uint64 { return uint64(a.size) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, sp := New(Options{}), New(Options{})
			cli, srv := shmPair(t, cp, sp)
			a := cp.pd.arena.Load()
			src := mustAlloc(t, srv, 1<<20, transport.AccessLocal)
			dst := mustAlloc(t, cli, 1<<20, transport.AccessLocal|transport.AccessRemoteWrite)
			_, _ = rand.Read(src.Bytes())
			corruptSlot(a, dst, tc.off(a), tc.ln(a))
			table := bytes.Clone(a.mem[:shmTableSize])
			if err := srv.Post(transport.SendWR{ID: 1, Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(src)},
				RemoteAddr: dst.Addr(), RKey: dst.Handle()}); err != nil {
				t.Fatal(err)
			}
			if c := waitOne(t, srv, 5*time.Second); c.Status != transport.StatusSuccess {
				t.Fatalf("write: %+v", c)
			}
			if !bytes.Equal(src.Bytes(), dst.Bytes()) || !bytes.Equal(table, a.mem[:shmTableSize]) {
				t.Fatal("the write did not land where the dialer registered it")
			}
			if n := sp.shmCopies.Load(); n != 0 {
				t.Fatalf("%d copies followed the corrupt entry", n)
			}
			// The dialer SENDs from the corrupt region: refused.
			rbuf := mustAlloc(t, srv, 1<<20, transport.AccessLocal)
			if err := srv.PostRecv(transport.RecvWR{ID: 2, Buf: transport.Whole(rbuf)}); err != nil {
				t.Fatal(err)
			}
			if err := cli.Post(transport.SendWR{ID: 3, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(dst)}}); err != nil {
				t.Fatal(err)
			}
			if c := waitOne(t, cli, 5*time.Second); c.Status != transport.StatusRemoteInvalidRequest {
				t.Fatalf("SEND by a corrupt reference: %+v, want %v", c, transport.StatusRemoteInvalidRequest)
			}
		})
	}
}

// writeRegions allocates n bytes of fill on srv, the source of a WRITE, and
// n bytes of cli open to remote write, its target.
func writeRegions(t *testing.T, srv, cli transport.Conn, n int, fill byte) (src, dst transport.Region) {
	t.Helper()
	src = mustAlloc(t, srv, n, transport.AccessLocal)
	for i := range src.Bytes() {
		src.Bytes()[i] = fill
	}
	return src, mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
}

// holdFirstCopy makes sp's first copy into (or fill of) a peer's arena
// stop for 100 ms once it holds the slot; the channel closes when it does.
func holdFirstCopy(sp *Provider) <-chan struct{} {
	held := make(chan struct{})
	var once sync.Once
	sp.shmCopyHook = func() {
		once.Do(func() {
			close(held)
			time.Sleep(100 * time.Millisecond)
		})
	}
	return held
}

// TestShmDeregisterRacesCopy: a Deregister that comes while the listener
// is copying into the region waits for the copy, so the block, reused at
// once by the next Alloc, is never written by it. The hook holds the copy
// between taking the slot and copying.
func TestShmDeregisterRacesCopy(t *testing.T) {
	cp, sp := New(Options{}), New(Options{})
	inCopy := holdFirstCopy(sp)
	cli, srv := shmPair(t, cp, sp)
	const n = 64 << 10
	src, dst := writeRegions(t, srv, cli, n, 0xA5)
	posted := make(chan error, 1)
	go func() { // Post copies inline, and the hook holds it there
		posted <- srv.Post(transport.SendWR{ID: 1, Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(src)},
			RemoteAddr: dst.Addr(), RKey: dst.Handle()})
	}()
	<-inCopy
	if err := dst.Deregister(); err != nil {
		t.Fatal(err)
	}
	again := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
	if again.(*region).off != dst.(*region).off {
		t.Fatalf("the block was not reused (%d, %d): the test proves nothing", again.(*region).off, dst.(*region).off)
	}
	if err := <-posted; err != nil {
		t.Fatal(err)
	}
	waitOne(t, srv, 5*time.Second)
	if i := bytes.IndexByte(again.Bytes(), 0xA5); i >= 0 {
		t.Fatalf("a copy landed in the reused block at %d after Deregister returned", i)
	}
}

// TestShmDeregisterStress races Deregister against a stream of copies
// (run it with -race): every WRITE either lands before Deregister returns
// or is refused; none lands in the block once it is reused.
func TestShmDeregisterStress(t *testing.T) {
	rounds := 30
	if testing.Short() {
		rounds = 5
	}
	for range rounds {
		cp, sp := New(Options{}), New(Options{})
		cli, srv := shmPair(t, cp, sp)
		const n = 16 << 10
		src, dst := writeRegions(t, srv, cli, n, 0x5A)
		for i := range 32 {
			if err := srv.Post(transport.SendWR{ID: uint64(i), Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(src)},
				RemoteAddr: dst.Addr(), RKey: dst.Handle()}); err != nil {
				t.Fatal(err)
			}
		}
		if err := dst.Deregister(); err != nil {
			t.Fatal(err)
		}
		again := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
		for range 32 { // landed, refused or flushed
			waitOne(t, srv, 5*time.Second)
		}
		if i := bytes.IndexByte(again.Bytes(), 0x5A); i >= 0 {
			t.Fatalf("a copy landed in the reused block at %d", i)
		}
		_ = cli.Close()
		_ = srv.Close()
	}
}

// TestShmQuarantine: a slot whose copy never ends (a listener that hangs,
// or lies in the state word) makes Deregister give up after shmDrain and
// keep the block out of use for good.
func TestShmQuarantine(t *testing.T) {
	if testing.Short() {
		t.Skip("waits shmDrain")
	}
	cp := New(Options{})
	cli, _ := shmPair(t, cp, New(Options{}))
	r := mustAlloc(t, cli, 4096, transport.AccessLocal|transport.AccessRemoteWrite)
	a := cp.pd.arena.Load()
	atomic.AddUint32(stateWord(a.mem, r.(*region).slot), 1) // a copy in progress, forever
	if err := r.Deregister(); !errors.Is(err, errShmBusy) {
		t.Fatalf("Deregister: %v, want %v", err, errShmBusy)
	}
	again := mustAlloc(t, cli, 4096, transport.AccessLocal|transport.AccessRemoteWrite)
	if again.(*region).slot == 0 {
		t.Fatal("the new region is not in the arena: the test proves nothing")
	}
	if again.(*region).off == r.(*region).off || again.(*region).slot == r.(*region).slot {
		t.Fatal("the quarantined block or slot was reused")
	}
}

// TestShmWrongHandle: a handle whose slot number names another live
// region, but whose key is not that region's, is refused as on a NIC: the
// listener does not copy, the dialer refuses the WRITE on the socket, and
// neither region is touched.
func TestShmWrongHandle(t *testing.T) {
	cp, sp := New(Options{}), New(Options{})
	cli, srv := shmPair(t, cp, sp)
	a := mustAlloc(t, cli, 64<<10, transport.AccessLocal|transport.AccessRemoteWrite)
	b := mustAlloc(t, cli, 64<<10, transport.AccessLocal|transport.AccessRemoteWrite)
	src := mustAlloc(t, srv, 64<<10, transport.AccessLocal)
	for i := range src.Bytes() {
		src.Bytes()[i] = 0x77
	}
	rkey := a.Handle()&^(shmSlots-1) | b.Handle()&(shmSlots-1)
	if err := srv.Post(transport.SendWR{ID: 1, Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(src)},
		RemoteAddr: b.Addr(), RKey: rkey}); err != nil {
		t.Fatal(err)
	}
	if c := waitOne(t, srv, 5*time.Second); c.Status != transport.StatusRemoteAccess {
		t.Fatalf("write with a forged handle: %+v, want %v", c, transport.StatusRemoteAccess)
	}
	if bytes.IndexByte(a.Bytes(), 0x77) >= 0 || bytes.IndexByte(b.Bytes(), 0x77) >= 0 {
		t.Fatal("the forged write landed")
	}
	if n := sp.shmCopies.Load(); n != 0 {
		t.Fatalf("%d copies", n)
	}
}
