package soft

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/lwiofs/lwiofs/transport"
)

// pageSize aligns the fake addresses regions get, with one unmapped page
// between neighbours so that an off-by-one address never names another
// region.
const pageSize = 4096

// maxRegion is the largest region Alloc registers (64 GiB).
const maxRegion = 1 << 36

// domain is the provider's one protection domain: the table of live
// regions that incoming RDMA WRITEs are checked against.
type domain struct {
	mu      sync.RWMutex
	regions map[uint32]*region // by handle; a region leaves at Deregister
	nextVA  uint64
	// arena, once a dial made it, holds the regions open to remote write
	// registered since (shm.go); nil: they are Go memory.
	arena atomic.Pointer[arena]
}

var _ transport.QueueDomain = (*domain)(nil)

func newDomain() *domain {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	// A random page-aligned base in the user half of a 47-bit address
	// space looks like a real VA and differs between runs, so a peer
	// cannot rely on addresses it was not given.
	base := (0x1000_0000_0000 + binary.LittleEndian.Uint64(b[:])%0x5000_0000_0000) &^ (pageSize - 1)
	return &domain{regions: make(map[uint32]*region), nextVA: base}
}

// Alloc allocates and registers n bytes. The handle is drawn from
// crypto/rand (never 0, never one that is live), the address is fake but
// stable for the region's life.
func (d *domain) Alloc(n int, access transport.Access) (transport.Region, error) {
	if n <= 0 || n > maxRegion {
		return nil, fmt.Errorf("softrdma: cannot register %d bytes", n)
	}
	if access&^(transport.AccessLocal|transport.AccessRemoteWrite) != 0 {
		return nil, fmt.Errorf("softrdma: unknown access flags %#x", uint32(access))
	}
	r := &region{d: d, access: access | transport.AccessLocal}
	// Only a region open to remote write goes in the arena: the listener
	// can write into everything it maps, so a local-only one (a receive
	// buffer the engine parses, a send area) stays private memory.
	if a := d.arena.Load(); a != nil && (access&transport.AccessRemoteWrite != 0 || a.localToo) {
		if buf, slot, off, ok := a.alloc(n); ok {
			r.buf, r.slot, r.off = buf, slot, off
			a.populate(off, n)
		}
	}
	if r.buf == nil {
		r.buf = make([]byte, n)
	}
	var b [4]byte
	d.mu.Lock()
	defer d.mu.Unlock()
	for r.handle == 0 {
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		h := binary.LittleEndian.Uint32(b[:])
		if r.slot != 0 { // an arena region's handle names its slot (shm.go)
			h = h&^(shmSlots-1) | uint32(r.slot)
		}
		if _, taken := d.regions[h]; h != 0 && !taken {
			r.handle = h
			break
		}
	}
	r.addr = d.nextVA
	d.nextVA += (uint64(n)+pageSize-1)&^(pageSize-1) + pageSize
	d.regions[r.handle] = r
	if r.slot != 0 {
		d.arena.Load().publish(r)
	}
	return r, nil
}

// target resolves the destination of an incoming RDMA WRITE of n bytes,
// as the responder's NIC does: a live region of this domain, registered
// for remote write, containing [addr, addr+n).
func (d *domain) target(rkey uint32, addr uint64, n int) ([]byte, bool) {
	d.mu.RLock()
	r := d.regions[rkey]
	d.mu.RUnlock()
	if r == nil || r.access&transport.AccessRemoteWrite == 0 || addr < r.addr {
		return nil, false
	}
	off := addr - r.addr
	if off > uint64(len(r.buf)) || uint64(n) > uint64(len(r.buf))-off {
		return nil, false
	}
	return r.buf[off : off+uint64(n)], true
}

// region is registered memory: ordinary Go memory, so a write already
// being placed when Deregister runs is harmless to the program, or a
// block of the arena (slot != 0), whose Deregister waits for a peer's copy
// in progress (arena.retire) before the block can be reused.
type region struct {
	d      *domain
	buf    []byte
	addr   uint64
	handle uint32
	access transport.Access
	dead   atomic.Bool
	slot   int   // the arena's slot; 0: Go memory
	off    int64 // with slot: where buf starts in the arena
}

var _ transport.Region = (*region)(nil)

func (r *region) Bytes() []byte            { return r.buf }
func (r *region) Addr() uint64             { return r.addr }
func (r *region) Handle() uint32           { return r.handle }
func (r *region) Access() transport.Access { return r.access }

var errDeregistered = errors.New("softrdma: region already deregistered")

// Deregister removes the handle from the domain before it returns.
func (r *region) Deregister() error {
	if r.dead.Swap(true) {
		return errDeregistered
	}
	r.d.mu.Lock()
	delete(r.d.regions, r.handle)
	r.d.mu.Unlock()
	if r.slot != 0 {
		if err := r.d.arena.Load().retire(r); err != nil {
			return fmt.Errorf("softrdma: region %#x quarantined: %w", r.handle, err)
		}
	}
	return nil
}

// local checks that seg is a live region of d and in bounds, and returns
// its bytes: what the NIC's lkey check does for a gather or scatter entry.
func (d *domain) local(seg transport.Segment) ([]byte, error) {
	r, ok := seg.Region.(*region)
	if !ok || r == nil || r.d != d {
		return nil, errors.New("softrdma: segment is not memory registered in this provider's domain")
	}
	if r.dead.Load() {
		return nil, errDeregistered
	}
	if seg.Offset < 0 || seg.Length < 0 || seg.Offset > len(r.buf) || seg.Length > len(r.buf)-seg.Offset {
		return nil, fmt.Errorf("softrdma: segment [%d,+%d) outside its %d-byte region", seg.Offset, seg.Length, len(r.buf))
	}
	return r.buf[seg.Offset : seg.Offset+seg.Length], nil
}
