package soft

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
)

// TestShmReceiveBuffersPrivate: a hostile listener writes over all of the
// dialer's arena it mapped after a SEND landed in a dialer's receive
// buffer: the buffer, local-only, is not in the arena, so what the dialer
// checked is what it keeps (no double fetch); a region open to remote
// write is there, as the engine's READ targets must be.
func TestShmReceiveBuffersPrivate(t *testing.T) {
	cp, sp := New(Options{}), New(Options{})
	cli, srv := shmPair(t, cp, sp)
	rbuf := mustAlloc(t, cli, 64, transport.AccessLocal)
	if err := cli.PostRecv(transport.RecvWR{ID: 1, Buf: transport.Whole(rbuf)}); err != nil {
		t.Fatal(err)
	}
	src := mustAlloc(t, srv, 64, transport.AccessLocal)
	copy(src.Bytes(), "a status response the dialer checks, then uses")
	if err := srv.Post(transport.SendWR{ID: 2, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}); err != nil {
		t.Fatal(err)
	}
	if c := waitOne(t, cli, 5*time.Second); c.Status != transport.StatusSuccess {
		t.Fatalf("recv: %+v", c)
	}
	remote := mustAlloc(t, cli, 4096, transport.AccessLocal|transport.AccessRemoteWrite)
	if remote.(*region).slot == 0 {
		t.Fatal("a region open to remote write is not in the arena")
	}
	a, pa := cp.pd.arena.Load(), srv.(*conn).peer
	a.mu.Lock()
	used := a.next
	a.mu.Unlock()
	for i := range pa.mem[shmTableSize:used] { // the hostile listener
		pa.mem[shmTableSize+i] = 0xEE
	}
	if !bytes.Equal(rbuf.Bytes(), src.Bytes()) {
		t.Fatal("the listener rewrote a receive buffer after it completed")
	}
	if remote.Bytes()[0] != 0xEE {
		t.Fatal("the remote-write region is not where the listener maps it: the test proves nothing")
	}
}

// punch empties n bytes of r's pages in the dialer's arena, as a hostile
// dialer can at any time (fallocate on its memfd).
func punch(t *testing.T, a *arena, r transport.Region, off, n int64) {
	t.Helper()
	if err := unix.Fallocate(a.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, r.(*region).off+off, n); err != nil {
		t.Fatal(err)
	}
}

// residentPages counts the pages of b that are in memory.
func residentPages(t *testing.T, b []byte) int {
	t.Helper()
	vec := make([]byte, (len(b)+pageSize-1)/pageSize)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestShmPunchedPages: a dialer that punches the pages of its regions out
// of the memfd cannot make the listener allocate them (a page the
// listener's copy faults in is charged to the listener's memory cgroup):
// a WRITE into a punched region goes on the socket, and a SEND by
// reference from one reads zeros where the holes are, leaving them holes.
func TestShmPunchedPages(t *testing.T) {
	cp, sp := New(Options{}), New(Options{})
	cli, srv := shmPair(t, cp, sp)
	a := cp.pd.arena.Load()
	const n = 1 << 20

	src, dst := writeRegions(t, srv, cli, n, 0xC3)
	punch(t, a, dst, 0, n)
	writeAll(t, srv, src, dst)
	if k := sp.shmCopies.Load(); k != 0 {
		t.Fatalf("the listener copied %d WRITEs into punched pages", k)
	}

	ref := mustAlloc(t, cli, n, transport.AccessLocal|transport.AccessRemoteWrite)
	for i := range ref.Bytes() {
		ref.Bytes()[i] = 0x3C
	}
	punch(t, a, ref, n/2, n/2)
	rbuf := mustAlloc(t, srv, n, transport.AccessLocal)
	if err := srv.PostRecv(transport.RecvWR{ID: 2, Buf: transport.Whole(rbuf)}); err != nil {
		t.Fatal(err)
	}
	if err := cli.Post(transport.SendWR{ID: 3, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(ref)}}); err != nil {
		t.Fatal(err)
	}
	if c := waitOne(t, srv, 5*time.Second); c.Status != transport.StatusSuccess {
		t.Fatalf("recv: %+v", c)
	}
	if sp.shmRefs.Load() == 0 {
		t.Fatal("the SEND did not go by reference: the test proves nothing")
	}
	if bytes.Count(rbuf.Bytes()[:n/2], []byte{0x3C}) != n/2 || bytes.Count(rbuf.Bytes()[n/2:], []byte{0}) != n/2 {
		t.Fatal("the SEND by reference did not read the region (holes as zeros)")
	}
	if k := residentPages(t, a.mem[ref.(*region).off+n/2:ref.(*region).off+n]); k != 0 {
		t.Fatalf("the listener's copy allocated %d punched pages", k)
	}
}

// TestShmQuarantineBounded: a listener that holds every slot busy (it
// can write the state words) costs the dialer one shmDrain, not one per
// region: a mount closing its hundreds of regions does not hang.
func TestShmQuarantineBounded(t *testing.T) {
	cp := New(Options{})
	cli, _ := shmPair(t, cp, New(Options{}))
	a := cp.pd.arena.Load()
	var rs []transport.Region
	for range 5 {
		r := mustAlloc(t, cli, 4096, transport.AccessLocal|transport.AccessRemoteWrite)
		atomic.AddUint32(stateWord(a.mem, r.(*region).slot), 1) // the hostile listener
		rs = append(rs, r)
	}
	start := time.Now()
	for _, r := range rs {
		if err := r.Deregister(); !errors.Is(err, errShmBusy) {
			t.Fatalf("Deregister: %v, want %v", err, errShmBusy)
		}
	}
	if d := time.Since(start); d > shmDrain+shmDrain/2 {
		t.Fatalf("5 Deregisters of busy slots took %v", d)
	}
}

// arenaMappings counts the lines of /proc/self/maps naming an arena.
func arenaMappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "lwiofs-softrdma")
}

// TestShmConnectionsLeakNothing: 50 connections made and closed leave the
// listener with no mapping and no descriptor of the dialer's arena (a
// long-lived server sees a mount come and go).
func TestShmConnectionsLeakNothing(t *testing.T) {
	cp, sp := New(Options{}), New(Options{})
	cp.shmMinCopy, sp.shmMinCopy = 1, 1
	ln, err := sp.Listen("127.0.0.1:0", transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cycle := func() {
		cli, srv := conformance.Connect(t, cp, ln, ln.Addr(), transport.Config{}, 10*time.Second)
		if carrierOf(srv) != CarrierPipeShm {
			t.Fatalf("carrier %s, want %s", carrierOf(srv), CarrierPipeShm)
		}
		writeOne(t, srv, cli)
		closeBoth(t, cli, srv)
	}
	cycle()
	maps := arenaMappings(t)
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		cycle()
	}
	if m := arenaMappings(t); m > maps { // fewer: an earlier test's arena was collected
		t.Fatalf("%d arena mappings after 50 connections, %d after one", m, maps)
	}
	after, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	if len(after) > len(fds) {
		t.Fatalf("%d descriptors after 50 connections, %d after one", len(after), len(fds))
	}
	if sp.shmCopies.Load() < 51 {
		t.Fatalf("%d copies: the connections did not use the shared memory", sp.shmCopies.Load())
	}
}

// closeBoth closes both ends and waits until each has finished.
func closeBoth(t *testing.T, cli, srv transport.Conn) {
	t.Helper()
	_ = cli.Close()
	_ = srv.Close()
	for _, c := range []transport.Conn{cli, srv} {
		select {
		case <-c.(*conn).finished:
		case <-time.After(5 * time.Second):
			t.Fatal("a connection did not finish")
		}
	}
}
