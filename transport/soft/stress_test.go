package soft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/transport"
)

// TestStress hunts lost wakeups (issue 16): connections carrying
// request/response traffic both ways at once — SENDs, RDMA WRITEs followed
// by a SEND, RDMA WRITEs WITH IMMEDIATE, answers by RDMA WRITE alone that
// the requester finds by polling memory (polling mode), sizes from 0 bytes
// to 1 MiB, queue depths 1 to 32, receives sometimes reposted late (a SEND
// then waits for one, receiver-not-ready) — with the completion queues
// reaped the ways the engines reap them: one goroutine in CQ.Wait with no
// deadline (the server), whoever waits for something taking the reaper
// role with a short deadline (the client), a polling loop. Each iteration
// starts fresh connections with random parameters, runs them for a moment,
// then lets every request finish and closes.
//
// A watchdog fails the test, with every goroutine's stack and every
// connection's state, when an iteration makes no progress for stressStall:
// a request whose answer never comes is the hang fio saw through the mount.
//
// Under `make test` it runs for stressDefault; LWIOFS_SOFT_STRESS=10m (any
// duration) runs it longer, LWIOFS_SOFT_STRESS_SEED=N repeats a run's
// choices (not its timing).
func TestStress(t *testing.T) {
	total := stressDefault
	if testing.Short() {
		total = stressDefault / 3
	}
	if s := os.Getenv("LWIOFS_SOFT_STRESS"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("LWIOFS_SOFT_STRESS=%q: %v", s, err)
		}
		total = d
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("LWIOFS_SOFT_STRESS_SEED"); s != "" {
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatalf("LWIOFS_SOFT_STRESS_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d, running %v", seed, total)
	rng := rand.New(rand.NewPCG(seed, 0x16))
	start := time.Now()
	var iters, reqs int64
	for time.Since(start) < total {
		iters++
		n, err := stressIteration(t, rng)
		reqs += n
		if err != nil {
			t.Fatalf("iteration %d failed after %v of stress (%d requests answered before): %v",
				iters, time.Since(start).Round(time.Millisecond), reqs, err)
		}
	}
	t.Logf("%d iterations, %d requests answered in %v", iters, reqs, time.Since(start).Round(time.Millisecond))
}

const (
	stressDefault = 3 * time.Second
	// stressStall is how long an iteration may make no progress at all.
	// It is below the providers' TransportTimeout, so a stall shows as a
	// stall, not as a connection the timeout has already failed.
	stressStall = 5 * time.Second
	stressHdr   = 32      // message header, at the start of every SEND
	stressMax   = 1 << 20 // largest message, at depth 4 or less
	stressMem   = 4 << 20 // a deeper end's slots share this much
)

// stressSlot is the size of one buffer slot at depth: 1 MiB, or less at
// greater depths so an iteration's memory stays bounded.
func stressSlot(depth int) int { return min(stressMax, stressMem/depth) }

// stressMode is how one end reaps its completion queue.
type stressMode int

const (
	reapOne  stressMode = iota // one goroutine in CQ.Wait(Background): the server engine
	reapLead                   // waiters take the reaper role with short deadlines: the client engine
	reapPoll                   // a goroutine polls
	numModes
)

func (m stressMode) String() string { return [...]string{"reaper", "lead", "poll"}[m] }

// The kinds of work a request asks for. Each end knows, from the seed,
// what every (direction, slot, round) is: the plan.
const (
	opSend     = iota // request: SEND with payload; answer: SEND
	opPull            // request: SEND naming a region; answer: WRITE into it + SEND, or WRITE WITH IMMEDIATE
	opPushSend        // request: WRITE into the peer's region + SEND; answer: SEND
	opPushImm         // request: WRITE WITH IMMEDIATE into the peer's region; answer: SEND
	opPoll            // request: SEND naming a region; answer: WRITE into it + WRITE of a status word, no completion
	numOps
)

var stressSizes = []int{0, 1, 31, 64, 200, 4096, 16<<10 - 1, 16 << 10, 40 << 10, 128<<10 + 3, 512 << 10, 1<<20 - stressHdr}

type stressPlan struct {
	op, size int
	immAns   bool // opPull: answered by one WRITE WITH IMMEDIATE
	chain    bool // two work requests posted in one call
	late     bool // the receive is reposted after the answer, sometimes after a pause
}

func planFor(seed uint64, depth, dir, slot, round int) stressPlan {
	h := mix(seed ^ uint64(dir)<<60 ^ uint64(slot)<<40 ^ uint64(round))
	p := stressPlan{op: int(h % numOps), immAns: h>>8&1 == 1, chain: h>>9&1 == 1, late: h>>10&7 == 0}
	sizes := stressSizes
	for sizes[len(sizes)-1] > stressSlot(depth)-stressHdr {
		sizes = sizes[:len(sizes)-1]
	}
	// Small messages most of the time, as the engines send them.
	if h>>16%4 != 0 {
		sizes = sizes[:5]
	}
	p.size = sizes[h>>20%uint64(len(sizes))]
	return p
}

func mix(x uint64) uint64 { // splitmix64
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// tag names one message: answer or request, slot, round.
func tag(answer bool, slot, round int) uint32 {
	t := uint32(slot&0x7fff)<<16 | uint32(round&0xffff)
	if answer {
		t |= 1 << 31
	}
	return t
}

func stressByte(t uint32, i int) byte { return byte(t) ^ byte(t>>16) ^ byte(i*7) ^ byte(i>>9) }

func stressFill(b []byte, t uint32) {
	for i := range b {
		b[i] = stressByte(t, i)
	}
}

// stressCheck compares b with what stressFill(t) wrote: every byte of
// small payloads, a sample of large ones. It reads memory a peer may have
// written with no completion in between (polling mode), so the race
// detector must not look (as protocol/client's pollIOS).
//
//go:norace
//go:noinline
func stressCheck(b []byte, t uint32) error {
	step := 1
	if len(b) > 64<<10 {
		step = 509
	}
	for i := 0; i < len(b); i += step {
		if b[i] != stressByte(t, i) {
			return fmt.Errorf("byte %d of %d is %#x, want %#x (tag %#x)", i, len(b), b[i], stressByte(t, i), t)
		}
	}
	if i := len(b) - 1; i >= 0 && b[i] != stressByte(t, i) {
		return fmt.Errorf("last byte of %d differs (tag %#x)", len(b), t)
	}
	return nil
}

// statusWord reads and writes a polling-mode status word.
//
//go:norace
//go:noinline
func statusWord(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

//go:norace
//go:noinline
func clearStatus(b []byte) {
	for i := range 8 {
		b[i] = 0
	}
}

// Work request IDs: the kind in the top byte, the slot below.
const (
	idReq  = 1 << 56 // our request's work requests, slot i
	idAns  = 2 << 56 // our answer's work requests, peer slot j
	idRecv = 3 << 56 // a posted receive, buffer r
	idKind = 0xff << 56
)

// stressEvent is a completion routed to the goroutine it concerns.
type stressEvent struct {
	c    transport.Completion
	recv int    // receive buffer index (OpRecv)
	tag  uint32 // OpRecv: the message's tag
}

// stressEnd is one end of a connection in the stress test: depth worker
// goroutines issue requests, depth handler goroutines answer the peer's.
type stressEnd struct {
	name  string
	c     transport.Conn
	mode  stressMode
	depth int
	slot  int // bytes per buffer slot (stressSlot)
	seed  uint64
	dir   int // which direction this end's requests go: 0 or 1
	peer  *stressEnd

	send   transport.Region // 2*depth slots: requests [0,depth), answers [depth,2depth)
	recv   transport.Region // 2*depth receive buffers of one slot
	target transport.Region // remote-writable: [0,depth) our pulls land, [depth,2depth) the peer's pushes; then depth status words

	inbox []chan stressEvent // [0,depth) workers, [depth,2depth) handlers
	role  atomic.Bool        // reapLead: someone is reaping
	owed  atomic.Int64       // reapLead: completions a worker or handler waits for
	kick  chan struct{}

	progress *atomic.Int64
	answered atomic.Int64
	waiting  atomic.Int64 // workers with a request in flight
	failed   func(error)
}

func newStressEnd(name string, c transport.Conn, mode stressMode, depth int, seed uint64, dir int, progress *atomic.Int64, failed func(error)) (*stressEnd, error) {
	e := &stressEnd{name: name, c: c, mode: mode, depth: depth, slot: stressSlot(depth), seed: seed, dir: dir,
		progress: progress, failed: failed, kick: make(chan struct{}, 1)}
	var err error
	if e.send, err = c.Domain().Alloc(2*depth*e.slot, transport.AccessLocal); err != nil {
		return e, err
	}
	if e.recv, err = c.Domain().Alloc(2*depth*e.slot, transport.AccessLocal); err != nil {
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
	for _, r := range []transport.Region{e.send, e.recv, e.target} {
		if r != nil {
			_ = r.Deregister()
		}
	}
}

func (e *stressEnd) seg(r transport.Region, slot, off, n int) transport.Segment {
	return transport.Segment{Region: r, Offset: slot*e.slot + off, Length: n}
}

func (e *stressEnd) status(i int) []byte {
	off := 2*e.depth*e.slot + 8*i
	return e.target.Bytes()[off : off+8]
}

func (e *stressEnd) recvWR(r int) transport.RecvWR {
	return transport.RecvWR{ID: idRecv | uint64(r), Buf: e.seg(e.recv, r, 0, e.slot)}
}

// repost gives receive buffer r back, at once or after a pause.
func (e *stressEnd) repost(r int, pause bool, rng *rand.Rand) error {
	if pause {
		time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
	}
	return e.c.PostRecv(e.recvWR(r))
}

// dispatch routes completions to the inboxes.
func (e *stressEnd) dispatch(cs []transport.Completion) {
	for _, c := range cs {
		e.progress.Add(1)
		if c.Status != transport.StatusSuccess {
			e.failed(fmt.Errorf("%s: completion %#x %v: %v", e.name, c.ID, c.Op, c.Status))
			continue
		}
		slot := int(c.ID &^ idKind)
		ev := stressEvent{c: c}
		switch c.ID & idKind {
		case idReq:
		case idAns:
			slot += e.depth
		case idRecv:
			ev.recv = slot
			if c.HasImm && c.Len == 0 {
				ev.tag = c.Imm
			} else if c.Len >= stressHdr {
				ev.tag = binary.LittleEndian.Uint32(e.recv.Bytes()[slot*e.slot:])
			} else {
				e.failed(fmt.Errorf("%s: %d-byte message without immediate", e.name, c.Len))
				continue
			}
			slot = int(ev.tag >> 16 & 0x7fff)
			if ev.tag>>31 == 0 { // a request: its handler
				slot += e.depth
			}
		}
		if slot >= len(e.inbox) {
			e.failed(fmt.Errorf("%s: completion %+v for slot %d", e.name, c, slot))
			continue
		}
		e.inbox[slot] <- ev
	}
}

// errPolled: await found its memory condition true rather than an event.
var errPolled = errors.New("polled")

// await returns the next event for slot, reaping as the end's mode says,
// or errPolled as soon as polled (if not nil) reports true: an answer by
// RDMA WRITE alone produces no completion, so a polling requester looks at
// memory between waits. owed says an event is owed (an answer, a send
// completion) rather than unsolicited (the peer's next request): only
// owed events keep a reapLead end's background reaper waiting, as in the
// client engine.
func (e *stressEnd) await(ctx context.Context, slot int, owed bool, polled func() bool, rng *rand.Rand) (stressEvent, error) {
	ch := e.inbox[slot]
	if owed && e.mode == reapLead {
		e.owed.Add(1)
		defer e.owed.Add(-1)
	}
	var buf [16]transport.Completion
	for {
		select {
		case ev := <-ch:
			return ev, nil
		default:
		}
		if polled != nil && polled() {
			return stressEvent{}, errPolled
		}
		if ctx.Err() != nil {
			return stressEvent{}, ctx.Err()
		}
		if e.mode != reapLead || !e.role.CompareAndSwap(false, true) {
			// Follow: a reaper dispatches to us; look at memory now and
			// then, and for a leader that left.
			var after <-chan time.Time
			if polled != nil || e.mode == reapLead {
				after = time.After(time.Duration(50+rng.IntN(2000)) * time.Microsecond)
			}
			select {
			case ev := <-ch:
				return ev, nil
			case <-ctx.Done():
				return stressEvent{}, ctx.Err()
			case <-after:
			}
			continue
		}
		// Lead: reap until our own event is there, each Wait with a
		// deadline picked at random (interrupted waits are the point).
		var err error
		for len(ch) == 0 && (polled == nil || !polled()) && ctx.Err() == nil && err == nil {
			wctx, cancel := ctx, context.CancelFunc(func() {})
			switch rng.IntN(4) {
			case 1:
				wctx, cancel = context.WithTimeout(ctx, 50*time.Microsecond)
			case 2:
				wctx, cancel = context.WithTimeout(ctx, time.Millisecond)
			case 3:
				wctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
			default:
				if polled != nil { // a polling requester always bounds its wait
					wctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
				}
			}
			var n int
			n, err = e.c.CQ().Wait(wctx, buf[:])
			cancel()
			e.dispatch(buf[:n])
			if err != nil && wctx.Err() != nil && ctx.Err() == nil {
				err = nil // our deadline, not the end
			}
		}
		e.role.Store(false)
		if e.owed.Load() > 0 {
			signal(e.kick)
		}
		if err != nil {
			return stressEvent{}, err
		}
	}
}

// background is a reapLead end's background reaper: it takes the role
// when events are owed and nobody leads, keeps it while they are, and
// polls now and then when none are, as the client engine's does.
func (e *stressEnd) background(ctx context.Context) {
	var buf [64]transport.Completion
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		if e.role.CompareAndSwap(false, true) {
			for ctx.Err() == nil {
				var n int
				var err error
				if e.owed.Load() > 0 {
					n, err = e.c.CQ().Wait(ctx, buf[:])
				} else {
					n = e.c.CQ().Poll(buf[:])
				}
				e.dispatch(buf[:n])
				if err != nil {
					e.role.Store(false)
					return
				}
				if n == 0 && e.owed.Load() == 0 {
					break
				}
			}
			e.role.Store(false)
		}
		select {
		case <-e.kick:
		case <-tick.C:
		case <-ctx.Done():
		}
	}
}

// reaper is the reapOne and reapPoll ends' completion loop.
func (e *stressEnd) reaper(ctx context.Context) {
	var buf [64]transport.Completion
	for ctx.Err() == nil {
		var n int
		var err error
		if e.mode == reapOne {
			n, err = e.c.CQ().Wait(context.Background(), buf[:])
		} else if n = e.c.CQ().Poll(buf[:]); n == 0 {
			time.Sleep(20 * time.Microsecond)
		}
		e.dispatch(buf[:n])
		if err != nil {
			return
		}
	}
}

// worker issues requests from slot i until stop, then returns once its
// last one is answered.
func (e *stressEnd) worker(ctx context.Context, stop *atomic.Bool, i int, rng *rand.Rand) {
	wrs := make([]transport.SendWR, 2)
	for round := 0; !stop.Load(); round++ {
		p := planFor(e.seed, e.depth, e.dir, i, round)
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
		p := planFor(e.seed, e.depth, 1-e.dir, j, round)
		msg := e.recv.Bytes()[ev.recv*e.slot:]
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

// stressIteration runs one set of connections and reports the requests
// answered.
func stressIteration(t *testing.T, rng *rand.Rand) (int64, error) {
	var logBuf lockedBuffer
	log := logrus.New()
	log.SetOutput(&logBuf)
	log.SetLevel(logrus.DebugLevel)
	opts := Options{RNRTimeout: 2 * time.Second, Logger: log}
	cp, sp := New(opts), New(opts)
	if rng.IntN(4) == 0 {
		sp = cp // one provider, one domain: a server talking to itself
	}
	depths := []int{1, 2, 4, 16, 32}
	npairs := 1 + rng.IntN(3)
	var progress atomic.Int64
	var closing atomic.Bool
	var errOnce sync.Once
	var firstErr error
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	failed := func(err error) {
		if closing.Load() {
			return // flushed work after the iteration ended
		}
		errOnce.Do(func() { firstErr = err })
		cancel()
	}
	var ends []*stressEnd
	var conns []transport.Conn
	var desc []string
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
		for _, e := range ends {
			e.free()
		}
	}()
	seed := rng.Uint64()
	for k := 0; k < npairs; k++ {
		depth := depths[rng.IntN(len(depths))]
		cfg := transport.Config{SendQueueDepth: 5*depth + 8, RecvQueueDepth: 2*depth + 8}
		cli, srv, err := stressConnect(cp, sp, cfg)
		if err != nil {
			return 0, err
		}
		conns = append(conns, cli, srv)
		ms := [2]stressMode{stressMode(rng.IntN(int(numModes))), stressMode(rng.IntN(int(numModes)))}
		for side, c := range []transport.Conn{cli, srv} {
			e, err := newStressEnd(fmt.Sprintf("pair%d/%s", k, [2]string{"client", "server"}[side]), c, ms[side], depth, seed+uint64(k), side, &progress, failed)
			if e != nil {
				ends = append(ends, e)
			}
			if err != nil {
				return 0, err
			}
		}
		a, b := ends[len(ends)-2], ends[len(ends)-1]
		a.peer, b.peer = b, a
		desc = append(desc, fmt.Sprintf("pair%d depth %d %v/%v", k, depth, ms[0], ms[1]))
	}
	var workers, others sync.WaitGroup
	var stop atomic.Bool
	for _, e := range ends {
		for r := 0; r < 2*e.depth; r++ {
			if err := e.c.PostRecv(e.recvWR(r)); err != nil {
				return 0, err
			}
		}
		if e.mode == reapLead {
			others.Go(func() { e.background(ctx) })
		} else {
			others.Go(func() { e.reaper(ctx) })
		}
		for i := 0; i < e.depth; i++ {
			r1, r2 := rand.New(rand.NewPCG(rng.Uint64(), 1)), rand.New(rand.NewPCG(rng.Uint64(), 2))
			workers.Go(func() { e.worker(ctx, &stop, i, r1) })
			others.Go(func() { e.handler(ctx, i, r2) })
		}
	}
	done := make(chan struct{})
	go func() { workers.Wait(); close(done) }()
	stopAt := time.After(time.Duration(20+rng.IntN(300)) * time.Millisecond)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last, lastAt := progress.Load(), time.Now()
	var stallErr error
wait:
	for {
		select {
		case <-done:
			break wait
		case <-stopAt:
			stop.Store(true)
		case <-tick.C:
			if p := progress.Load(); p != last {
				last, lastAt = p, time.Now()
			} else if time.Since(lastAt) > stressStall {
				stallErr = fmt.Errorf("stalled: nothing completed for %v (%s)", stressStall, strings.Join(desc, "; "))
				t.Logf("STALL: nothing completed for %v; state:\n%s", stressStall, stressDump(ends))
				break wait
			}
		}
	}
	closing.Store(true)
	stop.Store(true)
	cancel() // handlers and reapers leave; a stalled worker too
	for _, c := range conns {
		_ = c.Close()
	}
	<-done
	others.Wait()
	var total int64
	for _, e := range ends {
		total += e.answered.Load()
	}
	if stallErr == nil && firstErr != nil {
		stallErr = fmt.Errorf("%w (%s)", firstErr, strings.Join(desc, "; "))
	}
	if stallErr != nil {
		t.Logf("the providers' log:\n%s", logBuf.String())
	}
	return total, stallErr
}

// lockedBuffer collects a log written from many goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// stressConnect connects a client of cp to a fresh listener of sp.
func stressConnect(cp, sp *Provider, cfg transport.Config) (cli, srv transport.Conn, err error) {
	ln, err := sp.Listen("127.0.0.1:0", cfg)
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch := make(chan transport.Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		ch <- c
	}()
	if cli, err = cp.Dial(ctx, ln.Addr(), cfg); err != nil {
		<-ch
		return nil, nil, err
	}
	if srv = <-ch; srv == nil {
		_ = cli.Close()
		return nil, nil, errors.New("accept failed")
	}
	return cli, srv, nil
}

// stressDump is the watchdog's report: each end's view, each connection's
// internal state, and every goroutine.
func stressDump(ends []*stressEnd) string {
	var b strings.Builder
	for _, e := range ends {
		fmt.Fprintf(&b, "%s (%v, depth %d): %d answered, %d workers waiting, role %v, owed %d\n  %s\n",
			e.name, e.mode, e.depth, e.answered.Load(), e.waiting.Load(), e.role.Load(), e.owed.Load(), e.c.(*conn).debugState())
	}
	buf := make([]byte, 4<<20)
	b.Write(buf[:runtime.Stack(buf, true)])
	return b.String()
}
