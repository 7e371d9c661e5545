// Package load runs many LWIO client engines with mixed, verified
// read/write workloads against one real server (package rig: the session
// channel and the LWIO engine on softrdma, in-process on 127.0.0.1), and
// measures the server's memory against a bound set by its credit budget.
// It also injects transport faults (soft.Faults) on the client side and
// checks that calls fail promptly and the server stays healthy.
//
//	go test -race -v ./test/load          # 32 clients, 15 s (LWIO_LOAD_DURATION=20s to change)
//	go test -race -v -short ./test/load   # 8 clients, 3 s
//
// docs/faults.md describes the cases and their figures.
package load

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/test/hostile/rig"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// figures collects the numbers the tests measured; TestMain prints them
// after the run.
var figures rig.Figures

func TestMain(m *testing.M) { figures.Main(m, "load figures:") }

// The server's shape for the load: small buffers so 32 clients fit a
// shared CI machine; the budget is exactly what the clients ask for, plus
// one connection's worth for a newcomer.
const (
	connsPerClient = 2
	creditsPerConn = 8
	maxRecv        = 64<<10 + 4096
	window         = 64 << 10
	jobsPerClient  = 4
	regionSize     = 256 << 10 // each job's own part of its client's file
	fileSize       = jobsPerClient * regionSize
)

func engineConfig(clients int) server.Config {
	return server.Config{
		Credits:           creditsPerConn,
		MaxCredits:        creditsPerConn,
		CreditBudget:      (clients*connsPerClient + 1) * creditsPerConn,
		MaxRecvBufferSize: maxRecv,
		MaxRdmaWindowSize: window,
	}
}

// serverBound is the memory the engine may register for conns
// connections under budget credits: a MaxRecvBufferSize receive per credit,
// read buffers of up to two windows per credit (power-of-two size classes,
// and a buffer stays with its slot until the peer acknowledged the data),
// and per connection 2×credits 128-byte slots. The receives come from one
// shared receive queue, which holds besides the credits' buffers one of
// headroom and those of up to 16 AUTHs at once (server/recvpool.go).
func serverBound(budget, conns int) int64 {
	const authAndHeadroom = 16 + 1
	return int64(budget+authAndHeadroom)*int64(maxRecv+2*window) + int64(conns)*int64(2*creditsPerConn*128)
}

// loadClient is one client engine with its session, file and jobs.
type loadClient struct {
	idx  int
	ss   *rig.Session
	cl   *client.Client
	f    *client.File
	path string
}

func newLoadClient(t *testing.T, s *rig.Server, idx int, p transport.Provider, mode client.Mode, flags uint32) *loadClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ss := s.TestSession(ctx, t)
	name := fmt.Sprintf("load-%d", idx)
	h, rk, err := ss.OpenKey(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ss.Tree.WriteAt(ctx, h, make([]byte, fileSize), 0); err != nil {
		t.Fatal(err)
	}
	cfg := ss.ClientConfig(p)
	cfg.Connections = connsPerClient
	cfg.Credits = creditsPerConn
	cfg.MaxCredits = creditsPerConn
	cfg.MaxIO = window
	cfg.Completion = mode
	cl, err := client.New(ctx, cfg)
	if err != nil {
		t.Fatalf("client %d: %v", idx, err)
	}
	t.Cleanup(func() { cl.Close() })
	f, err := cl.Register(ctx, rk, flags)
	if err != nil {
		t.Fatalf("client %d REGISTER: %v", idx, err)
	}
	return &loadClient{idx: idx, ss: ss, cl: cl, f: f, path: filepath.Join(s.Dir, name)}
}

// stats are a workload's counters.
type stats struct {
	ops, bytes, verifyErrs, callErrs atomic.Int64
	byKind                           [6]atomic.Int64
	maxLatency                       atomic.Int64
	firstErr                         atomic.Value
}

func (st *stats) err(format string, args ...any) {
	st.firstErr.CompareAndSwap(nil, fmt.Sprintf(format, args...))
}

func (st *stats) latency(d time.Duration) {
	for {
		cur := st.maxLatency.Load()
		if int64(d) <= cur || st.maxLatency.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

var kindNames = [6]string{"write", "read+verify", "writev", "readv+verify", "readbuf+verify", "collapsed writev"}

// job runs a mixed workload on its own region of the client's file until
// the deadline, keeping shadow (regionSize bytes: what the region must
// hold) up to date and verifying every read against it.
func job(c *loadClient, j int, until time.Time, st *stats, shadow []byte) {
	r := mrand.New(mrand.NewPCG(uint64(c.idx), uint64(j)^uint64(time.Now().UnixNano())))
	base := int64(j * regionSize)
	sizes := []int{512, 4096, 4096, 16384, 65536, 131072}
	// Buffers are reused so that the process heap measures the engines,
	// not this loop's garbage.
	scratch := make([]byte, 131072)
	pageBufs := make([][]byte, 32)
	for i := range pageBufs {
		pageBufs[i] = make([]byte, 4096)
	}
	seq := 0
	// call runs one request, f, that should move n bytes, and counts it;
	// false when it failed or came up short.
	call := func(kind int, n int, f func(ctx context.Context) (int, error)) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		got, err := f(ctx)
		st.latency(time.Since(start))
		if err == nil && got != n {
			err = fmt.Errorf("short: %d bytes of %d", got, n)
		}
		st.ops.Add(1)
		st.byKind[kind].Add(1)
		if err != nil {
			st.callErrs.Add(1)
			st.err("client %d job %d %s: %v", c.idx, j, kindNames[kind], err)
			return false
		}
		st.bytes.Add(int64(n))
		return true
	}
	for time.Now().Before(until) {
		seq++
		n := sizes[r.IntN(len(sizes))]
		off := r.IntN((regionSize-n)/512+1) * 512
		switch kind := r.IntN(6); kind {
		case 0: // WRITE
			data := scratch[:n]
			fillPattern(data, c.idx, j, seq)
			if call(kind, n, func(ctx context.Context) (int, error) {
				return c.f.WriteAt(ctx, data, base+int64(off))
			}) {
				copy(shadow[off:], data)
			}
		case 1: // READ and verify
			got := scratch[:n]
			if call(kind, n, func(ctx context.Context) (int, error) {
				return c.f.ReadAt(ctx, got, base+int64(off))
			}) && !bytes.Equal(got, shadow[off:off+n]) {
				st.verifyErrs.Add(1)
				st.err("client %d job %d: READ of %d at %d differs from what was written", c.idx, j, n, base+int64(off))
			}
		case 2, 5: // VEC_WRITE of 4 KiB pages, collapsed when all pages are equal
			np, off := pageSpan(n, off)
			pages := pageBufs[:np:np]
			if kind == 5 {
				one := pageBufs[0]
				fillPattern(one, c.idx, j, seq)
				pages = make([][]byte, np)
				for i := range pages {
					pages[i] = one
				}
			} else {
				for i := range pages {
					fillPattern(pages[i], c.idx, j, seq*1000+i)
				}
			}
			if call(kind, np*4096, func(ctx context.Context) (int, error) {
				return c.f.WriteV(ctx, pages, base+int64(off))
			}) {
				for i, p := range pages {
					copy(shadow[off+i*4096:], p)
				}
			}
		case 3: // VEC_READ of 4 KiB pages
			np, off := pageSpan(n, off)
			pages := pageBufs[:np:np]
			if call(kind, np*4096, func(ctx context.Context) (int, error) {
				return c.f.ReadV(ctx, pages, base+int64(off))
			}) {
				for i, p := range pages {
					if !bytes.Equal(p, shadow[off+i*4096:off+(i+1)*4096]) {
						st.verifyErrs.Add(1)
						st.err("client %d job %d: VEC_READ page %d at %d differs", c.idx, j, i, base+int64(off+i*4096))
						break
					}
				}
			}
		case 4: // zero-copy READ into a pooled registered buffer
			n = min(n, c.cl.MaxRead())
			var buf client.Buffer
			if call(kind, n, func(ctx context.Context) (int, error) {
				var err error
				if buf, err = c.f.ReadBuf(ctx, make([]byte, n), base+int64(off)); err != nil {
					return 0, err
				}
				return len(buf.Bytes()), nil
			}) {
				if !bytes.Equal(buf.Bytes(), shadow[off:off+n]) {
					st.verifyErrs.Add(1)
					st.err("client %d job %d: ReadBuf of %d at %d differs", c.idx, j, n, base+int64(off))
				}
			}
			if buf != nil {
				buf.Release()
			}
		}
	}
}

// pageSpan is a vectored request's 4 KiB pages for about n bytes at off:
// how many, and off rounded down to a page and kept within the region.
func pageSpan(n, off int) (pages, pageOff int) {
	pages = max(n/4096, 1)
	pageOff = min(off&^4095, regionSize-pages*4096)
	return pages, pageOff
}

// fillPattern fills b with bytes no other (client, job, seq) produces at
// the same place.
func fillPattern(b []byte, client, job, seq int) {
	x := uint64(client)<<48 ^ uint64(job)<<40 ^ uint64(seq)*0x9E3779B97F4A7C15
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

// memSampler records the process's peak heap while the load runs.
type memSampler struct {
	peakHeap, peakSys atomic.Uint64
	stop              chan struct{}
	done              sync.WaitGroup
}

func sampleMemory(every time.Duration) *memSampler {
	m := &memSampler{stop: make(chan struct{})}
	m.done.Add(1)
	go func() {
		defer m.done.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > m.peakHeap.Load() {
				m.peakHeap.Store(ms.HeapInuse)
			}
			if ms.Sys > m.peakSys.Load() {
				m.peakSys.Store(ms.Sys)
			}
			select {
			case <-m.stop:
				return
			case <-time.After(every):
			}
		}
	}()
	return m
}

func (m *memSampler) finish() {
	close(m.stop)
	m.done.Wait()
}

const mib = 1 << 20

// TestLoad runs 32 client engines (8 with -short), each with 2
// connections and 4 jobs of mixed WRITE, READ, VEC_WRITE (plain and
// collapsed), VEC_READ and ReadBuf, half in interrupt and half in polling
// mode, for 15 s (3 s with -short; LWIO_LOAD_DURATION sets it), verifying every read against what was
// written and, at the end, every job's region and the files on disk.
func TestLoad(t *testing.T) {
	clients, dur := 32, 15*time.Second
	if testing.Short() {
		clients, dur = 8, 3*time.Second
	}
	if d, err := time.ParseDuration(os.Getenv("LWIO_LOAD_DURATION")); err == nil && d > 0 {
		dur = d
	}
	ec := engineConfig(clients)
	s := rig.Start(t, rig.Options{Engine: ec})
	clientRegions := &rig.RegionLog{}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	cs := make([]*loadClient, clients)
	for i := range cs {
		mode := client.Interrupt
		if i%2 == 1 {
			mode = client.Polling
		}
		var flags uint32
		if i%4 < 2 {
			flags = protocol.FileNoIntermediateBuffering
		}
		cs[i] = newLoadClient(t, s, i, rig.Counted(soft.New(soft.Options{}), clientRegions), mode, flags)
	}
	conns := s.Engine.NumConns()
	if conns != clients*connsPerClient {
		t.Fatalf("%d server connections, want %d", conns, clients*connsPerClient)
	}
	serverAtStart, clientAtStart := s.Regions.Count(), clientRegions.Count()
	serverBytesAtStart, clientBytesAtStart := s.Regions.Bytes(), clientRegions.Bytes()
	var st stats
	mem := sampleMemory(20 * time.Millisecond)
	until := time.Now().Add(dur)
	start := time.Now()
	shadows := make([][][]byte, clients)
	var wg sync.WaitGroup
	for i, c := range cs {
		shadows[i] = make([][]byte, jobsPerClient)
		for j := 0; j < jobsPerClient; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				shadows[i][j] = make([]byte, regionSize)
				job(c, j, until, &st, shadows[i][j])
			}()
		}
	}
	// A newcomer during the load is served too.
	checkDuring := s.Check(t)
	wg.Wait()
	elapsed := time.Since(start)
	mem.finish()

	// Final verification: each region through LWIO, and the files on disk.
	finalErrs := 0
	for i, c := range cs {
		disk, err := os.ReadFile(c.path)
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < jobsPerClient; j++ {
			want := shadows[i][j]
			got := make([]byte, regionSize)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			n, err := c.f.ReadAt(ctx, got, int64(j*regionSize))
			cancel()
			if err != nil || n != regionSize || !bytes.Equal(got, want) {
				finalErrs++
				t.Errorf("client %d job %d: final read of the region differs (%d, %v)", i, j, n, err)
			}
			if !bytes.Equal(disk[j*regionSize:(j+1)*regionSize], want) {
				finalErrs++
				t.Errorf("client %d job %d: the file on disk differs from what was acknowledged", i, j)
			}
		}
	}
	if v := st.verifyErrs.Load(); v != 0 {
		t.Errorf("%d verification errors; first: %v", v, st.firstErr.Load())
	}
	if e := st.callErrs.Load(); e != 0 {
		t.Errorf("%d failed calls; first: %v", e, st.firstErr.Load())
	}

	budget := ec.CreditBudget
	bound := serverBound(budget, conns)
	registered := s.Regions.Bytes()
	if registered > bound {
		t.Errorf("server registered %d bytes, over the bound %d", registered, bound)
	}
	if s.Regions.RemoteWritable() != 0 {
		t.Errorf("server registered %d remote-writable regions", s.Regions.RemoteWritable())
	}
	// The whole process (server, clients, their shadows and the Go
	// runtime): what may be live — the server bound, what the clients
	// registered, the shadows — doubled, as GOGC=100 lets garbage reach
	// the live heap before a collection, plus 64 MiB for everything else.
	shadowBytes := int64(clients * fileSize)
	heapBound := 2*(bound+clientRegions.Bytes()+shadowBytes) + 64*mib
	heapGrowth := int64(mem.peakHeap.Load()) - int64(before.HeapInuse)
	if heapGrowth > heapBound {
		t.Errorf("process heap grew by %d bytes under load, over %d", heapGrowth, heapBound)
	}
	var kinds string
	for k, name := range kindNames {
		kinds += fmt.Sprintf(" %s %d,", name, st.byKind[k].Load())
	}
	figures.Add(t, "%d clients × %d connections × %d jobs, %v: %d ops (%s) %.1f MiB moved (%.1f MiB/s), max call latency %v, %d verification errors, %d final-check errors, %d failed calls; newcomer served during the load in %v",
		clients, connsPerClient, jobsPerClient, elapsed.Round(time.Millisecond), st.ops.Load(), kinds[1:len(kinds)-1],
		float64(st.bytes.Load())/mib, float64(st.bytes.Load())/mib/elapsed.Seconds(), time.Duration(st.maxLatency.Load()).Round(time.Millisecond),
		st.verifyErrs.Load(), finalErrs, st.callErrs.Load(), checkDuring.Round(time.Millisecond))
	figures.Add(t, "server memory: %.1f MiB registered in %d regions over the run (0 remote-writable) ≤ bound %.1f MiB = budget %d credits × (MaxRecvBufferSize %d + 2 × window %d) + %d conns × %d B",
		float64(registered)/mib, s.Regions.Count(), float64(bound)/mib, budget, maxRecv, window, conns, 1024+2*creditsPerConn*128)
	figures.Add(t, "registrations during the load (after every client was set up): server %d regions (%.1f MiB), clients %d regions (%.1f MiB)",
		s.Regions.Count()-serverAtStart, float64(s.Regions.Bytes()-serverBytesAtStart)/mib,
		clientRegions.Count()-clientAtStart, float64(clientRegions.Bytes()-clientBytesAtStart)/mib)
	figures.Add(t, "process heap (server + %d clients + test): in use %.1f MiB before, peak %.1f MiB (growth %.1f MiB ≤ %.1f MiB = 2 × (server bound + clients' %.1f MiB registered + %.1f MiB shadows) + 64 MiB); peak Sys %.1f MiB",
		clients, float64(before.HeapInuse)/mib, float64(mem.peakHeap.Load())/mib, float64(heapGrowth)/mib, float64(heapBound)/mib,
		float64(clientRegions.Bytes())/mib, float64(shadowBytes)/mib, float64(mem.peakSys.Load())/mib)
}
