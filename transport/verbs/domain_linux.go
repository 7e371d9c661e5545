//go:build linux && cgo && !noverbs

package verbs

/*
#include <stdlib.h>
#include <errno.h>
#include "lwverbs.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/lwiofs/lwiofs/transport"
	"golang.org/x/sys/unix"
)

// domain is the protection domain of one device context, where shared
// completion queues and receive queues of that device are made too.
type domain struct {
	p   *Provider
	ctx *C.struct_ibv_context
	pd  *C.struct_ibv_pd
	dev string

	mu         sync.Mutex
	srqs       map[*C.struct_ibv_srq]*srq // for the SRQ limit event
	events     *os.File                   // the context's async event fd (dup), once an SRQ exists
	eventsDone chan struct{}
}

var _ transport.QueueDomain = (*domain)(nil)

// Alloc maps n bytes (rounded up to whole pages) outside the Go heap and
// registers them with ibv_reg_mr.
func (d *domain) Alloc(n int, access transport.Access) (transport.Region, error) {
	if n <= 0 {
		return nil, fmt.Errorf("verbs: Alloc(%d): size must be positive", n)
	}
	page := os.Getpagesize()
	size := (n + page - 1) / page * page
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("verbs: mmap %d bytes: %w", size, err)
	}
	remote := C.int(0)
	if access&transport.AccessRemoteWrite != 0 {
		remote = 1
	}
	mr, err := C.lwv_reg_mr(d.pd, unsafe.Pointer(&mem[0]), C.size_t(size), remote)
	if mr == nil {
		syscall.Munmap(mem)
		err = errnoOr(err)
		hint := ""
		if errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.EPERM) {
			var lim unix.Rlimit
			if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil && lim.Cur != unix.RLIM_INFINITY {
				hint = fmt.Sprintf(" (registered memory is locked: RLIMIT_MEMLOCK is %d bytes; raise ulimit -l)", lim.Cur)
			}
		}
		return nil, fmt.Errorf("verbs: ibv_reg_mr %d bytes on %s: %w%s", size, d.dev, err, hint)
	}
	// Some devices (rxe) give a region without remote access rkey 0. The
	// handle is then the lkey: still the device's key for this region, and
	// a remote write naming it fails with a remote access error because the
	// region lacks remote-write access, which is the point.
	rkey := uint32(mr.rkey)
	if rkey == 0 {
		rkey = uint32(mr.lkey)
	}
	return &region{d: d, mem: mem, buf: mem[:n], mr: mr, lkey: uint32(mr.lkey), rkey: rkey,
		access: access | transport.AccessLocal}, nil
}

// region is registered provider-mapped memory.
type region struct {
	d          *domain
	mem, buf   []byte
	lkey, rkey uint32
	access     transport.Access

	mu sync.Mutex
	mr *C.struct_ibv_mr // nil once deregistered
}

var _ transport.Region = (*region)(nil)

func (r *region) Bytes() []byte            { return r.buf }
func (r *region) Addr() uint64             { return uint64(uintptr(unsafe.Pointer(&r.mem[0]))) }
func (r *region) Handle() uint32           { return r.rkey }
func (r *region) Access() transport.Access { return r.access }

// Deregister invalidates the keys (ibv_dereg_mr) and unmaps the memory.
// Work requests still naming the region complete with a protection error.
func (r *region) Deregister() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mr == nil {
		return transport.ErrClosed
	}
	if rc := C.lwv_dereg_mr(r.mr); rc != 0 {
		return fmt.Errorf("verbs: ibv_dereg_mr: %w", syscall.Errno(rc))
	}
	r.mr = nil
	return syscall.Munmap(r.mem)
}

// defaultCQDepth is CreateCQ's depth when given 0.
const defaultCQDepth = 4096

// CreateCQ makes a completion queue connections on this device may share.
func (d *domain) CreateCQ(depth int) (transport.SharedCQ, error) {
	if depth < 0 {
		return nil, fmt.Errorf("verbs: CQ depth %d", depth)
	}
	if depth == 0 {
		depth = defaultCQDepth
	}
	return newCQ(d, depth, true)
}

// localKey checks a segment and returns its address and lkey. A region of
// this provider that was deregistered keeps its stale lkey: the device then
// fails the request with a local protection error, as verbs does.
func localKey(s transport.Segment) (uint64, uint32, error) {
	r, ok := s.Region.(*region)
	if !ok {
		return 0, 0, fmt.Errorf("verbs: segment region %T is not verbs memory", s.Region)
	}
	if s.Offset < 0 || s.Length < 0 || s.Offset+s.Length > len(r.buf) {
		return 0, 0, fmt.Errorf("verbs: segment [%d,+%d) outside its %d-byte region", s.Offset, s.Length, len(r.buf))
	}
	return r.Addr() + uint64(s.Offset), r.lkey, nil
}
