package soft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// The stress test's connection ends: workers issuing requests, handlers
// answering the peer's (stress_test.go has the test and its plan).

// stressEnd is one end of a connection in the stress test: depth worker
// goroutines issue requests, depth handler goroutines answer the peer's.
type stressEnd struct {
	name    string
	c       transport.Conn
	depth   int
	slot    int // bytes per write slot (stressSlot)
	sendMax int // largest SEND either end of the connection sends (its pools' buffer size)
	seed    uint64
	dir     int // which direction this end's requests go: 0 or 1
	peer    *stressEnd
	q       *stressQueue // where its completions come
	pool    *stressPool  // where its receives come from
	ownPool bool

	send   transport.Region // 2*depth slots: requests [0,depth), answers [depth,2depth)
	target transport.Region // remote-writable: [0,depth) our pulls land, [depth,2depth) the peer's pushes; then depth status words

	inbox []chan stressEvent // [0,depth) workers, [depth,2depth) handlers

	progress *atomic.Int64
	answered atomic.Int64
	waiting  atomic.Int64 // workers with a request in flight
	failed   func(error)
}

func newStressEnd(name string, c transport.Conn, depth, sendMax int, seed uint64, dir int, progress *atomic.Int64, failed func(error)) (*stressEnd, error) {
	e := &stressEnd{name: name, c: c, depth: depth, slot: stressSlot(depth), sendMax: sendMax, seed: seed, dir: dir,
		progress: progress, failed: failed}
	var err error
	if e.send, err = c.Domain().Alloc(2*depth*e.slot, transport.AccessLocal); err != nil {
		return e, err
	}
	if e.target, err = c.Domain().Alloc(2*depth*e.slot+8*depth, transport.AccessLocal|transport.AccessRemoteWrite); err != nil {
		return e, err
	}
	e.inbox = make([]chan stressEvent, 2*depth)
	for i := range e.inbox {
		e.inbox[i] = make(chan stressEvent, 8)
	}
	return e, nil
}

func (e *stressEnd) free() {
	for _, r := range []transport.Region{e.send, e.target} {
		if r != nil {
			_ = r.Deregister()
		}
	}
	if e.ownPool && e.pool != nil {
		_ = e.pool.region.Deregister()
	}
}

func (e *stressEnd) seg(r transport.Region, slot, off, n int) transport.Segment {
	return transport.Segment{Region: r, Offset: slot*e.slot + off, Length: n}
}

func (e *stressEnd) status(i int) []byte {
	off := 2*e.depth*e.slot + 8*i
	return e.target.Bytes()[off : off+8]
}

// worker issues requests from slot i until stop, then returns once its
// last one is answered.
func (e *stressEnd) worker(ctx context.Context, stop *atomic.Bool, i int, rng *rand.Rand) {
	wrs := make([]transport.SendWR, 2)
	for round := 0; !stop.Load(); round++ {
		p := planFor(e.seed, e.depth, e.sendMax, e.dir, i, round)
		tg, at := tag(false, i, round), tag(true, i, round)
		hdr := e.send.Bytes()[i*e.slot:]
		binary.LittleEndian.PutUint32(hdr, tg)
		binary.LittleEndian.PutUint64(hdr[8:], e.target.Addr()+uint64(i*e.slot))
		binary.LittleEndian.PutUint32(hdr[16:], e.target.Handle())
		binary.LittleEndian.PutUint64(hdr[24:], e.target.Addr()+uint64(2*e.depth*e.slot+8*i))
		send := transport.SendWR{ID: idReq | uint64(i), Op: transport.OpSend, SGL: []transport.Segment{e.seg(e.send, i, 0, stressHdr)}}
		write := transport.SendWR{ID: idReq | uint64(i), Op: transport.OpWrite,
			RemoteAddr: e.peer.target.Addr() + uint64((e.depth+i)*e.slot), RKey: e.peer.target.Handle()}
		if p.size > 0 {
			write.SGL = []transport.Segment{e.seg(e.send, i, stressHdr, p.size)}
			stressFill(write.SGL[0].Bytes(), tg)
		}
		var polled func() bool
		switch p.op {
		case opSend:
			send.SGL[0].Length = stressHdr + p.size
			wrs = append(wrs[:0], send)
		case opPull:
			wrs = append(wrs[:0], send)
		case opPoll:
			st := e.status(i)
			clearStatus(st)
			polled = func() bool { return statusWord(st) == uint64(at)|1<<32 }
			wrs = append(wrs[:0], send)
		case opPushSend:
			wrs = append(wrs[:0], write, send)
		case opPushImm:
			write.Imm, write.HasImm = tg, true
			wrs = append(wrs[:0], write)
		}
		e.waiting.Add(1)
		if err := e.post(wrs, p.chain); err != nil {
			e.failed(fmt.Errorf("%s worker %d: %w", e.name, i, err))
			return
		}
		sends, answered := len(wrs), false
		for sends > 0 || !answered {
			cond := polled
			if answered {
				cond = nil
			}
			ev, err := e.await(ctx, i, true, cond, rng)
			if errors.Is(err, errPolled) {
				answered = true
				continue
			}
			if err != nil {
				e.failed(fmt.Errorf("%s worker %d round %d waiting (%d sends, answered %v, plan %+v): %w", e.name, i, round, sends, answered, p, err))
				return
			}
			if ev.c.Op != transport.OpRecv {
				sends--
				continue
			}
			if ev.tag != at || polled != nil {
				e.failed(fmt.Errorf("%s worker %d round %d: answer tagged %#x (plan %+v)", e.name, i, round, ev.tag, p))
				return
			}
			if err := e.repost(ev.recv, p.late, rng); err != nil {
				e.failed(fmt.Errorf("%s worker %d: PostRecv: %w", e.name, i, err))
				return
			}
			answered = true
		}
		if p.op == opPull || p.op == opPoll {
			if err := stressCheck(e.target.Bytes()[i*e.slot:i*e.slot+p.size], at); err != nil {
				e.failed(fmt.Errorf("%s worker %d round %d (plan %+v): pulled data: %w", e.name, i, round, p, err))
				return
			}
		}
		e.waiting.Add(-1)
		e.answered.Add(1)
		e.progress.Add(1)
		if rng.IntN(4) == 0 {
			// Think time: the link goes quiet, so whatever the last
			// request left undone is not rescued by the next one.
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		}
	}
}

func (e *stressEnd) post(wrs []transport.SendWR, chain bool) error {
	if chain || len(wrs) == 1 {
		return e.c.Post(wrs...)
	}
	for i := range wrs {
		if err := e.c.Post(wrs[i]); err != nil {
			return err
		}
	}
	return nil
}

// handler answers the peer's requests from its slot j until ctx ends.
func (e *stressEnd) handler(ctx context.Context, j int, rng *rand.Rand) {
	slot := e.depth + j
	wrs := make([]transport.SendWR, 3)
	sending := 0 // our previous answer's work requests not yet complete
	for round := 0; ; round++ {
		var ev stressEvent
		for {
			var err error
			if ev, err = e.await(ctx, slot, sending > 0, nil, rng); err != nil {
				return
			}
			if ev.c.Op == transport.OpRecv {
				break
			}
			sending--
		}
		want := tag(false, j, round)
		if ev.tag != want {
			e.failed(fmt.Errorf("%s handler %d round %d: request tagged %#x, want %#x", e.name, j, round, ev.tag, want))
			return
		}
		p := planFor(e.seed, e.depth, e.sendMax, 1-e.dir, j, round)
		msg := e.pool.buf(ev.recv)
		var err error
		switch p.op {
		case opSend:
			if ev.c.Len != stressHdr+p.size {
				err = fmt.Errorf("%d-byte request, want %d", ev.c.Len, stressHdr+p.size)
			} else {
				err = stressCheck(msg[stressHdr:stressHdr+p.size], want)
			}
		case opPushSend, opPushImm:
			if p.op == opPushImm && (!ev.c.HasImm || ev.c.Len != 0) {
				err = fmt.Errorf("push with immediate arrived as %+v", ev.c)
			} else {
				err = stressCheck(e.target.Bytes()[slot*e.slot:slot*e.slot+p.size], want)
			}
		}
		if err != nil {
			e.failed(fmt.Errorf("%s handler %d round %d (plan %+v): %w", e.name, j, round, p, err))
			return
		}
		raddr, rkey, saddr := binary.LittleEndian.Uint64(msg[8:]), binary.LittleEndian.Uint32(msg[16:]), binary.LittleEndian.Uint64(msg[24:])
		if !p.late {
			if err := e.repost(ev.recv, false, rng); err != nil {
				e.failed(fmt.Errorf("%s handler %d: PostRecv: %w", e.name, j, err))
				return
			}
		}
		// The answer's buffer is ours again once the previous answer
		// completed.
		for sending > 0 {
			ev, err := e.await(ctx, slot, true, nil, rng)
			if err != nil {
				return
			}
			if ev.c.Op == transport.OpRecv {
				e.failed(fmt.Errorf("%s handler %d: a request before the previous answer completed", e.name, j))
				return
			}
			sending--
		}
		if rng.IntN(8) == 0 {
			runtime.Gosched() // sometimes answer late, as a slow disk does
		}
		at := tag(true, j, round)
		ans := e.send.Bytes()[slot*e.slot:]
		binary.LittleEndian.PutUint32(ans, at)
		binary.LittleEndian.PutUint64(ans[8:], uint64(at)|1<<32) // the status word
		send := transport.SendWR{ID: idAns | uint64(j), Op: transport.OpSend, SGL: []transport.Segment{e.seg(e.send, slot, 0, stressHdr)}}
		if rng.IntN(2) == 0 {
			send.Imm, send.HasImm = at, true
		}
		wrs = append(wrs[:0], send)
		if p.op == opPull || p.op == opPoll {
			write := transport.SendWR{ID: idAns | uint64(j), Op: transport.OpWrite, RemoteAddr: raddr, RKey: rkey}
			if p.size > 0 {
				write.SGL = []transport.Segment{e.seg(e.send, slot, stressHdr, p.size)}
				stressFill(write.SGL[0].Bytes(), at)
			}
			switch {
			case p.op == opPoll:
				st := transport.SendWR{ID: idAns | uint64(j), Op: transport.OpWrite, RemoteAddr: saddr, RKey: rkey,
					SGL: []transport.Segment{e.seg(e.send, slot, 8, 8)}}
				wrs = append(wrs[:0], write, st)
			case p.immAns:
				write.Imm, write.HasImm = at, true
				wrs = append(wrs[:0], write)
			default:
				wrs = append(wrs[:0], write, send)
			}
		}
		if err := e.post(wrs, p.chain); err != nil {
			e.failed(fmt.Errorf("%s handler %d: %w", e.name, j, err))
			return
		}
		sending = len(wrs)
		if p.late {
			if err := e.repost(ev.recv, rng.IntN(2) == 0, rng); err != nil {
				e.failed(fmt.Errorf("%s handler %d: PostRecv: %w", e.name, j, err))
				return
			}
		}
	}
}
