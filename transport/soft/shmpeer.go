package soft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/transport"
)

// The listener's side of shared memory (shm.go): the dialer's arena,
// received over the unix socket and mapped after checking, and the copies
// into and out of it. Nothing read from the mapping is trusted: a slot is
// taken (its state word) before its fields are read, each field is read
// once, and every offset is checked against the mapping's size.

// shmAccept and shmRefuse answer a dialer's arena.
const (
	shmAccept = 'Y'
	shmRefuse = 'N'
)

// peerArena is a dialer's arena as the listener mapped it.
type peerArena struct {
	mu   sync.RWMutex // held for reading by each copy; unmap takes it
	mem  []byte       // nil once unmapped
	fd   int          // the memfd, which copies out of the arena read
	hook func()       // Provider.shmCopyHook
}

// sendArena passes the arena's memfd and size to the listener and reads
// its answer: true when it mapped the arena.
func sendArena(uc *net.UnixConn, fd int, size int64) (bool, error) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(size))
	n, _, err := uc.WriteMsgUnix(b[:], unix.UnixRights(fd), nil)
	if err == nil && n != len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return false, err
	}
	var d [1]byte
	if _, err := io.ReadFull(uc, d[:]); err != nil {
		return false, err
	}
	switch d[0] {
	case shmAccept:
		return true, nil
	case shmRefuse:
		return false, nil
	}
	return false, fmt.Errorf("softrdma: bad shared-memory answer %q", d[0])
}

// recvArena reads a dialer's memfd and announced size, checks and maps
// it, and answers. A memfd that fails a check is refused and the
// connection carries its data on the socket; an error is the socket's.
func recvArena(uc *net.UnixConn) (*peerArena, error, error) {
	var b [8]byte
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, flags, _, err := uc.ReadMsgUnix(b[:], oob)
	if err != nil {
		return nil, nil, err
	}
	fds := rightsOf(oob[:oobn])
	defer func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}()
	if n < len(b) {
		if _, err := io.ReadFull(uc, b[n:]); err != nil {
			return nil, nil, err
		}
	}
	var why error
	var pa *peerArena
	switch {
	case flags&unix.MSG_CTRUNC != 0 || len(fds) != 1:
		why = fmt.Errorf("%d descriptors", len(fds))
	default:
		pa, why = mapArena(fds[0], int64(binary.LittleEndian.Uint64(b[:])))
	}
	ans := byte(shmAccept)
	if why != nil {
		ans = shmRefuse
	}
	if _, err := uc.Write([]byte{ans}); err != nil {
		pa.unmap()
		return nil, nil, err
	}
	return pa, why, nil
}

func rightsOf(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if r, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, r...)
		}
	}
	return fds
}

// mapArena checks that fd is a memfd on tmpfs (not hugetlbfs), sealed so
// it can neither shrink nor grow nor change its seals, of the size the
// dialer announced, and maps it. A hostile dialer so cannot pull pages out
// from under the mapping (which would raise SIGBUS here).
func mapArena(fd int, size int64) (*peerArena, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("not a memfd: %w", err)
	}
	if seals&shmSeals != shmSeals {
		return nil, fmt.Errorf("seals %#x, want %#x", seals, shmSeals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return nil, err
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG || fs.Type != unix.TMPFS_MAGIC:
		return nil, errors.New("not a memfd on tmpfs")
	case st.Size != size:
		return nil, fmt.Errorf("%d bytes, announced %d", st.Size, size)
	case size < shmTableSize+pageSize || size > shmMaxArena || size%pageSize != 0:
		return nil, fmt.Errorf("arena of %d bytes", size)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		return nil, err
	}
	own, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, err
	}
	return &peerArena{mem: mem, fd: own}, nil
}

// unmap waits for copies in progress and unmaps; later copies fail.
func (pa *peerArena) unmap() {
	if pa == nil {
		return
	}
	pa.mu.Lock()
	pa.unmapLocked()
	pa.mu.Unlock()
}

// unmapSoon is unmap for a connection's end: at once when nothing holds
// the mapping, else (a fill in progress, whose pread may not return for as
// long as a hung file) by a goroutine once it lets go, so that the end,
// and Close waiting for it, do not wait for a file. Fills that come
// meanwhile are refused (FillRemote).
func (pa *peerArena) unmapSoon() {
	if pa == nil {
		return
	}
	if !pa.mu.TryLock() {
		go pa.unmap()
		return
	}
	pa.unmapLocked()
	pa.mu.Unlock()
}

func (pa *peerArena) unmapLocked() {
	if pa.mem != nil {
		_ = unix.Munmap(pa.mem)
		_ = unix.Close(pa.fd)
		pa.mem = nil
	}
}

// shmTakeTries bounds the CAS attempts on a state word the dialer keeps
// changing.
const shmTakeTries = 64

// take resolves handle to its slot and takes it: the slot is valid and
// its active count raised, so the dialer's Deregister waits. It then reads
// the slot's fields once and returns where the bytes [addr, addr+n) of the
// region start in the mapping, checked against it; write says the region
// must be open to remote write, and its pages there (resident). ok false:
// no such region, or one with pages missing (the caller falls back or
// refuses); the slot is not held then. pa.mu is held for reading.
//
// The listener touches no page of the mapping that is not there: a page
// the dialer never populated, or punched out (fallocate), would be
// allocated by the listener's fault and charged to the listener's memory
// cgroup (docs/security.md).
func (pa *peerArena) take(handle uint32, addr uint64, n int, write bool) (start uint64, slot int, ok bool) {
	return pa.takeFor(handle, addr, n, write, write)
}

// takeFor is take with residency asked for apart: a lent SEND's bytes
// read where they are (shmlend.go) need their pages there, not write
// access.
func (pa *peerArena) takeFor(handle uint32, addr uint64, n int, write, inMemory bool) (start uint64, slot int, ok bool) {
	mem := pa.mem
	slot = int(handle & (shmSlots - 1))
	if mem == nil || slot == 0 || n < 0 || !resident(mem, uint64(slot*shmSlotSize), shmSlotSize) {
		return 0, 0, false
	}
	w := stateWord(mem, slot)
	taken := false
	for range shmTakeTries {
		old := atomic.LoadUint32(w)
		if old&shmValid == 0 || old&shmCountMask == shmCountMask {
			return 0, 0, false
		}
		if atomic.CompareAndSwapUint32(w, old, old+1) {
			taken = true
			break
		}
	}
	if !taken {
		return 0, 0, false
	}
	base := slot * shmSlotSize
	h := atomic.LoadUint32(word32(mem, base+4))
	raddr := atomic.LoadUint64(word64(mem, base+8))
	off := atomic.LoadUint64(word64(mem, base+16))
	ln := atomic.LoadUint64(word64(mem, base+24))
	access := atomic.LoadUint32(word32(mem, base+32))
	size := uint64(len(mem))
	if h != handle || (write && access&uint32(transport.AccessRemoteWrite) == 0) ||
		off < shmTableSize || off > size || ln > size-off ||
		addr < raddr || addr-raddr > ln || uint64(n) > ln-(addr-raddr) {
		release(mem, slot)
		return 0, 0, false
	}
	start = off + (addr - raddr)
	if inMemory && !resident(mem, start, uint64(n)) {
		release(mem, slot)
		return 0, 0, false
	}
	return start, slot, true
}

// resident reports whether every page of the n bytes at off in mem is in
// memory (mincore). A page the dialer punches out after the look is
// allocated by the copy all the same: the residual risk docs/security.md
// states.
func resident(mem []byte, off, n uint64) bool {
	var vec [256]byte
	s, e := off&^(pageSize-1), min((off+n+pageSize-1)&^(pageSize-1), uint64(len(mem)))
	for s < e {
		k := min(e-s, uint64(len(vec))*pageSize)
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[s])), uintptr(k), uintptr(unsafe.Pointer(&vec[0])))
		if errno != 0 {
			return false
		}
		for _, v := range vec[:k/pageSize] {
			if v&1 == 0 {
				return false
			}
		}
		s += k
	}
	return true
}

// release lowers slot's active count.
func release(mem []byte, slot int) { atomic.AddUint32(stateWord(mem, slot), ^uint32(0)) }

// copyTo copies the gather list segs into the dialer's region (RDMA
// WRITE); false: the target is not a region open to remote write, nothing
// was copied.
func (pa *peerArena) copyTo(handle uint32, addr uint64, n int, src [][]byte) bool {
	pa.mu.RLock()
	defer pa.mu.RUnlock()
	start, slot, ok := pa.take(handle, addr, n, true)
	if !ok {
		return false
	}
	dst := pa.mem[start : start+uint64(n)]
	if pa.hook != nil {
		pa.hook()
	}
	for _, s := range src {
		dst = dst[copy(dst, s):]
	}
	release(pa.mem, slot)
	return true
}

// copyFrom copies n bytes at addr of the dialer's region handle into dst
// (a SEND's reference). It reads the memfd rather than the mapping: a
// hole reads as zeros without a page being allocated.
func (pa *peerArena) copyFrom(dst []byte, handle uint32, addr uint64) bool {
	pa.mu.RLock()
	defer pa.mu.RUnlock()
	return pa.copyFromLocked(dst, handle, addr)
}

// copyFromLocked is copyFrom with pa.mu held for reading.
func (pa *peerArena) copyFromLocked(dst []byte, handle uint32, addr uint64) bool {
	start, slot, ok := pa.take(handle, addr, len(dst), false)
	if !ok {
		return false
	}
	defer release(pa.mem, slot)
	for len(dst) > 0 {
		k, err := unix.Pread(pa.fd, dst, int64(start))
		if err == unix.EINTR {
			continue
		}
		if err != nil || k == 0 {
			return false
		}
		dst, start = dst[k:], start+uint64(k)
	}
	return true
}

// offerArena runs the dialer's side of the shared-memory step on the unix
// socket it moved to; it reports whether the listener mapped the arena.
func (p *Provider) offerArena(ctx context.Context, uc *net.UnixConn, a *arena) (bool, error) {
	fd, size := a.fd, a.size
	if p.arenaHook != nil {
		fd, size = p.arenaHook(a)
	}
	_ = uc.SetDeadline(time.Now().Add(p.opts.HandshakeTimeout))
	stop := context.AfterFunc(ctx, func() { _ = uc.SetDeadline(time.Unix(1, 0)) })
	ok, err := sendArena(uc, fd, size)
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err != nil {
		return false, err
	}
	return ok, uc.SetDeadline(time.Time{})
}

// acceptArena runs the listener's side.
func (l *listener) acceptArena(uc *net.UnixConn) (*peerArena, error) {
	_ = uc.SetDeadline(time.Now().Add(l.p.opts.HandshakeTimeout))
	stop := context.AfterFunc(l.ctx, func() { _ = uc.SetDeadline(time.Unix(1, 0)) })
	pa, why, err := recvArena(uc)
	if !stop() {
		err = errors.Join(err, transport.ErrClosed)
	}
	if err != nil {
		pa.unmap()
		return nil, err
	}
	if why != nil {
		l.p.log.WithError(why).Warn("softrdma: refused a peer's shared memory; its data goes on the socket")
	}
	if pa != nil {
		pa.hook = l.p.shmCopyHook
	}
	return pa, uc.SetDeadline(time.Time{})
}

// shmEnds is what the shared-memory step gave a new connection: out, on a
// dialer, that the listener mapped its arena; peer, on a listener, the
// mapping.
type shmEnds struct {
	out  bool
	lend bool // out, and the listener takes lent SENDs (helloLend)
	peer *peerArena
}
