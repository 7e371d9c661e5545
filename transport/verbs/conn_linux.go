//go:build linux && cgo && !noverbs

package verbs

/*
#include <stdlib.h>
#include <errno.h>
#include "lwverbs.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// domain is the protection domain of one device context.
type domain struct {
	p   *Provider
	pd  *C.struct_ibv_pd
	dev string
}

var _ transport.Domain = (*domain)(nil)

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

// wrInfo is what a completion cannot say by itself: its error completions
// carry no opcode, and the caller's ID need not be unique.
type wrInfo struct {
	id uint64
	op transport.Op
}

// recvBit marks a receive's wr_id; the rest is its slot in the ring.
const recvBit = 1 << 63

const pollBatch = 64

// conn is an RC queue pair with one CQ for both queues.
type conn struct {
	p   *Provider
	log logrus.FieldLogger
	cfg transport.Config
	ec  *eventChannel
	id  *C.struct_rdma_cm_id
	dom *domain

	events  chan cmEvent // set-up events, for await
	started bool

	cq *cq
	qp *C.struct_ibv_qp

	local, remote string

	// mu guards everything below and the C staging memory; Poll takes it
	// too, so accounting and rings stay consistent.
	mu                  sync.Mutex
	closing             bool // Close called: Post/PostRecv fail
	peerGone            bool // DISCONNECTED seen
	qpErr               bool // a completion reported the QP in error
	sendRing            []wrInfo
	sendSeq, sendOut    int
	recvRing            []uint64
	recvSeq, recvOut    int
	swr                 []C.struct_lwv_swr // C memory
	sge                 []C.struct_lwv_sge // C memory
	rwr                 []C.struct_lwv_rwr // C memory
	sendWRs, recvWRs    unsafe.Pointer     // C memory: ibv_send_wr/ibv_recv_wr staging
	sendSGEs, recvSGEs  unsafe.Pointer
	disconnectOnce      sync.Once
	closeOnce, freeOnce sync.Once
}

var _ transport.Conn = (*conn)(nil)

func cArray[T any](n int) ([]T, unsafe.Pointer) {
	var zero T
	p := C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(zero)))
	return unsafe.Slice((*T)(p), n), p
}

func newConn(p *Provider, cfg transport.Config) (*conn, error) {
	ec, err := newEventChannel()
	if err != nil {
		return nil, err
	}
	c := &conn{p: p, log: p.log, cfg: cfg, ec: ec, events: make(chan cmEvent, 16)}
	c.sendRing = make([]wrInfo, cfg.SendQueueDepth)
	c.recvRing = make([]uint64, cfg.RecvQueueDepth)
	c.swr, _ = cArray[C.struct_lwv_swr](cfg.SendQueueDepth)
	c.sge, _ = cArray[C.struct_lwv_sge](cfg.SendQueueDepth * cfg.MaxSGE)
	c.rwr, _ = cArray[C.struct_lwv_rwr](cfg.RecvQueueDepth)
	_, c.sendWRs = cArray[C.struct_ibv_send_wr](cfg.SendQueueDepth)
	_, c.sendSGEs = cArray[C.struct_ibv_sge](cfg.SendQueueDepth * cfg.MaxSGE)
	_, c.recvWRs = cArray[C.struct_ibv_recv_wr](cfg.RecvQueueDepth)
	_, c.recvSGEs = cArray[C.struct_ibv_sge](cfg.RecvQueueDepth)
	return c, nil
}

// start begins reading the connection's rdma_cm events.
func (c *conn) start() {
	c.started = true
	go c.ec.run(c.event)
}

func (c *conn) event(ev cmEvent) {
	switch ev.kind {
	case C.RDMA_CM_EVENT_DISCONNECTED:
		c.mu.Lock()
		c.peerGone = true
		log := c.log
		c.mu.Unlock()
		log.Debug("peer disconnected")
		// rdma_disconnect moves our QP to the error state, which flushes
		// every outstanding work request, as the interface promises.
		c.disconnect()
	case C.RDMA_CM_EVENT_TIMEWAIT_EXIT:
	default:
		select {
		case c.events <- ev:
		default:
		}
	}
}

func (c *conn) disconnect() {
	c.disconnectOnce.Do(func() {
		if c.id != nil {
			C.lwv_disconnect(c.id)
		}
		if c.qp != nil {
			C.lwv_qp_to_error(c.qp)
		}
	})
}

// await waits for the set-up event want; any other event is an error.
func (c *conn) await(ctx context.Context, want C.int) error {
	t := time.NewTimer(c.p.opts.ConnectTimeout + time.Second)
	defer t.Stop()
	select {
	case ev := <-c.events:
		if ev.kind == want {
			return nil
		}
		if ev.kind == C.RDMA_CM_EVENT_REJECTED {
			return fmt.Errorf("connection refused: %v", ev)
		}
		return fmt.Errorf("%v, waiting for %s", ev, C.GoString(C.lwv_event_str(want)))
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("timed out waiting for %s", C.GoString(C.lwv_event_str(want)))
	}
}

// setupQP creates the CQ and the RC queue pair on the id's device.
func (c *conn) setupQP() error {
	vctx := C.lwv_id_verbs(c.id)
	if vctx == nil {
		return errors.New("verbs: rdma_cm id is bound to no device")
	}
	d, err := c.p.domainFor(vctx)
	if err != nil {
		return err
	}
	c.dom = d
	q, err := newCQ(c, vctx, c.cfg.SendQueueDepth+c.cfg.RecvQueueDepth)
	if err != nil {
		return err
	}
	c.cq = q
	if r := C.lwv_create_qp(c.id, d.pd, q.cq, C.int(c.cfg.SendQueueDepth), C.int(c.cfg.RecvQueueDepth), C.int(c.cfg.MaxSGE)); r < 0 {
		return fmt.Errorf("verbs: rdma_create_qp (depths %d/%d, %d SGEs) on %s: %w",
			c.cfg.SendQueueDepth, c.cfg.RecvQueueDepth, c.cfg.MaxSGE, d.dev, syscall.Errno(-r))
	}
	c.qp = C.lwv_id_qp(c.id)
	return nil
}

// established finishes set-up once the connection is up.
func (c *conn) established() {
	C.lwv_set_min_rnr_timer(c.qp, C.uint8_t(c.p.opts.MinRNRTimer))
	local, remote := idAddr(c.id, 0), idAddr(c.id, 1)
	log := c.p.log.WithFields(logrus.Fields{"conn": local + "->" + remote, "device": c.dom.dev})
	// The event goroutine already runs: publish under mu.
	c.mu.Lock()
	c.local, c.remote, c.log = local, remote, log
	c.mu.Unlock()
	log.Info("verbs connection established")
}

func (c *conn) CQ() transport.CQ         { return c.cq }
func (c *conn) Domain() transport.Domain { return c.dom }
func (c *conn) LocalAddr() string        { return c.local }
func (c *conn) RemoteAddr() string       { return c.remote }
func (c *conn) Provider() string         { return Name }
func (c *conn) Limits() transport.Limits {
	return transport.Limits{SendQueueDepth: c.cfg.SendQueueDepth, RecvQueueDepth: c.cfg.RecvQueueDepth,
		MaxSGE: c.cfg.MaxSGE, MaxMessageSize: c.cfg.MaxMessageSize}
}

// localKey checks a segment and returns its address and lkey. A region of
// this provider that was deregistered keeps its stale lkey: the device then
// fails the request with a local protection error, as verbs does.
func (c *conn) localKey(s transport.Segment) (uint64, uint32, error) {
	r, ok := s.Region.(*region)
	if !ok {
		return 0, 0, fmt.Errorf("verbs: segment region %T is not verbs memory", s.Region)
	}
	if s.Offset < 0 || s.Length < 0 || s.Offset+s.Length > len(r.buf) {
		return 0, 0, fmt.Errorf("verbs: segment [%d,+%d) outside its %d-byte region", s.Offset, s.Length, len(r.buf))
	}
	return r.Addr() + uint64(s.Offset), r.lkey, nil
}

// deadLocked says why nothing can be posted any more; c.mu is held. A QP
// in the error state would take new work requests, but Soft-RoCE (Linux
// 6.1) never flushes receives posted after the error, so they are refused.
func (c *conn) deadLocked() error {
	switch {
	case c.closing:
		return transport.ErrClosed
	case c.peerGone:
		return fmt.Errorf("verbs: peer disconnected: %w", transport.ErrClosed)
	case c.qpErr:
		return fmt.Errorf("verbs: connection in error after a failed work request: %w", transport.ErrClosed)
	}
	return nil
}

// Post validates the whole chain, then posts it with one ibv_post_send.
func (c *conn) Post(wrs ...transport.SendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.deadLocked(); err != nil {
		return err
	}
	if c.sendOut+len(wrs) > len(c.sendRing) {
		return transport.ErrQueueFull
	}
	k := 0
	for i, wr := range wrs {
		if len(wr.SGL) > c.cfg.MaxSGE {
			return fmt.Errorf("verbs: work request %d has %d segments, the most is %d", i, len(wr.SGL), c.cfg.MaxSGE)
		}
		total := 0
		for _, s := range wr.SGL {
			addr, lkey, err := c.localKey(s)
			if err != nil {
				return err
			}
			c.sge[k] = C.struct_lwv_sge{addr: C.uint64_t(addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(lkey)}
			k++
			total += s.Length
		}
		if total > c.cfg.MaxMessageSize {
			return fmt.Errorf("verbs: work request %d is %d bytes, the most is %d", i, total, c.cfg.MaxMessageSize)
		}
		w := &c.swr[i]
		slot := (c.sendSeq + i) % len(c.sendRing)
		w.wr_id = C.uint64_t(slot)
		w.nsge = C.int32_t(len(wr.SGL))
		w.imm = C.uint32_t(wr.Imm)
		w.remote_addr, w.rkey = 0, 0
		switch wr.Op {
		case transport.OpSend:
			w.op = C.LWV_SEND
			if wr.HasImm {
				w.op = C.LWV_SEND_IMM
			}
		case transport.OpWrite:
			w.op = C.LWV_WRITE
			if wr.HasImm {
				w.op = C.LWV_WRITE_IMM
			}
			w.remote_addr = C.uint64_t(wr.RemoteAddr)
			w.rkey = C.uint32_t(wr.RKey)
			if brokenRKey {
				w.rkey ^= 0x5a5a5a5a
			}
		default:
			return fmt.Errorf("verbs: work request %d: op %v cannot be posted on the send queue", i, wr.Op)
		}
	}
	var bad C.int
	r := C.lwv_post_send(c.qp, &c.swr[0], C.int(len(wrs)), &c.sge[0],
		(*C.struct_ibv_send_wr)(c.sendWRs), (*C.struct_ibv_sge)(c.sendSGEs), &bad)
	posted := len(wrs)
	if r != 0 {
		posted = 0
		if bad > 0 {
			posted = int(bad)
		}
	}
	for i := 0; i < posted; i++ {
		c.sendRing[(c.sendSeq+i)%len(c.sendRing)] = wrInfo{id: wrs[i].ID, op: wrs[i].Op}
	}
	c.sendSeq = (c.sendSeq + posted) % len(c.sendRing)
	c.sendOut += posted
	if r != 0 {
		if r == C.ENOMEM {
			return fmt.Errorf("verbs: ibv_post_send posted %d of %d: %w", posted, len(wrs), transport.ErrQueueFull)
		}
		return fmt.Errorf("verbs: ibv_post_send posted %d of %d: %w", posted, len(wrs), syscall.Errno(r))
	}
	return nil
}

// PostRecv posts the receives with one ibv_post_recv.
func (c *conn) PostRecv(wrs ...transport.RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.deadLocked(); err != nil {
		return err
	}
	if c.recvOut+len(wrs) > len(c.recvRing) {
		return transport.ErrQueueFull
	}
	for i, wr := range wrs {
		addr, lkey, err := c.localKey(wr.Buf)
		if err != nil {
			return err
		}
		slot := (c.recvSeq + i) % len(c.recvRing)
		c.rwr[i] = C.struct_lwv_rwr{wr_id: C.uint64_t(slot) | recvBit,
			sge: C.struct_lwv_sge{addr: C.uint64_t(addr), length: C.uint32_t(wr.Buf.Length), lkey: C.uint32_t(lkey)}}
	}
	var bad C.int
	r := C.lwv_post_recv(c.qp, &c.rwr[0], C.int(len(wrs)), (*C.struct_ibv_recv_wr)(c.recvWRs), (*C.struct_ibv_sge)(c.recvSGEs), &bad)
	posted := len(wrs)
	if r != 0 {
		posted = 0
		if bad > 0 {
			posted = int(bad)
		}
	}
	for i := 0; i < posted; i++ {
		c.recvRing[(c.recvSeq+i)%len(c.recvRing)] = wrs[i].ID
	}
	c.recvSeq = (c.recvSeq + posted) % len(c.recvRing)
	c.recvOut += posted
	if r != 0 {
		return fmt.Errorf("verbs: ibv_post_recv posted %d of %d: %w", posted, len(wrs), syscall.Errno(r))
	}
	return nil
}

// Close moves the queue pair to the error state (every outstanding work
// request completes with StatusFlushed), collects those completions for
// later Poll/Wait, disconnects and frees the verbs objects.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closing = true
		c.mu.Unlock()
		c.disconnect()
		if c.cq != nil {
			c.cq.drainAndFree()
		}
		c.destroy()
		c.log.Debug("verbs connection closed")
	})
	return nil
}

// destroy frees whatever set-up created; it is also the failure path of
// Dial and Accept.
func (c *conn) destroy() {
	c.freeOnce.Do(func() {
		c.ec.stop(c.started)
		if c.cq != nil {
			c.cq.free()
		}
		if c.qp != nil {
			C.lwv_destroy_qp(c.id)
		}
		if c.cq != nil && c.cq.cq != nil {
			C.lwv_destroy_cq(c.cq.cq)
			c.cq.cq = nil
		}
		if c.cq != nil && c.cq.cc != nil {
			C.lwv_destroy_comp_channel(c.cq.cc)
			c.cq.cc = nil
		}
		if c.id != nil {
			C.lwv_destroy_id(c.id)
		}
		c.ec.destroy()
		c.mu.Lock()
		for _, p := range []unsafe.Pointer{unsafe.Pointer(&c.swr[0]), unsafe.Pointer(&c.sge[0]), unsafe.Pointer(&c.rwr[0]),
			c.sendWRs, c.sendSGEs, c.recvWRs, c.recvSGEs} {
			C.free(p)
		}
		c.swr, c.sge, c.rwr = nil, nil, nil
		c.closing = true
		c.mu.Unlock()
		if c.cq != nil {
			c.cq.markClosed()
		}
	})
}
