package share

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Writes as the user without a hand-off: io_uring personalities.
//
// A write must run as the tree's user (the kernel clears a set-user-ID bit
// on a write by anyone without CAP_FSETID, and applies quotas and reserved
// blocks to a writer without CAP_SYS_RESOURCE), and on an identity thread
// that costs a hand-off each way. io_uring(7) can do it on the caller's
// thread: IORING_REGISTER_PERSONALITY, called on an identity thread in the
// user's credentials, records those very credentials in the ring (a
// reference to the thread's credential structure: its fsuid, fsgid, groups
// and effective capabilities as runAs left them) and returns an id; every
// request that names the id in its submission entry runs with them
// (override_creds for the request alone) — on the submitting thread, or on
// one of the ring's kernel workers when it must block. The submitting
// thread's own credentials are never changed, so any goroutine may submit,
// including the LWIO engine's, which post RDMA work from the same thread.
//
// Sound by construction: a ring is used by one goroutine at a time (taken
// from a pool and given back), its personality ids are its own, kept in a
// map from the tree's *cred (what treeCred returns, the same key runAs
// uses), and the id travels in the very submission it applies to. Nothing
// is looked up by thread.
//
// The kernel's own checks decide as before: a write through a personality
// is a write by the user to the kernel (file_remove_privs, quota and
// reserved-block checks consult the current credentials, which the
// personality's override replaced).
//
// Where io_uring cannot be set up (a kernel without it, io_uring_disabled,
// a seccomp filter), the first failure turns it off for good and writes go
// to the identity threads as every other operation.

// io_uring ABI (linux/io_uring.h).
const (
	uringOpWrite  = 23 // IORING_OP_WRITE
	uringOpWritev = 2  // IORING_OP_WRITEV

	uringEnterGetEvents        = 1 // IORING_ENTER_GETEVENTS
	uringRegisterPersonality   = 9
	uringUnregisterPersonality = 10
	uringFeatSingleMmap        = 1 // IORING_FEAT_SINGLE_MMAP
	uringSetupClamp            = 1 << 4

	uringOffSQRing = 0
	uringOffCQRing = 0x8000000
	uringOffSQEs   = 0x10000000
)

// uringParams is struct io_uring_params (120 bytes).
type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff, cqOff                                                           uringOffsets
}

// uringOffsets is struct io_sqring_offsets, and io_cqring_offsets with
// overflow for flags, cqes for dropped and flags for array.
type uringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

// The kernel's sizes; a mistake here does not compile.
var (
	_ [120 - unsafe.Sizeof(uringParams{})]byte
	_ [unsafe.Sizeof(uringParams{}) - 120]byte
	_ [64 - unsafe.Sizeof(uringSQE{})]byte
	_ [unsafe.Sizeof(uringSQE{}) - 64]byte
)

type uringSQE struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	rwFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	pad         uint64
}

type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

// uring is one ring with a single submission entry: one write at a time,
// submitted and waited for in one io_uring_enter.
type uring struct {
	fd             int
	sqMem, cqMem   []byte // cqMem is sqMem with IORING_FEAT_SINGLE_MMAP
	sqeMem         []byte
	sqHead, sqTail *uint32
	sqMask         uint32
	sqArray        unsafe.Pointer
	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           unsafe.Pointer
	pers           map[*cred]uint16 // personality ids registered in this ring
	// The memory of the request in flight, held here (keepB, iov): the kernel reads it
	// by an address the collector does not see, and storing it in this
	// (heap) ring makes it escape, so that it is never on a goroutine
	// stack, which may move.
	keepB []byte
	iov   [maxWriteV]unix.Iovec
}

// maxPersonalities bounds a ring's registered personalities: a tree's
// *cred is replaced when its account is looked up again (every TTL), so
// old ones are dropped now and then.
const maxPersonalities = 32

var uringPool struct {
	sync.Mutex
	idle []*uring
}

// uringOff is set when a ring could not be set up: writes use the identity
// threads from then on. Tests set it to exercise that path.
var uringOff atomic.Bool

// maxIdleRings bounds the rings kept for reuse: as many as the LWIO
// engine runs disk operations at once by default (its Workers), so that a
// busy server does not set rings up and tear them down per write.
const maxIdleRings = 64

// getRing is an idle ring — one with c's personality registered already
// if there is one, else the most recently idle —, or a new one; nil when
// io_uring is off.
func getRing(c *cred) *uring {
	if uringOff.Load() {
		return nil
	}
	p := &uringPool
	p.Lock()
	r, ok := takePreferred(&p.idle, func(r *uring) bool { _, ok := r.pers[c]; return ok })
	p.Unlock()
	if ok {
		return r
	}
	r, err := newRing()
	if err != nil {
		if uringUnavailable(err) {
			uringOff.Store(true)
		}
		return nil // this write goes to the identity threads
	}
	return r
}

// uringUnavailable reports whether err from setting a ring up or
// registering a personality means io_uring cannot be used here at all (no
// such system call, refused by io_uring_disabled or a seccomp filter, an
// older ABI), rather than for the moment (out of descriptors or memory).
func uringUnavailable(err error) bool {
	switch err {
	case unix.ENOSYS, unix.EPERM, unix.EACCES, unix.EINVAL, unix.EOPNOTSUPP:
		return true
	}
	return false
}

// putRing gives r back, or closes it when enough rings are idle.
func putRing(r *uring) {
	p := &uringPool
	p.Lock()
	if len(p.idle) < maxIdleRings {
		p.idle = append(p.idle, r)
		p.Unlock()
		return
	}
	p.Unlock()
	r.close()
}

func newRing() (*uring, error) {
	var p uringParams
	p.flags = uringSetupClamp
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return nil, e
	}
	r := &uring{fd: int(fd), pers: map[*cred]uint16{}}
	fail := func(err error) (*uring, error) {
		r.close()
		return nil, err
	}
	sqSize := int(p.sqOff.array) + int(p.sqEntries)*4
	cqSize := int(p.cqOff.dropped) + int(p.cqEntries)*int(unsafe.Sizeof(uringCQE{}))
	single := p.features&uringFeatSingleMmap != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	prot, flags := unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE
	if r.sqMem, err = unix.Mmap(r.fd, uringOffSQRing, sqSize, prot, flags); err != nil {
		return fail(err)
	}
	r.cqMem = r.sqMem
	if !single {
		if r.cqMem, err = unix.Mmap(r.fd, uringOffCQRing, cqSize, prot, flags); err != nil {
			r.cqMem = nil
			return fail(err)
		}
	}
	if r.sqeMem, err = unix.Mmap(r.fd, uringOffSQEs, int(p.sqEntries)*int(unsafe.Sizeof(uringSQE{})), prot, flags); err != nil {
		return fail(err)
	}
	sq, cq := unsafe.Pointer(&r.sqMem[0]), unsafe.Pointer(&r.cqMem[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.sqOff.head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.sqOff.tail))
	r.sqMask = *(*uint32)(unsafe.Add(sq, p.sqOff.ringMask))
	r.sqArray = unsafe.Add(sq, p.sqOff.array)
	r.cqHead = (*uint32)(unsafe.Add(cq, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(cq, p.cqOff.tail))
	r.cqMask = *(*uint32)(unsafe.Add(cq, p.cqOff.ringMask))
	r.cqes = unsafe.Add(cq, p.cqOff.dropped)
	return r, nil
}

func (r *uring) close() {
	if r.sqeMem != nil {
		unix.Munmap(r.sqeMem)
	}
	if r.cqMem != nil && len(r.sqMem) > 0 && &r.cqMem[0] != &r.sqMem[0] {
		unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
	}
	unix.Close(r.fd)
}

// ringOps counts the operations submitted to rings (tests).
var ringOps atomic.Int64

// personality is r's id for c's credentials, registered on an identity
// thread in them the first time (one hand-off per ring and account).
func (r *uring) personality(c *cred) (uint16, error) {
	if id, ok := r.pers[c]; ok {
		return id, nil
	}
	if len(r.pers) >= maxPersonalities {
		for _, id := range r.pers {
			unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), uringUnregisterPersonality, 0, uintptr(id), 0, 0)
		}
		clear(r.pers)
	}
	var id uintptr
	err := runAs(c, func() error {
		v, _, e := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), uringRegisterPersonality, 0, 0, 0, 0)
		if e != 0 {
			return e
		}
		id = v
		return nil
	})
	if err != nil {
		return 0, err
	}
	r.pers[c] = uint16(id)
	return uint16(id), nil
}

// rw submits one read/write-class request with the personality and waits
// for its completion: its result (bytes, or an error). addr (and what it
// points to) must stay alive and unmoved until rw returns: the callers
// hold it in keepB or iov.
func (r *uring) rw(op uint8, fd int, addr unsafe.Pointer, n uint32, off int64, pers uint16) (int, error) {
	if off < 0 {
		// -1 is "the file position" to io_uring; pwrite(2) refuses it.
		return 0, unix.EINVAL
	}
	ringOps.Add(1)
	tail := *r.sqTail // only this goroutine moves the tail
	idx := tail & r.sqMask
	sqe := (*uringSQE)(unsafe.Add(unsafe.Pointer(&r.sqeMem[0]), uintptr(idx)*unsafe.Sizeof(uringSQE{})))
	*sqe = uringSQE{opcode: op, fd: int32(fd), off: uint64(off), addr: uint64(uintptr(addr)), len: n, personality: pers}
	*(*uint32)(unsafe.Add(r.sqArray, uintptr(idx)*4)) = idx
	atomic.StoreUint32(r.sqTail, tail+1)
	for {
		head := atomic.LoadUint32(r.cqHead)
		if head != atomic.LoadUint32(r.cqTail) {
			cqe := (*uringCQE)(unsafe.Add(r.cqes, uintptr(head&r.cqMask)*unsafe.Sizeof(uringCQE{})))
			res := cqe.res
			atomic.StoreUint32(r.cqHead, head+1)
			if res < 0 {
				return 0, unix.Errno(-res)
			}
			return int(res), nil
		}
		pending := atomic.LoadUint32(r.sqTail) - atomic.LoadUint32(r.sqHead)
		_, _, e := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(pending), 1, uringEnterGetEvents, 0, 0)
		switch e {
		case 0, unix.EINTR, unix.EAGAIN, unix.EBUSY:
			continue
		}
		if pending > 0 && atomic.LoadUint32(r.sqHead) != atomic.LoadUint32(r.sqTail) {
			// Not submitted: take the entry back and report why.
			atomic.StoreUint32(r.sqTail, tail)
			return 0, e
		}
		// Submitted: the kernel may still be reading addr; wait on,
		// without spinning on an error that repeats.
		time.Sleep(time.Millisecond)
	}
}

// pwriteAs is one pwrite(2) of p at off to fd with personality pers
// through r; it may write less than all.
func (r *uring) pwriteAs(pers uint16, fd int, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.keepB = p
	n, err := r.rw(uringOpWrite, fd, unsafe.Pointer(&p[0]), uint32(min(len(p), 1<<30)), off, pers)
	r.keepB = nil
	return n, err
}

// pwritevAs is one pwritev(2) of iov at off to fd with personality pers
// through r; it may write less than all. The vector is copied into the
// ring (the kernel reads it by address), so the caller's may be on its
// stack.
func (r *uring) pwritevAs(pers uint16, fd int, iov []unix.Iovec, off int64) (int, error) {
	if len(iov) == 0 {
		return 0, nil
	}
	k := copy(r.iov[:], iov)
	n, err := r.rw(uringOpWritev, fd, unsafe.Pointer(&r.iov[0]), uint32(k), off, pers)
	clear(r.iov[:k])
	return n, err
}

// userWriter writes as a tree's user: through a ring's personality when r
// is set, else with plain system calls (on an identity thread in the
// user's credentials, or as the server when the tree acts as the server).
type userWriter struct {
	r    *uring
	pers uint16
}

func (w userWriter) pwrite(fd int, p []byte, off int64) (int, error) {
	if w.r != nil {
		return w.r.pwriteAs(w.pers, fd, p, off)
	}
	return unix.Pwrite(fd, p, off)
}

func (w userWriter) pwritev(fd int, iov []unix.Iovec, off int64) (int, error) {
	if w.r != nil {
		return w.r.pwritevAs(w.pers, fd, iov, off)
	}
	n, _, e := unix.Syscall6(unix.SYS_PWRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)),
		uintptr(off), uintptr(uint64(off)>>32), 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// writeAs runs fn with f's descriptor and a writer that writes as the
// tree's user: on the calling goroutine through a ring when io_uring is
// available (no hand-off; inside Tree.Run too, where the personality is
// the thread's own credentials again), else on an identity thread
// (Tree.asFd). fn must write only through w.
func (t *Tree) writeAs(f *OpenFile, fn func(fd int, w userWriter) error) error {
	c, err := t.treeCred()
	if err != nil {
		return err
	}
	if c != nil {
		if r := getRing(c); r != nil {
			pers, err := r.personality(c)
			if err == nil {
				defer putRing(r)
				return f.withFd(func(fd int) error { return fn(fd, userWriter{r: r, pers: pers}) })
			}
			r.close()
			var ce *errCred
			if errors.As(err, &ce) {
				return fail(err) // the identity thread could not take c on: as runAs
			}
			if uringUnavailable(err) {
				uringOff.Store(true)
			}
		}
	}
	return t.asFd(f, func(fd int) error { return fn(fd, userWriter{}) })
}

// writeInRun is writeAs for a caller inside Tree.Run: in place, with a
// plain writer, when the calling thread has the tree's credentials (an
// identity thread Run handed the caller to), else writeAs.
func (t *Tree) writeInRun(f *OpenFile, fn func(fd int, w userWriter) error) error {
	c, err := t.treeCred()
	if err != nil {
		return err
	}
	if c != nil && runsActive.Load() > 0 && c.inPlace() {
		return f.withFd(func(fd int) error { return fn(fd, userWriter{}) })
	}
	return t.writeAs(f, fn)
}
