package soft

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Shared memory on the same-host path (docs/transport.md, "Shared memory").
//
// A dialing provider keeps its registered memory open to remote write
// (not its local-only regions: receive buffers, send areas) in an arena:
// one memfd,
// sealed against shrinking and growing (F_SEAL_SHRINK|F_SEAL_GROW|
// F_SEAL_SEAL), mapped once. A connection that moved to a unix socket
// passes the memfd to the listener (SCM_RIGHTS, shmpeer.go), which checks
// the seals and the size and maps it too. From then on the listener's RDMA
// WRITE into one of the dialer's regions is a memcpy into that mapping
// followed by a header-only frame on the carrier (the socket, or the pipes
// after it: local_pipe.go), and the dialer's large
// SENDs carry references to its regions that the listener copies out. The
// listener's memory is never shared.
//
// The arena starts with a table of slots, one per region the dialer has
// registered there; the listener resolves a handle to a slot (the slot
// number is the handle's low bits, as a NIC's rkey carries its index) and
// checks it. Everything in the table is the dialer's word, so the listener
// reads each slot once, after taking it, and bounds-checks it against its
// mapping. The slot's state word fences Deregister against a copy in
// progress: a copy takes the slot (valid bit set, active count + 1, one
// CAS) and releases it after; Deregister clears the valid bit and waits
// for the count to drain before the memory can be reused.
//
// Slot layout (shmSlotSize bytes, little-endian as the host is):
//
//	0  state  u32  shmValid | active count
//	4  handle u32  the region's handle
//	8  addr   u64  the region's (fake) address
//	16 off    u64  where its bytes start in the memfd
//	24 len    u64  its length
//	32 access u32  transport.Access
const (
	shmSlotSize  = 64
	shmSlotBits  = 12
	shmSlots     = 1 << shmSlotBits
	shmTableSize = shmSlots * shmSlotSize
	shmValid     = 1 << 31
	shmCountMask = 1<<24 - 1
	// shmArenaSize is the arena's default size: address space, not
	// memory; pages are allocated as regions touch them.
	shmArenaSize = 4 << 30
	// shmMaxArena is the largest memfd a listener maps: the default. A
	// mount registers far less (its credits' buffers); a larger mapping
	// would only widen what a hostile dialer can aim the listener at.
	shmMaxArena = shmArenaSize
	// shmDrain bounds Deregister's wait for copies in progress; a slot
	// still busy then is quarantined, never reused.
	shmDrain = time.Second
	// shmSeals are the seals a listener requires.
	shmSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
)

// EnvNoShm, set to 1, keeps both binaries' softrdma connections off shared
// memory (NoSharedMemoryFromEnv): the same-host path then carries every
// byte on its pipes or unix socket.
const EnvNoShm = "LWIO_SOFT_NOSHM"

// NoSharedMemoryFromEnv reports whether EnvNoShm is "1".
func NoSharedMemoryFromEnv() bool { return os.Getenv(EnvNoShm) == "1" }

// arena is a dialer's shared registered memory.
type arena struct {
	fd   int
	mem  []byte // the whole memfd, table first
	size int64

	mu    sync.Mutex
	next  int64           // bump pointer in mem
	free  map[int][]int64 // freed blocks by class (block = pageSize << class)
	slots []int           // free slot numbers
	// stuck: a retire gave up once. A listener whose copy outlives
	// shmDrain hangs or lies, and can write the whole arena anyway; later
	// retires give a busy slot a millisecond (shmDrain/1000), not
	// shmDrain, before quarantining it (a mount closing hundreds of
	// regions).
	stuck atomic.Bool
	// localToo: Provider.shmLocalToo.
	localToo bool
}

// newArena creates, sizes, seals and maps a memfd of size bytes.
func newArena(size int64) (*arena, error) {
	if size < shmTableSize+pageSize || size%pageSize != 0 {
		return nil, fmt.Errorf("softrdma: arena of %d bytes", size)
	}
	fd, err := unix.MemfdCreate("lwiofs-softrdma", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("softrdma: memfd_create: %w", err)
	}
	a := &arena{fd: fd, size: size, next: shmTableSize, free: map[int][]int64{}}
	if err = unix.Ftruncate(fd, size); err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, shmSeals)
	}
	if err == nil {
		a.mem, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	}
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("softrdma: arena: %w", err)
	}
	for i := shmSlots - 1; i >= 1; i-- { // slot 0 is never used: handle 0 is not one
		a.slots = append(a.slots, i)
	}
	return a, nil
}

// close unmaps the arena and closes its memfd.
func (a *arena) close() {
	_ = unix.Munmap(a.mem)
	_ = unix.Close(a.fd)
}

// stateWord is the state word of slot i in mem (which must hold it).
func stateWord(mem []byte, i int) *uint32 {
	return (*uint32)(unsafe.Pointer(&mem[i*shmSlotSize]))
}

func word64(mem []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&mem[off])) }
func word32(mem []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }

// shmClass is the class of a block holding n bytes: pageSize << class.
func shmClass(n int) int {
	if n <= pageSize {
		return 0
	}
	return bits.Len(uint(n-1)) - 12
}

// alloc places a region of n bytes in the arena, with a slot and a handle;
// ok is false when the arena is full (the region then lives in Go memory).
// The slot is published valid; addr is filled in by the domain.
func (a *arena) alloc(n int) (buf []byte, slot int, off int64, ok bool) {
	c := shmClass(n)
	bsize := int64(pageSize) << c
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.slots) == 0 {
		return nil, 0, 0, false
	}
	if l := a.free[c]; len(l) > 0 {
		off = l[len(l)-1]
		a.free[c] = l[:len(l)-1]
	} else if a.next+bsize <= a.size {
		off = a.next
		a.next += bsize
	} else {
		return nil, 0, 0, false
	}
	slot = a.slots[len(a.slots)-1]
	a.slots = a.slots[:len(a.slots)-1]
	return a.mem[off : off+int64(n) : off+int64(n)], slot, off, true
}

// populate allocates the pages of the n bytes at off now, as this process:
// a listener copies only into pages that are there (peerArena.take), so it
// never allocates, nor is charged for, the dialer's memory.
func (a *arena) populate(off int64, n int) {
	b := a.mem[off : off+(int64(n)+pageSize-1)&^(pageSize-1)]
	if unix.Madvise(b, unix.MADV_POPULATE_WRITE) == nil {
		return
	}
	for i := 0; i < len(b); i += pageSize { // before Linux 5.14
		atomic.AddUint32((*uint32)(unsafe.Pointer(&b[i])), 0)
	}
}

// publish writes slot's fields, then sets it valid.
func (a *arena) publish(r *region) {
	base := r.slot * shmSlotSize
	atomic.StoreUint32(word32(a.mem, base+4), r.handle)
	atomic.StoreUint64(word64(a.mem, base+8), r.addr)
	atomic.StoreUint64(word64(a.mem, base+16), uint64(r.off))
	atomic.StoreUint64(word64(a.mem, base+24), uint64(len(r.buf)))
	atomic.StoreUint32(word32(a.mem, base+32), uint32(r.access))
	atomic.StoreUint32(stateWord(a.mem, r.slot), shmValid)
}

var errShmBusy = errors.New("softrdma: a copy into the region did not finish")

// retire fences r's slot against copies: it clears the valid bit, so no
// new copy takes it, and waits for those in progress to finish. Then the
// slot and the memory go back for reuse, the memory emptied. If a copy
// has not finished within shmDrain (a peer that hangs or lies), the slot
// and memory are quarantined: never reused, so a late copy cannot land in
// another region. After one such, the wait is a thousandth of it.
func (a *arena) retire(r *region) error {
	w := stateWord(a.mem, r.slot)
	for tries := 0; ; tries++ {
		old := atomic.LoadUint32(w)
		if atomic.CompareAndSwapUint32(w, old, old&^shmValid) {
			break
		}
		if tries == 1<<20 { // a peer that keeps rewriting the word
			return errShmBusy
		}
	}
	drain := shmDrain
	if a.stuck.Load() {
		drain = shmDrain / 1000
	}
	deadline := time.Now().Add(drain)
	for spin := 0; atomic.LoadUint32(w)&shmCountMask != 0; spin++ {
		if time.Now().After(deadline) {
			a.stuck.Store(true)
			return errShmBusy
		}
		if spin > 100 {
			time.Sleep(10 * time.Microsecond)
		}
	}
	base := r.slot * shmSlotSize
	clear(a.mem[base : base+shmSlotSize])
	c := shmClass(len(r.buf))
	bsize := int64(pageSize) << c
	// Empty the block (new regions start zeroed, as Go memory does) and
	// give its pages back.
	if err := unix.Fallocate(a.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, r.off, bsize); err != nil {
		clear(a.mem[r.off : r.off+bsize])
	}
	a.mu.Lock()
	a.free[c] = append(a.free[c], r.off)
	a.slots = append(a.slots, r.slot)
	a.mu.Unlock()
	return nil
}

// arenaFor returns the provider's arena, creating it on first use; nil
// when shared memory is off or the arena cannot be made.
func (p *Provider) arenaFor() *arena {
	if p.opts.TCPOnly || p.opts.NoSharedMemory {
		return nil
	}
	p.arenaOnce.Do(func() {
		size := int64(shmArenaSize)
		if p.opts.ArenaSize > 0 {
			size = p.opts.ArenaSize
		}
		a, err := newArena(size)
		if err != nil {
			p.log.WithError(err).Warn("softrdma: no shared-memory arena; same-host connections carry data on their socket")
			return
		}
		a.localToo = p.shmLocalToo
		p.pd.arena.Store(a)
		// Once nothing reaches the domain, no region of the arena is
		// reachable either (each holds the domain): give the memfd back.
		runtime.AddCleanup(p.pd, (*arena).close, a)
	})
	return p.pd.arena.Load()
}
