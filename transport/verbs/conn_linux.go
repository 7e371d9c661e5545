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
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/sirupsen/logrus"
)

// wrInfo is what a completion cannot say by itself: its error completions
// carry no opcode, and the caller's ID need not be unique.
type wrInfo struct {
	id uint64
	op transport.Op
}

// recvBit marks a receive's wr_id; the rest is its slot in the ring.
const recvBit = 1 << 63

const pollBatch = 64

// conn is an RC queue pair. Its send and receive completions go to a CQ of
// its own or to shared ones, its receives come from a queue of its own or
// from a shared receive queue (Config.Queues).
type conn struct {
	p   *Provider
	log logrus.FieldLogger
	cfg transport.Config
	ec  *eventChannel
	id  *C.struct_rdma_cm_id
	dom *domain

	events  chan cmEvent // set-up events, for await
	started bool

	own, sendCQ, recvCQ *cq  // own is nil when both queues report to shared CQs
	srq                 *srq // nil: the queue pair's own receive queue
	qp                  *C.struct_ibv_qp
	qpn                 uint32

	local, remote string

	// mu guards everything below and the C staging memory; a CQ's Poll
	// takes it (after the CQ's own) to convert this connection's
	// completions, so accounting and rings stay consistent.
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

// setupQP creates the queue pair on the id's device, with the queues
// Config.Queues chose or a CQ of its own.
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
	if err := c.chooseQueues(); err != nil {
		return err
	}
	if c.sendCQ == nil || c.recvCQ == nil {
		depth := c.cfg.SendQueueDepth
		if c.srq == nil {
			depth += c.cfg.RecvQueueDepth
		}
		q, err := newCQ(d, depth, false)
		if err != nil {
			return err
		}
		c.own = q
		if c.sendCQ == nil {
			c.sendCQ = q
		}
		if c.recvCQ == nil {
			c.recvCQ = c.sendCQ
		}
	}
	var srqp *C.struct_ibv_srq
	if c.srq != nil {
		if err := c.srq.attach(); err != nil {
			c.srq = nil
			return err
		}
		srqp = c.srq.srq
	}
	if r := C.lwv_create_qp(c.id, d.pd, c.sendCQ.cq, c.recvCQ.cq, srqp, C.int(c.cfg.SendQueueDepth), C.int(c.cfg.RecvQueueDepth), C.int(c.cfg.MaxSGE)); r < 0 {
		return fmt.Errorf("verbs: rdma_create_qp (depths %d/%d, %d SGEs) on %s: %w",
			c.cfg.SendQueueDepth, c.cfg.RecvQueueDepth, c.cfg.MaxSGE, d.dev, syscall.Errno(-r))
	}
	c.qp = C.lwv_id_qp(c.id)
	c.qpn = uint32(C.lwv_qp_num(c.qp))
	for _, q := range []*cq{c.sendCQ, c.recvCQ} {
		if err := q.register(c.qpn, c); err != nil {
			return err
		}
	}
	return nil
}

// chooseQueues asks Config.Queues for the connection's shared queues and
// checks they belong to its device.
func (c *conn) chooseQueues() error {
	if c.cfg.Queues == nil {
		return nil
	}
	tq, err := c.cfg.Queues.ChooseQueues(c.dom)
	if err != nil {
		return fmt.Errorf("verbs: choosing the connection's queues: %w", err)
	}
	cqOf := func(what string, q transport.SharedCQ) (*cq, error) {
		if q == nil {
			return nil, nil
		}
		v, ok := q.(*cq)
		if !ok || !v.shared || v.dom != c.dom {
			return nil, fmt.Errorf("verbs: %s is not a completion queue made by QueueDomain.CreateCQ of device %s", what, c.dom.dev)
		}
		return v, nil
	}
	if c.sendCQ, err = cqOf("Queues.SendCQ", tq.SendCQ); err != nil {
		return err
	}
	if c.recvCQ, err = cqOf("Queues.RecvCQ", tq.RecvCQ); err != nil {
		return err
	}
	if c.recvCQ == nil {
		c.recvCQ = c.sendCQ
	}
	if tq.SRQ != nil {
		v, ok := tq.SRQ.(*srq)
		if !ok || v.dom != c.dom {
			return fmt.Errorf("verbs: Queues.SRQ is not a shared receive queue made by QueueDomain.CreateSRQ of device %s", c.dom.dev)
		}
		c.srq = v
	}
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

func (c *conn) CQ() transport.CQ         { return c.sendCQ }
func (c *conn) Domain() transport.Domain { return c.dom }
func (c *conn) LocalAddr() string        { return c.local }
func (c *conn) RemoteAddr() string       { return c.remote }
func (c *conn) Provider() string         { return Name }
func (c *conn) Limits() transport.Limits {
	return transport.Limits{SendQueueDepth: c.cfg.SendQueueDepth, RecvQueueDepth: c.cfg.RecvQueueDepth,
		MaxSGE: c.cfg.MaxSGE, MaxMessageSize: c.cfg.MaxMessageSize}
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

// roomLocked says whether n more work requests may be posted to a queue
// whose ring holds size and has out outstanding: the connection's error
// if it is dead, else ErrQueueFull if they do not fit. c.mu is held.
func (c *conn) roomLocked(out, size, n int) error {
	if err := c.deadLocked(); err != nil {
		return err
	}
	if out+n > size {
		return transport.ErrQueueFull
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
	if err := c.roomLocked(c.sendOut, len(c.sendRing), len(wrs)); err != nil {
		return err
	}
	k := 0
	for i, wr := range wrs {
		if len(wr.SGL) > c.cfg.MaxSGE {
			return fmt.Errorf("verbs: work request %d has %d segments, the most is %d", i, len(wr.SGL), c.cfg.MaxSGE)
		}
		total := 0
		for _, s := range wr.SGL {
			addr, lkey, err := localKey(s)
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
	posted := postedOf(r, bad, len(wrs))
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

// postedOf is how many of n work requests an lwv_post_* call that
// returned r posted: all when it succeeded, else those before the one it
// reported bad (none when it reported none).
func postedOf(r, bad C.int, n int) int {
	if r == 0 {
		return n
	}
	return max(int(bad), 0)
}

// PostRecv posts the receives with one ibv_post_recv.
func (c *conn) PostRecv(wrs ...transport.RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	if c.srq != nil {
		return errors.New("verbs: the connection takes its receives from a shared receive queue")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.roomLocked(c.recvOut, len(c.recvRing), len(wrs)); err != nil {
		return err
	}
	for i, wr := range wrs {
		addr, lkey, err := localKey(wr.Buf)
		if err != nil {
			return err
		}
		slot := (c.recvSeq + i) % len(c.recvRing)
		c.rwr[i] = C.struct_lwv_rwr{wr_id: C.uint64_t(slot) | recvBit,
			sge: C.struct_lwv_sge{addr: C.uint64_t(addr), length: C.uint32_t(wr.Buf.Length), lkey: C.uint32_t(lkey)}}
	}
	var bad C.int
	r := C.lwv_post_recv(c.qp, &c.rwr[0], C.int(len(wrs)), (*C.struct_ibv_recv_wr)(c.recvWRs), (*C.struct_ibv_sge)(c.recvSGEs), &bad)
	posted := postedOf(r, bad, len(wrs))
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
		c.drain()
		c.destroy()
		c.log.Debug("verbs connection closed")
	})
	return nil
}

// drain runs in Close after the QP went to the error state: it collects
// the flush completions the device produces for every outstanding work
// request (waiting at most flushWait) into the CQs' stashes, so the queue
// pair can go without taking others' completions from the application.
func (c *conn) drain() {
	if c.qp == nil {
		return
	}
	deadline := time.Now().Add(flushWait)
	for {
		for _, q := range []*cq{c.sendCQ, c.recvCQ} {
			q.mu.Lock()
			q.drainLocked()
			q.mu.Unlock()
		}
		c.mu.Lock()
		done := c.sendOut == 0 && c.recvOut == 0
		c.mu.Unlock()
		if done || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// convert turns a work completion of this queue pair into a
// transport.Completion, retiring its ring slot; the CQ's mu is held.
func (c *conn) convert(wc *C.struct_lwv_wc) transport.Completion {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := mapStatus(int(wc.status))
	if st != transport.StatusSuccess && st != transport.StatusFlushed {
		c.log.WithField("status", C.GoString(C.lwv_wc_status_str(C.int(wc.status)))).
			WithField("vendor_err", uint32(wc.vendor_err)).WithField("wc_status", int(wc.status)).WithField("recv", uint64(wc.wr_id)&recvBit != 0).Debug("work completion error")
		// The error moved our QP to the error state; a verbs peer would not
		// learn of it until its own requests time out. Disconnecting puts
		// the peer's QP in error too (its receives flush), which is what
		// the interface promises: the connection fails on both sides.
		c.qpErr = true
		go c.disconnect()
	}
	id := uint64(wc.wr_id)
	if id&recvBit != 0 {
		comp := transport.Completion{Op: transport.OpRecv, Status: st, Conn: c}
		if id&srqBit != 0 {
			comp.ID = c.srq.retire(id &^ (recvBit | srqBit))
		} else {
			c.recvOut--
			comp.ID = c.recvRing[id&^recvBit]
		}
		if st == transport.StatusSuccess {
			if wc.opcode == C.IBV_WC_RECV_RDMA_WITH_IMM {
				comp.HasImm, comp.Imm = true, uint32(wc.imm)
			} else {
				comp.Len = int(wc.byte_len)
				if wc.has_imm != 0 {
					comp.HasImm, comp.Imm = true, uint32(wc.imm)
				}
			}
		}
		return comp
	}
	c.sendOut--
	info := c.sendRing[id]
	return transport.Completion{ID: info.id, Op: info.op, Status: st, Conn: c}
}

// flushedLocked synthesizes, in posting order per queue, the completions
// the device never produced; c.mu is held.
func (c *conn) flushedLocked() (sends, recvs []transport.Completion) {
	for ; c.sendOut > 0; c.sendOut-- {
		info := c.sendRing[(c.sendSeq-c.sendOut+len(c.sendRing))%len(c.sendRing)]
		sends = append(sends, transport.Completion{ID: info.id, Op: info.op, Status: transport.StatusFlushed, Conn: c})
	}
	for ; c.recvOut > 0; c.recvOut-- {
		id := c.recvRing[(c.recvSeq-c.recvOut+len(c.recvRing))%len(c.recvRing)]
		recvs = append(recvs, transport.Completion{ID: id, Op: transport.OpRecv, Status: transport.StatusFlushed, Conn: c})
	}
	return sends, recvs
}

// destroy frees whatever set-up created; it is also the failure path of
// Dial and Accept.
func (c *conn) destroy() {
	c.freeOnce.Do(func() {
		c.ec.stop(c.started)
		if c.qp != nil {
			c.mu.Lock()
			sends, recvs := c.flushedLocked()
			c.mu.Unlock()
			if c.recvCQ == c.sendCQ {
				c.sendCQ.release(c.qpn, append(sends, recvs...))
			} else {
				c.sendCQ.release(c.qpn, sends)
				c.recvCQ.release(c.qpn, recvs)
			}
			C.lwv_destroy_qp(c.id)
		}
		if c.srq != nil {
			c.srq.detach()
		}
		if c.own != nil {
			c.own.destroy()
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
	})
}
