//go:build linux && cgo && !noverbs

package verbs

/*
#include <stdlib.h>
#include <errno.h>
#include "lwverbs.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/lwiofs/lwiofs/transport"
)

// srq is a shared receive queue (ibv_create_srq). Its receives' wr_id is
// srqBit|recvBit|slot; a slot holds the caller's ID until the receive
// completes, on whichever connection took it.
type srq struct {
	dom *domain
	srq *C.struct_ibv_srq

	event chan struct{} // LimitReached (one slot)

	mu       sync.Mutex
	ids      []uint64 // by slot
	free     []int32  // free slots
	rwr      []C.struct_lwv_rwr
	wrs      unsafe.Pointer     // C staging: ibv_recv_wr
	sges     unsafe.Pointer     // C staging: ibv_sge
	users    transport.SRQUsers // queue pairs taking receives here
	freeOnce sync.Once
}

var _ transport.SRQ = (*srq)(nil)

// srqBit marks a receive posted to an SRQ (with recvBit).
const srqBit = 1 << 62

// CreateSRQ makes a shared receive queue on the domain's device and
// starts listening for its limit events.
func (d *domain) CreateSRQ(cfg transport.SRQConfig) (transport.SRQ, error) {
	depth, err := cfg.QueueDepth()
	if err != nil {
		return nil, fmt.Errorf("verbs: %w", err)
	}
	if err := d.startEvents(); err != nil {
		return nil, err
	}
	p, err := C.lwv_create_srq(d.pd, C.int(depth))
	if p == nil {
		return nil, fmt.Errorf("verbs: ibv_create_srq(%d) on %s: %w", depth, d.dev, errnoOr(err))
	}
	s := &srq{dom: d, srq: p, event: make(chan struct{}, 1), ids: make([]uint64, depth)}
	s.free = make([]int32, depth)
	for i := range s.free {
		s.free[i] = int32(depth - 1 - i)
	}
	s.rwr, _ = cArray[C.struct_lwv_rwr](depth)
	_, s.wrs = cArray[C.struct_ibv_recv_wr](depth)
	_, s.sges = cArray[C.struct_ibv_sge](depth)
	d.mu.Lock()
	d.srqs[p] = s
	d.mu.Unlock()
	return s, nil
}

// PostRecv posts the receives with one ibv_post_srq_recv.
func (s *srq) PostRecv(wrs ...transport.RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users.Closed() {
		return transport.ErrClosed
	}
	if len(wrs) > len(s.free) {
		return transport.ErrQueueFull
	}
	for i, wr := range wrs {
		if r, ok := wr.Buf.Region.(*region); ok && r.d != s.dom {
			return fmt.Errorf("verbs: receive buffer %d is registered on %s, the SRQ is on %s", i, r.d.dev, s.dom.dev)
		}
		addr, lkey, err := localKey(wr.Buf)
		if err != nil {
			return err
		}
		slot := s.free[len(s.free)-1-i]
		s.ids[slot] = wr.ID
		s.rwr[i] = C.struct_lwv_rwr{wr_id: C.uint64_t(slot) | recvBit | srqBit,
			sge: C.struct_lwv_sge{addr: C.uint64_t(addr), length: C.uint32_t(wr.Buf.Length), lkey: C.uint32_t(lkey)}}
	}
	var bad C.int
	r := C.lwv_post_srq_recv(s.srq, &s.rwr[0], C.int(len(wrs)), (*C.struct_ibv_recv_wr)(s.wrs), (*C.struct_ibv_sge)(s.sges), &bad)
	posted := postedOf(r, bad, len(wrs))
	s.free = s.free[:len(s.free)-posted]
	if r != 0 {
		return fmt.Errorf("verbs: ibv_post_srq_recv posted %d of %d: %w", posted, len(wrs), syscall.Errno(r))
	}
	return nil
}

// retire returns the caller's ID for a receive that completed and frees
// its slot.
func (s *srq) retire(slot uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free = append(s.free, int32(slot))
	return s.ids[slot]
}

// SetLimit arms the limit event (ibv_modify_srq with IBV_SRQ_LIMIT).
func (s *srq) SetLimit(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.users.CheckLimit(n, len(s.ids)); err != nil {
		return fmt.Errorf("verbs: %w", err)
	}
	if r := C.lwv_srq_limit(s.srq, C.int(n)); r != 0 {
		return fmt.Errorf("verbs: ibv_modify_srq(srq_limit %d): %w", n, syscall.Errno(r))
	}
	return nil
}

func (s *srq) LimitReached() <-chan struct{} { return s.event }

// Close destroys the SRQ (ibv_destroy_srq): ErrInUse while a queue pair
// takes receives from it.
func (s *srq) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.users.Close(s.destroy)
}

// destroy is Close's teardown, under s.mu: the SRQ, its place in the
// domain and its C staging arrays.
func (s *srq) destroy() error {
	if r := C.lwv_destroy_srq(s.srq); r != 0 {
		return fmt.Errorf("verbs: ibv_destroy_srq: %w", syscall.Errno(r))
	}
	s.dom.mu.Lock()
	delete(s.dom.srqs, s.srq)
	s.dom.mu.Unlock()
	for _, p := range []unsafe.Pointer{unsafe.Pointer(&s.rwr[0]), s.wrs, s.sges} {
		C.free(p)
	}
	s.rwr = nil
	return nil
}

func (s *srq) attach() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.users.Attach(); err != nil {
		return fmt.Errorf("verbs: shared receive queue is closed: %w", err)
	}
	return nil
}

func (s *srq) detach() {
	s.mu.Lock()
	s.users.Detach()
	s.mu.Unlock()
}

// startEvents starts, once per domain, the goroutine that reads the device
// context's asynchronous events (the SRQ limit event among them) through
// Go's poller.
func (d *domain) startEvents() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.events != nil {
		return nil
	}
	fd := C.lwv_async_fd(d.ctx)
	if fd < 0 {
		return fmt.Errorf("verbs: async event fd of %s: %w", d.dev, syscall.Errno(-fd))
	}
	dup, err := syscall.Dup(int(fd))
	if err != nil {
		return fmt.Errorf("verbs: dup async event fd: %w", err)
	}
	syscall.CloseOnExec(dup)
	d.events = os.NewFile(uintptr(dup), "ibv_async_fd")
	d.eventsDone = make(chan struct{})
	go d.readEvents()
	return nil
}

func (d *domain) readEvents() {
	defer close(d.eventsDone)
	var ev C.struct_lwv_async_event
	onReadable(d.events, func() C.int { return C.lwv_get_async_event(d.ctx, &ev) }, func() {
		if ev._type == C.IBV_EVENT_SRQ_LIMIT_REACHED {
			d.mu.Lock()
			s := d.srqs[ev.srq]
			d.mu.Unlock()
			if s != nil {
				select {
				case s.event <- struct{}{}:
				default:
				}
			}
			return
		}
		d.p.log.WithField("event", C.GoString(C.lwv_event_type_str(ev._type))).WithField("device", d.dev).Debug("asynchronous event")
	})
}

// stopEvents ends readEvents (Provider.Close).
func (d *domain) stopEvents() {
	if d.events != nil {
		d.events.Close()
		<-d.eventsDone
	}
}
