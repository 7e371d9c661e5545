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
)

// cq is a completion queue and its completion channel: a connection's own,
// or one made by QueueDomain.CreateCQ that several connections share. A
// goroutine waits on the channel through Go's poller, re-arms the CQ and
// signals notify; Wait polls, then sleeps on notify. Because the CQ is
// re-armed before notify is signalled and Wait polls after taking the
// signal, no completion is missed.
//
// A work completion names its queue pair (qp_num); qps maps it to the
// connection, whose rings turn the slot in wr_id back into the caller's ID.
// Lock order: cq.mu, then conn.mu, then srq.mu.
type cq struct {
	dom    *domain
	shared bool

	cq *C.struct_ibv_cq
	cc *C.struct_ibv_comp_channel
	f  *os.File

	notify   chan struct{}
	evDone   chan struct{}
	closedCh chan struct{}

	mu      sync.Mutex
	qps     map[uint32]*conn // the connections reporting here, by qp_num
	wc      []C.struct_lwv_wc
	scratch unsafe.Pointer         // C array of pollBatch ibv_wc
	stash   []transport.Completion // reaped while a connection closed, or synthesized
	freed   bool                   // the verbs CQ is gone
}

var (
	_ transport.CQ       = (*cq)(nil)
	_ transport.SharedCQ = (*cq)(nil)
)

func newCQ(d *domain, depth int, shared bool) (*cq, error) {
	q := &cq{dom: d, shared: shared, qps: map[uint32]*conn{},
		notify: make(chan struct{}, 1), evDone: make(chan struct{}), closedCh: make(chan struct{})}
	q.wc, _ = cArray[C.struct_lwv_wc](pollBatch)
	_, q.scratch = cArray[C.struct_ibv_wc](pollBatch)
	cc, err := C.lwv_create_comp_channel(d.ctx)
	if cc == nil {
		q.freeC()
		return nil, fmt.Errorf("verbs: ibv_create_comp_channel: %w", errnoOr(err))
	}
	q.cc = cc
	cqp, err := C.lwv_create_cq(d.ctx, C.int(depth), cc)
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
	onReadable(q.f, func() C.int { return C.lwv_get_cq_event(q.cc) }, func() {
		C.lwv_req_notify(q.cq)
		q.wake()
	})
}

// register makes the queue pair qpn's completions convertible here.
func (q *cq) register(qpn uint32, c *conn) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.freed {
		return errors.New("verbs: completion queue is closed")
	}
	q.qps[qpn] = c
	return nil
}

// Poll reaps up to len(out) completions: first any collected while a
// connection closed, then from the device, up to pollBatch per cgo call.
func (q *cq) Poll(out []transport.Completion) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := copy(out, q.stash)
	q.stash = q.stash[n:]
	if len(q.stash) == 0 {
		q.stash = nil
	}
	if !q.freed {
		n += q.pollLocked(out[n:])
	}
	return n
}

// pollLocked reads the device CQ; q.mu is held.
func (q *cq) pollLocked(out []transport.Completion) int {
	n := 0
	for n < len(out) {
		k := min(len(out)-n, pollBatch)
		got := int(C.lwv_poll(q.cq, &q.wc[0], C.int(k), (*C.struct_ibv_wc)(q.scratch)))
		for i := 0; i < got; i++ {
			c := q.qps[uint32(q.wc[i].qp_num)]
			if c == nil {
				// A queue pair destroyed after its drain timed out:
				// nobody is left to hear of it.
				q.dom.p.log.WithField("qp_num", uint32(q.wc[i].qp_num)).Debug("completion of a destroyed queue pair dropped")
				continue
			}
			out[n] = c.convert(&q.wc[i])
			n++
		}
		if got < k {
			break
		}
	}
	return n
}

// drainLocked reaps everything the device has into the stash (a connection
// closing collects its flushes without taking others' completions from
// the application); q.mu is held.
func (q *cq) drainLocked() {
	if q.freed {
		return
	}
	var buf [pollBatch]transport.Completion
	for {
		n := q.pollLocked(buf[:])
		q.stash = append(q.stash, buf[:n]...)
		if n < len(buf) {
			return
		}
	}
}

// release forgets qpn and queues cs, the flushes its connection's device
// never produced; the caller destroys the queue pair next.
func (q *cq) release(qpn uint32, cs []transport.Completion) {
	q.mu.Lock()
	q.drainLocked()
	q.stash = append(q.stash, cs...)
	delete(q.qps, qpn)
	q.mu.Unlock()
	q.wake()
}

func (q *cq) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
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
// fires, the context ends, or the queue is closed (a connection's own: with
// the connection) and drained.
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

// Close destroys a shared queue: ErrInUse while a queue pair reports here.
func (q *cq) Close() error {
	if !q.shared {
		return errors.New("verbs: a connection's own completion queue closes with the connection")
	}
	q.mu.Lock()
	if q.freed {
		q.mu.Unlock()
		return transport.ErrClosed
	}
	if len(q.qps) > 0 {
		q.mu.Unlock()
		return transport.ErrInUse
	}
	q.stash = nil
	q.mu.Unlock()
	q.destroy()
	return nil
}

// destroy stops the event goroutine and frees the verbs CQ and channel;
// every queue pair reporting here must be gone. Wait then ends with
// ErrClosed once the stash is drained.
func (q *cq) destroy() {
	if q.f != nil {
		q.f.Close()
		<-q.evDone
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.freed {
		return
	}
	q.freed = true
	if q.cq != nil {
		C.lwv_destroy_cq(q.cq)
		q.cq = nil
	}
	if q.cc != nil {
		C.lwv_destroy_comp_channel(q.cc)
		q.cc = nil
	}
	q.freeC()
	close(q.closedCh)
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

// flushWait bounds how long a closing connection waits for its device to
// produce the flush completions of its outstanding work requests.
const flushWait = 2 * time.Second
