package soft

import (
	"context"
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
// starts fresh connections with random parameters (TCP or the same-host
// unix socket, with or without shared memory, among them), runs them for a
// moment,
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
	var iters, reqs, srvCQ, srvSRQ, cliCQ int64
	for time.Since(start) < total {
		iters++
		n, sh, err := stressIteration(t, rng)
		reqs += n
		if err != nil {
			t.Fatalf("iteration %d failed after %v of stress (%d requests answered before): %v",
				iters, time.Since(start).Round(time.Millisecond), reqs, err)
		}
		for _, c := range []struct {
			on bool
			n  *int64
		}{{sh.srvCQ, &srvCQ}, {sh.srvSRQ, &srvSRQ}, {sh.cliCQ, &cliCQ}} {
			if c.on {
				*c.n++
			}
		}
	}
	t.Logf("%d iterations (%d with the server's connections sharing a CQ, %d an SRQ, %d with the client's sharing a CQ), %d requests answered in %v",
		iters, srvCQ, srvSRQ, cliCQ, reqs, time.Since(start).Round(time.Millisecond))
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

// planFor is what request (dir, slot, round) does; sendMax bounds a SEND.
func planFor(seed uint64, depth, sendMax, dir, slot, round int) stressPlan {
	h := mix(seed ^ uint64(dir)<<60 ^ uint64(slot)<<40 ^ uint64(round))
	p := stressPlan{op: int(h % numOps), immAns: h>>8&1 == 1, chain: h>>9&1 == 1, late: h>>10&7 == 0}
	limit := stressSlot(depth)
	if p.op == opSend {
		limit = sendMax
	}
	sizes := stressSizes
	for sizes[len(sizes)-1] > limit-stressHdr {
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

// stressIteration runs one set of connections and reports the requests
// answered and the queues shared.
func stressIteration(t *testing.T, rng *rand.Rand) (answered int64, sh *stressSharing, err error) {
	var logBuf lockedBuffer
	log := logrus.New()
	log.SetOutput(&logBuf)
	log.SetLevel(logrus.DebugLevel)
	// A quarter of the iterations on TCP, the rest on the same-host unix
	// socket: without shared memory, with it, and with it for every WRITE
	// and SEND segment whatever its size.
	carrier := rng.IntN(4)
	opts := Options{RNRTimeout: 2 * time.Second, Logger: log, TCPOnly: carrier == 0, NoSharedMemory: carrier == 1}
	cp, sp := New(opts), New(opts)
	if rng.IntN(4) == 0 {
		sp = cp // one provider, one domain: a server talking to itself
	}
	if carrier == 3 {
		cp.shmMinCopy, cp.shmMinRef, sp.shmMinCopy, sp.shmMinRef = 1, 1, 1, 1
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
	// Sometimes the server ends share one completion queue, or one shared
	// receive queue, and the client ends one completion queue: as an
	// engine with a CQ per CPU and one pool of receives would.
	sh = &stressSharing{srvCQ: rng.IntN(3) == 0, srvSRQ: rng.IntN(3) == 0, cliCQ: rng.IntN(4) == 0}
	sh.srv.cq, sh.srv.srq, sh.cli.cq = sh.srvCQ, sh.srvSRQ, sh.cliCQ
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
		sh.free()
	}()
	seed := rng.Uint64()
	pairDepths := make([]int, npairs)
	sendMax := stressMax
	for k := range pairDepths {
		pairDepths[k] = depths[rng.IntN(len(depths))]
		sendMax = min(sendMax, stressSlot(pairDepths[k]))
	}
	var srvQ, cliQ *stressQueue // the shared queues' reaping, if any
	for k, depth := range pairDepths {
		cfg := transport.Config{SendQueueDepth: 5*depth + 8, RecvQueueDepth: 2*depth + 8}
		lcfg, dcfg := cfg, cfg
		if sh.srvCQ || sh.srvSRQ {
			lcfg.Queues = &sh.srv
		}
		if sh.cliCQ {
			dcfg.Queues = &sh.cli
		}
		cli, srv, err := stressConnect(cp, sp, dcfg, lcfg)
		if err != nil {
			return 0, sh, err
		}
		conns = append(conns, cli, srv)
		ms := [2]stressMode{stressMode(rng.IntN(int(numModes))), stressMode(rng.IntN(int(numModes)))}
		max := stressSlot(depth)
		if sh.srvSRQ {
			max = sendMax // one pool: one buffer size for every SEND
		}
		for side, c := range []transport.Conn{cli, srv} {
			e, err := newStressEnd(fmt.Sprintf("pair%d/%s", k, [2]string{"client", "server"}[side]), c, depth, max, seed+uint64(k), side, &progress, failed)
			if e != nil {
				ends = append(ends, e)
			}
			if err != nil {
				return 0, sh, err
			}
			shared := [2]**stressQueue{&cliQ, &srvQ}[side]
			if c.CQ() == transport.CQ(sh.queues(side).SendCQ) {
				if *shared == nil {
					*shared = newStressQueue(c.CQ(), ms[side], &progress, failed)
				}
				e.q = *shared
			} else {
				e.q = newStressQueue(c.CQ(), ms[side], &progress, failed)
			}
			e.q.ends[c] = e
			if side == 1 && sh.srvSRQ {
				if sh.pool == nil {
					n := 0
					for _, d := range pairDepths {
						n += 2 * d
					}
					if sh.pool, err = newStressPool(c.Domain(), n, sendMax, sh.srv.made.SRQ, nil); err != nil {
						return 0, sh, err
					}
				}
				e.pool = sh.pool
			} else {
				if e.pool, err = newStressPool(c.Domain(), 2*depth, max, nil, c); err != nil {
					return 0, sh, err
				}
				e.ownPool = true
			}
		}
		a, b := ends[len(ends)-2], ends[len(ends)-1]
		a.peer, b.peer = b, a
		desc = append(desc, fmt.Sprintf("pair%d depth %d %v/%v", k, depth, a.q.mode, b.q.mode))
	}
	desc = append(desc, sh.String())
	var workers, others sync.WaitGroup
	var stop atomic.Bool
	queues := map[*stressQueue]bool{}
	for _, e := range ends {
		if e.ownPool {
			for r := 0; r < 2*e.depth; r++ {
				if err := e.pool.post(r); err != nil {
					return 0, sh, err
				}
			}
		}
		queues[e.q] = true
		for i := 0; i < e.depth; i++ {
			r1, r2 := rand.New(rand.NewPCG(rng.Uint64(), 1)), rand.New(rand.NewPCG(rng.Uint64(), 2))
			workers.Go(func() { e.worker(ctx, &stop, i, r1) })
			others.Go(func() { e.handler(ctx, i, r2) })
		}
	}
	if sh.pool != nil {
		for r := 0; r < len(sh.pool.region.Bytes())/sh.pool.size; r++ {
			if err := sh.pool.post(r); err != nil {
				return 0, sh, err
			}
		}
	}
	// A reapOne reaper waits with no deadline until its queue closes; the
	// end context only frees it if a shared queue failed to close.
	end, endReap := context.WithCancel(context.Background())
	defer endReap()
	for q := range queues {
		others.Go(func() { q.reap(ctx, end) })
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
	// The shared queues close once no connection uses them; a reaper
	// waiting on one then returns.
	if err := sh.close(); err != nil && stallErr == nil && firstErr == nil {
		firstErr = err
	}
	<-done
	endReap()
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
	return total, sh, stallErr
}

// stressSharing is an iteration's shared queues.
type stressSharing struct {
	srvCQ, srvSRQ, cliCQ bool
	srv, cli             stressChooser
	pool                 *stressPool // the receive buffers of the server's SRQ
}

func (s *stressSharing) String() string {
	return fmt.Sprintf("shared: server CQ %v, server SRQ %v, client CQ %v", s.srvCQ, s.srvSRQ, s.cliCQ)
}

func (s *stressSharing) queues(side int) transport.Queues {
	if side == 0 {
		return s.cli.made
	}
	return s.srv.made
}

// close closes the shared queues; every connection must be closed.
func (s *stressSharing) close() error {
	for _, c := range []*stressChooser{&s.srv, &s.cli} {
		if q := c.made.SendCQ; q != nil {
			if err := q.Close(); err != nil {
				return fmt.Errorf("closing a shared CQ after every connection closed: %w", err)
			}
		}
		if q := c.made.SRQ; q != nil {
			if err := q.Close(); err != nil {
				return fmt.Errorf("closing an SRQ after every connection closed: %w", err)
			}
		}
	}
	return nil
}

func (s *stressSharing) free() {
	if s.pool != nil {
		_ = s.pool.region.Deregister()
	}
}

// stressChooser makes one side's shared queues on first use.
type stressChooser struct {
	cq, srq bool
	mu      sync.Mutex
	made    transport.Queues
}

func (c *stressChooser) ChooseQueues(d transport.QueueDomain) (transport.Queues, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	if c.cq && c.made.SendCQ == nil {
		if c.made.SendCQ, err = d.CreateCQ(0); err != nil {
			return c.made, err
		}
	}
	if c.srq && c.made.SRQ == nil {
		if c.made.SRQ, err = d.CreateSRQ(transport.SRQConfig{}); err != nil {
			return c.made, err
		}
	}
	return c.made, nil
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
func stressConnect(cp, sp *Provider, dcfg, lcfg transport.Config) (cli, srv transport.Conn, err error) {
	ln, err := sp.Listen("127.0.0.1:0", lcfg)
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
	if cli, err = cp.Dial(ctx, ln.Addr(), dcfg); err != nil {
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
			e.name, e.q.mode, e.depth, e.answered.Load(), e.waiting.Load(), e.q.role.Load(), e.q.owed.Load(), e.c.(*conn).debugState())
	}
	buf := make([]byte, 4<<20)
	b.Write(buf[:runtime.Stack(buf, true)])
	return b.String()
}
