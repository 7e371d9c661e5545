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
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"github.com/lwiofs/lwiofs/transport"
)

// cq is a connection's completion queue and its completion channel. A
// goroutine waits on the channel through Go's poller, re-arms the CQ and
// signals notify; Wait polls, then sleeps on notify. Because the CQ is
// re-armed before notify is signalled and Wait polls after taking the
// signal, no completion is missed.
type cq struct {
	c       *conn
	cq      *C.struct_ibv_cq
	cc      *C.struct_ibv_comp_channel
	f       *os.File
	wc      []C.struct_lwv_wc
	scratch unsafe.Pointer // C array of pollBatch ibv_wc

	notify   chan struct{}
	evDone   chan struct{}
	closedCh chan struct{}

	// guarded by c.mu
	stash []transport.Completion // reaped during Close, or synthesized
	freed bool                   // the verbs CQ is gone
}

var _ transport.CQ = (*cq)(nil)

func newCQ(c *conn, vctx *C.struct_ibv_context, depth int) (*cq, error) {
	q := &cq{c: c, notify: make(chan struct{}, 1), evDone: make(chan struct{}), closedCh: make(chan struct{})}
	q.wc, _ = cArray[C.struct_lwv_wc](pollBatch)
	_, q.scratch = cArray[C.struct_ibv_wc](pollBatch)
	cc, err := C.lwv_create_comp_channel(vctx)
	if cc == nil {
		q.freeC()
		return nil, fmt.Errorf("verbs: ibv_create_comp_channel: %w", errnoOr(err))
	}
	q.cc = cc
	cqp, err := C.lwv_create_cq(vctx, C.int(depth), cc)
	if cqp == nil {
		C.lwv_destroy_comp_channel(cc)
		q.cc = nil
		q.freeC()
		return nil, fmt.Errorf("verbs: ibv_create_cq(%d): %w", depth, errnoOr(err))
	}
	q.cq = cqp
	fd, err := syscall.Dup(int(C.lwv_comp_channel_fd(cc)))
	if err != nil {
		C.lwv_destroy_cq(cqp)
		C.lwv_destroy_comp_channel(cc)
		q.cq, q.cc = nil, nil
		q.freeC()
		return nil, fmt.Errorf("verbs: dup completion channel: %w", err)
	}
	syscall.CloseOnExec(fd)
	q.f = os.NewFile(uintptr(fd), "ibv_comp_channel")
	C.lwv_req_notify(cqp)
	go q.run()
	return q, nil
}

func (q *cq) run() {
	defer close(q.evDone)
	rc, err := q.f.SyscallConn()
	if err != nil {
		return
	}
	for {
		var r C.int
		err := rc.Read(func(uintptr) bool {
			r = C.lwv_get_cq_event(q.cc)
			return r != -C.EAGAIN
		})
		if err != nil || r < 0 {
			return
		}
		C.lwv_req_notify(q.cq)
		select {
		case q.notify <- struct{}{}:
		default:
		}
	}
}

// Poll reaps up to len(out) completions: first any collected at Close, then
// from the device, up to pollBatch per cgo call.
func (q *cq) Poll(out []transport.Completion) int {
	q.c.mu.Lock()
	defer q.c.mu.Unlock()
	n := copy(out, q.stash)
	q.stash = q.stash[n:]
	if !q.freed {
		n += q.pollLocked(out[n:])
	}
	return n
}

// pollLocked reads the device CQ; c.mu is held.
func (q *cq) pollLocked(out []transport.Completion) int {
	n := 0
	for n < len(out) {
		k := min(len(out)-n, pollBatch)
		got := int(C.lwv_poll(q.cq, &q.wc[0], C.int(k), (*C.struct_ibv_wc)(q.scratch)))
		for i := 0; i < got; i++ {
			out[n] = q.convert(&q.wc[i])
			n++
		}
		if got < k {
			break
		}
	}
	return n
}

// convert turns a work completion into a transport.Completion, retiring
// its ring slot; c.mu is held.
func (q *cq) convert(wc *C.struct_lwv_wc) transport.Completion {
	c := q.c
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
		c.recvOut--
		comp := transport.Completion{ID: c.recvRing[id&^recvBit], Op: transport.OpRecv, Status: st}
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
	return transport.Completion{ID: info.id, Op: info.op, Status: st}
}

func mapStatus(s int) transport.Status {
	switch s {
	case C.IBV_WC_SUCCESS:
		return transport.StatusSuccess
	case C.IBV_WC_LOC_LEN_ERR:
		return transport.StatusLocalLength
	case C.IBV_WC_LOC_PROT_ERR:
		return transport.StatusLocalProtection
	case C.IBV_WC_REM_ACCESS_ERR:
		return transport.StatusRemoteAccess
	case C.IBV_WC_REM_INV_REQ_ERR, C.IBV_WC_REM_OP_ERR:
		// Both are the responder refusing the request; Soft-RoCE answers a
		// SEND longer than the posted receive with REM_OP_ERR where the IB
		// spec and hardware NICs say REM_INV_REQ_ERR.
		return transport.StatusRemoteInvalidRequest
	case C.IBV_WC_RNR_RETRY_EXC_ERR:
		return transport.StatusRNRRetryExceeded
	case C.IBV_WC_WR_FLUSH_ERR:
		return transport.StatusFlushed
	}
	return transport.StatusTransportError
}

// Wait polls; when nothing is ready it sleeps until the completion channel
// fires, the context ends, or the connection is closed and drained.
func (q *cq) Wait(ctx context.Context, out []transport.Completion) (int, error) {
	for {
		if n := q.Poll(out); n > 0 {
			return n, nil
		}
		select {
		case <-q.closedCh:
			if n := q.Poll(out); n > 0 {
				return n, nil
			}
			return 0, transport.ErrClosed
		default:
		}
		select {
		case <-q.notify:
		case <-q.closedCh:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// drainAndFree runs in Close after the QP went to the error state: it
// collects the flush completions the device produces for every outstanding
// work request (waiting at most flushWait), so the verbs objects can go.
func (q *cq) drainAndFree() {
	const flushWait = 2 * time.Second
	deadline := time.Now().Add(flushWait)
	var buf [pollBatch]transport.Completion
	for {
		q.c.mu.Lock()
		if !q.freed {
			n := q.pollLocked(buf[:])
			q.stash = append(q.stash, buf[:n]...)
		}
		done := q.c.sendOut == 0 && q.c.recvOut == 0
		q.c.mu.Unlock()
		if done || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// free stops the event goroutine and detaches the device CQ; completions
// the device never produced are synthesized as flushed, in posting order
// per queue. The caller destroys the QP, CQ and channel afterwards.
func (q *cq) free() {
	if q.f != nil {
		q.f.Close()
		<-q.evDone
	}
	c := q.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if q.freed {
		return
	}
	q.freed = true
	for ; c.sendOut > 0; c.sendOut-- {
		info := c.sendRing[(c.sendSeq-c.sendOut+len(c.sendRing))%len(c.sendRing)]
		q.stash = append(q.stash, transport.Completion{ID: info.id, Op: info.op, Status: transport.StatusFlushed})
	}
	for ; c.recvOut > 0; c.recvOut-- {
		id := c.recvRing[(c.recvSeq-c.recvOut+len(c.recvRing))%len(c.recvRing)]
		q.stash = append(q.stash, transport.Completion{ID: id, Op: transport.OpRecv, Status: transport.StatusFlushed})
	}
	q.freeC()
}

func (q *cq) freeC() {
	if q.wc != nil {
		C.free(unsafe.Pointer(&q.wc[0]))
		q.wc = nil
	}
	if q.scratch != nil {
		C.free(q.scratch)
		q.scratch = nil
	}
}

func (q *cq) markClosed() {
	select {
	case <-q.closedCh:
	default:
		close(q.closedCh)
	}
}
