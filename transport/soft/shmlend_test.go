package soft

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// lendOne sends from cli a lent SEND of a 64-byte header (local memory)
// and data (n bytes of an arena region, filled with b) into a receive
// buffer of srv's pre-filled with 0xEE, and returns srv's completion, the
// receive buffer and the data's region.
func lendOne(t *testing.T, cli, srv transport.Conn, n int, b byte, lend bool) (transport.Completion, []byte, transport.Region) {
	t.Helper()
	hdr := mustAlloc(t, cli, 64, transport.AccessLocal)
	data := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
	for i := range hdr.Bytes() {
		hdr.Bytes()[i] = 0x11
	}
	for i := range data.Bytes() {
		data.Bytes()[i] = b
	}
	rbuf := mustAlloc(t, srv, 64+n, transport.AccessLocal)
	for i := range rbuf.Bytes() {
		rbuf.Bytes()[i] = 0xEE // another message's bytes, as far as this one knows
	}
	if err := srv.PostRecv(transport.RecvWR{ID: 5, Buf: transport.Whole(rbuf)}); err != nil {
		t.Fatal(err)
	}
	if err := cli.Post(transport.SendWR{ID: 6, Op: transport.OpSend, Lend: lend,
		SGL: []transport.Segment{transport.Whole(hdr), transport.Whole(data)}}); err != nil {
		t.Fatal(err)
	}
	c := waitOne(t, srv, 5*time.Second)
	if c.Status != transport.StatusSuccess || c.Op != transport.OpRecv {
		t.Fatalf("the lent SEND's receive: %+v", c)
	}
	if s := waitOne(t, cli, 5*time.Second); s.Status != transport.StatusSuccess || s.ID != 6 {
		t.Fatalf("the lent SEND's completion: %+v", s)
	}
	return c, rbuf.Bytes(), data
}

// TestLendSend: a lent SEND to a listener that maps the dialer's arena
// completes with its header placed and its data's place (Lent); the
// receive buffer past the header is untouched; PinLent reads the data
// where it is and PlaceLent copies it behind the header. Not lent, the
// same SEND is placed whole, as before.
func TestLendSend(t *testing.T) {
	cp, sp := New(Options{}), New(Options{})
	cli, srv := pair(t, cp, sp, transport.Config{TakeLent: true})
	const n = 128 << 10
	c, buf, data := lendOne(t, cli, srv, n, 0x5A, true)
	if c.Len != 64 || c.Lent.Length != n || c.Lent.Handle != data.Handle() || c.Lent.Addr != data.Addr() {
		t.Fatalf("completion %+v, want 64 bytes placed and %d lent at %#x of %#x", c, n, data.Addr(), data.Handle())
	}
	if bytes.Count(buf[:64], []byte{0x11}) != 64 || bytes.Count(buf[64:], []byte{0xEE}) != n {
		t.Fatal("the receive buffer holds more than the header")
	}
	if sp.shmLent.Load() != 1 || sp.shmRefs.Load() != 0 {
		t.Fatalf("%d lent, %d copied references; want 1, 0", sp.shmLent.Load(), sp.shmRefs.Load())
	}
	lr := srv.(transport.LentReader)
	src, ok := lr.PinLent(c.Lent)
	if !ok || !bytes.Equal(src, data.Bytes()) {
		t.Fatalf("PinLent: ok %v, the bytes right %v", ok, bytes.Equal(src, data.Bytes()))
	}
	lr.UnpinLent(c.Lent)
	if err := lr.PlaceLent(c.Lent, buf[64:]); err != nil || !bytes.Equal(buf[64:], data.Bytes()) {
		t.Fatalf("PlaceLent: %v", err)
	}
	// The slot is free again: the region goes at once.
	if err := data.Deregister(); err != nil {
		t.Fatal(err)
	}

	c, buf, data = lendOne(t, cli, srv, n, 0x5B, false)
	if c.Len != 64+n || c.Lent.Length != 0 || !bytes.Equal(buf[64:], data.Bytes()) {
		t.Fatalf("a SEND not lent: %+v", c)
	}
}

// TestLendNot: a connection that carries no SEND by reference lends
// nothing: TCP, shared memory off, sealed, with faults, the listener's
// end (it shares no memory); nor one to a listener whose user did not
// ask for lent data (Config.TakeLent: its hello does not offer it, and an
// older server would refuse the entry), which places a lent entry sent
// anyway as a reference; the data is placed as before.
func TestLendNot(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cOpts      Options
		sOpts      Options
		seal, back bool
		old        bool // a listener whose user takes no lent data (no TakeLent: no helloLend)
	}{
		{"TCP", Options{TCPOnly: true}, Options{TCPOnly: true}, false, false, false},
		{"no shared memory", Options{}, Options{NoSharedMemory: true}, false, false, false},
		{"sealed", Options{}, Options{}, true, false, false},
		{"faults", Options{Faults: &Faults{DelayCompletions: time.Microsecond}}, Options{}, false, false, false},
		{"the listener's SEND", Options{}, Options{}, false, true, false},
		{"a listener whose user takes no lent data", Options{}, Options{}, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, sp := New(tc.cOpts), New(tc.sOpts)
			cli, srv := pair(t, cp, sp, transport.Config{TakeLent: !tc.old})
			if tc.seal {
				sealPair(t, cli, srv, false)
			}
			if tc.back {
				cli, srv = srv, cli
			}
			if want := !tc.back && !tc.old && !tc.cOpts.TCPOnly && !tc.sOpts.NoSharedMemory; cli.(*conn).shmLend != want {
				t.Fatalf("the dialer lends: %v, want %v (helloLend)", cli.(*conn).shmLend, want)
			}
			if tc.old {
				// A dialer that lends all the same (hostile, or a bug):
				// the listener places the data whole.
				cli.(*conn).shmLend = true
			}
			c, buf, data := lendOne(t, cli, srv, 64<<10, 0x3C, true)
			if c.Lent.Length != 0 || c.Len != 64+64<<10 || !bytes.Equal(buf[64:], data.Bytes()) {
				t.Fatalf("completion %+v: lent, or the data not placed", c)
			}
		})
	}
}

// TestLendRefused: PinLent refuses a lent tail whose page the dialer
// punched (PlaceLent reads it as zeros, allocating nothing), one whose
// region the dialer retired (PlaceLent fails too), and any on a closed
// connection.
func TestLendRefused(t *testing.T) {
	const n = 64 << 10
	t.Run("punched page", func(t *testing.T) {
		cp, sp := New(Options{}), New(Options{})
		cli, srv := pair(t, cp, sp, transport.Config{TakeLent: true})
		c, buf, data := lendOne(t, cli, srv, n, 0x44, true)
		punch(t, cp.pd.arena.Load(), data, n-pageSize, pageSize)
		lr := srv.(transport.LentReader)
		if _, ok := lr.PinLent(c.Lent); ok {
			t.Fatal("pinned a punched page")
		}
		if err := lr.PlaceLent(c.Lent, buf[64:]); err != nil {
			t.Fatal(err)
		}
		if bytes.Count(buf[64:64+n-pageSize], []byte{0x44}) != n-pageSize || bytes.Count(buf[64+n-pageSize:], []byte{0}) != pageSize {
			t.Fatal("placed bytes differ: the data, then a page of zeros")
		}
	})
	t.Run("retired region", func(t *testing.T) {
		cp, sp := New(Options{}), New(Options{})
		cli, srv := pair(t, cp, sp, transport.Config{TakeLent: true})
		c, buf, data := lendOne(t, cli, srv, n, 0x45, true)
		if err := data.Deregister(); err != nil {
			t.Fatal(err)
		}
		lr := srv.(transport.LentReader)
		if _, ok := lr.PinLent(c.Lent); ok {
			t.Fatal("pinned a retired region")
		}
		if err := lr.PlaceLent(c.Lent, buf[64:]); err == nil {
			t.Fatal("placed a retired region's bytes")
		}
	})
	t.Run("closed", func(t *testing.T) {
		cp, sp := New(Options{}), New(Options{})
		cli, srv := pair(t, cp, sp, transport.Config{TakeLent: true})
		c, _, _ := lendOne(t, cli, srv, n, 0x46, true)
		_ = srv.Close()
		if _, ok := srv.(transport.LentReader).PinLent(c.Lent); ok {
			t.Fatal("pinned on a closed connection")
		}
	})
}

// TestLendForgedBounds: a lent entry naming memory the dialer's table
// does not resolve (a hostile dialer's bounds, or a handle its table does
// not hold) is refused when its frame is read, as a copied reference is:
// the SEND fails and so does the connection.
func TestLendForgedBounds(t *testing.T) {
	for name, forge := range map[string]func(a *arena, r transport.Region){
		"bounds": func(a *arena, r transport.Region) { corruptSlot(a, r, uint64(a.size), 1<<20) },
		"handle": func(a *arena, r transport.Region) {
			atomic.StoreUint32(word32(a.mem, r.(*region).slot*shmSlotSize+4), r.Handle()^1<<20)
		},
	} {
		t.Run(name, func(t *testing.T) {
			cp, sp := New(Options{}), New(Options{})
			cli, srv := pair(t, cp, sp, transport.Config{TakeLent: true})
			hdr := mustAlloc(t, cli, 64, transport.AccessLocal)
			data := mustAlloc(t, cli, 64<<10, transport.AccessLocal|transport.AccessRemoteWrite)
			forge(cp.pd.arena.Load(), data)
			rbuf := mustAlloc(t, srv, 1<<20, transport.AccessLocal)
			if err := srv.PostRecv(transport.RecvWR{ID: 2, Buf: transport.Whole(rbuf)}); err != nil {
				t.Fatal(err)
			}
			if err := cli.Post(transport.SendWR{ID: 3, Op: transport.OpSend, Lend: true,
				SGL: []transport.Segment{transport.Whole(hdr), transport.Whole(data)}}); err != nil {
				t.Fatal(err)
			}
			if c := waitOne(t, cli, 5*time.Second); c.Status != transport.StatusRemoteInvalidRequest {
				t.Fatalf("a lent SEND with a forged %s: %+v, want %v", name, c, transport.StatusRemoteInvalidRequest)
			}
			if sp.shmLent.Load() != 0 {
				t.Fatal("the forged entry was taken as lent")
			}
		})
	}
}

// lendPinned lends a 64 KiB SEND filled with b (lendOne) and pins its
// tail on the listener's end srv; unpin lets it go (once, and at the
// test's end).
func lendPinned(t *testing.T, b byte) (srv transport.Conn, c transport.Completion, buf []byte, data transport.Region, unpin func()) {
	t.Helper()
	cp, sp := New(Options{}), New(Options{})
	cli, srv := pair(t, cp, sp, transport.Config{TakeLent: true})
	c, buf, data = lendOne(t, cli, srv, 64<<10, b, true)
	lr := srv.(transport.LentReader)
	if _, ok := lr.PinLent(c.Lent); !ok {
		t.Fatal("refused")
	}
	var once sync.Once
	unpin = func() { once.Do(func() { lr.UnpinLent(c.Lent) }) }
	t.Cleanup(unpin)
	return srv, c, buf, data, unpin
}

// TestLendPinHeld: a pin holds the region (the dialer's Deregister waits
// for UnpinLent) and the mapping, but not the connection's end: Close
// returns at once and the mapping goes once the pin is let go (a pwrite
// to a hung export holds a pin for as long).
func TestLendPinHeld(t *testing.T) {
	srv, _, _, data, unpin := lendPinned(t, 0x47)
	retired := make(chan error, 1)
	go func() { retired <- data.Deregister() }()
	select {
	case <-retired:
		t.Fatal("Deregister returned while the bytes were pinned")
	case <-time.After(100 * time.Millisecond):
	}
	closed := make(chan struct{})
	go func() { _ = srv.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Second):
		t.Fatal("Close waits for a pin")
	}
	pa := srv.(*conn).peer
	unpin()
	if err := <-retired; err != nil {
		t.Fatal(err)
	}
	waitUnmapped(t, pa, "the pin was let go")
}

// TestLendPlaceNotBehindUnmap: a connection ending while a pin holds its
// mapping (a pwrite to a hung export) unmaps once the pin is let go; a
// PlaceLent meanwhile (the server's fallback for a pin refused, on a disk
// worker) fails at once rather than waiting behind that unmap for as long
// as the hung file.
func TestLendPlaceNotBehindUnmap(t *testing.T) {
	srv, c, buf, _, unpin := lendPinned(t, 0x48)
	lr := srv.(transport.LentReader)
	pa := srv.(*conn).peer
	_ = srv.Close()
	// The unmap waits for the pin: wait till it is queued (a reader
	// would then queue behind it).
	for deadline := time.Now().Add(5 * time.Second); pa.mu.TryRLock(); time.Sleep(time.Millisecond) {
		pa.mu.RUnlock()
		if time.Now().After(deadline) {
			t.Fatal("no unmap waits for the pin")
		}
	}
	placed := make(chan error, 1)
	go func() { placed <- lr.PlaceLent(c.Lent, buf[64:]) }()
	select {
	case err := <-placed:
		if err == nil {
			t.Fatal("placed lent bytes from a mapping being unmapped")
		}
	case <-time.After(time.Second):
		t.Fatal("PlaceLent waits behind the unmap, for the pin")
	}
	unpin()
	waitUnmapped(t, pa, "the pin was let go")
}
