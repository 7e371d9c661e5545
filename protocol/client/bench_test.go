package client

import (
	"context"
	"fmt"
	mrand "math/rand"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// The benchmarks put the engines (server files on tmpfs when /dev/shm
// exists) next to the soft provider's raw RDMA WRITE throughput in the same
// run; docs/engine.md records the figures. Each warms every connection's
// send queues first, so -benchmem shows the steady state: 0 allocs/op.
//
//	go test -run '^$' -bench . -benchmem -benchtime 2s ./protocol/client/

const benchFileSize = 64 << 20

// benchEnv is a server and a client over the soft provider with one file.
func benchEnv(b testing.TB, mode Mode, conns int) (*Client, *File) {
	return benchEnvWith(b, server.Config{}, mode, conns)
}

// benchEnvWith is benchEnv with the server configured by cfg.
func benchEnvWith(b testing.TB, scfg server.Config, mode Mode, conns int) (*Client, *File) {
	b.Helper()
	e := newEnv(b, scfg)
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, err := os.MkdirTemp("/dev/shm", "lwio-bench")
		if err == nil {
			e.dir = dir
			b.Cleanup(func() { os.RemoveAll(dir) })
		}
	}
	s := e.session()
	cfg := s.config(mode)
	cfg.Connections = conns
	cl := s.client(b, cfg)
	content := make([]byte, benchFileSize)
	mrand.New(mrand.NewSource(1)).Read(content)
	f := s.newFile(b, cl, "bench", content)
	warmRings(b, cl, f) // so that -benchmem counts steady state
	return cl, f
}

// run spreads b.N operations over depth goroutines.
func run(b *testing.B, depth int, op func(rng *mrand.Rand, i int) error) {
	b.ResetTimer()
	spread(b, b.N, depth, op)
}

// spread runs op for i in [0, n) on depth goroutines, each with its own
// seeded rng, taking the next i as it finishes one; the first error op
// returns on a goroutine fails tb and stops that goroutine.
func spread(tb testing.TB, n, depth int, op func(rng *mrand.Rand, i int) error) {
	var mu sync.Mutex
	next := 0
	var wg sync.WaitGroup
	for w := 0; w < depth; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewSource(int64(w)))
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				if err := op(rng, i); err != nil {
					tb.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkSeqRead1MiB: 1 MiB sequential reads, 8 outstanding, zero-copy
// (ReadBuf, what the FUSE layer uses) and copying (ReadAt), beside the raw
// provider moving the same bytes by RDMA WRITE.
func BenchmarkSeqRead1MiB(b *testing.B) {
	const size, depth = 1 << 20, 8
	b.Run("rawRDMAWrite", func(b *testing.B) { benchRawWrite(b, size, depth) })
	for _, mode := range modes {
		b.Run("ReadBuf/"+mode.String(), func(b *testing.B) {
			_, f := benchEnv(b, mode, 0)
			ctx := context.Background()
			b.SetBytes(size)
			dest := make([]byte, size) // not written: the data lands in registered memory
			run(b, depth, func(_ *mrand.Rand, i int) error {
				buf, err := f.ReadBuf(ctx, dest, int64(i%(benchFileSize/size))*size)
				if err == nil {
					buf.Release()
				}
				return err
			})
		})
		b.Run("ReadAt/"+mode.String(), func(b *testing.B) {
			_, f := benchEnv(b, mode, 0)
			ctx := context.Background()
			b.SetBytes(size)
			bufs := make(chan []byte, depth)
			for i := 0; i < depth; i++ {
				bufs <- make([]byte, size)
			}
			run(b, depth, func(_ *mrand.Rand, i int) error {
				p := <-bufs
				defer func() { bufs <- p }()
				_, err := f.ReadAt(ctx, p, int64(i%(benchFileSize/size))*size)
				return err
			})
		})
	}
}

// BenchmarkSeqWrite1MiB: 1 MiB sequential writes, 8 outstanding.
func BenchmarkSeqWrite1MiB(b *testing.B) {
	const size, depth = 1 << 20, 8
	b.Run("rawRDMAWrite", func(b *testing.B) { benchRawWrite(b, size, depth) })
	for _, mode := range modes {
		b.Run(mode.String(), func(b *testing.B) {
			_, f := benchEnv(b, mode, 0)
			ctx := context.Background()
			data := testutil.RandBytes(size)
			b.SetBytes(size)
			run(b, depth, func(_ *mrand.Rand, i int) error {
				_, err := f.WriteAt(ctx, data, int64(i%(benchFileSize/size))*size)
				return err
			})
		})
	}
}

// BenchmarkWrite1MiBFragments: 1 MiB writes one at a time (the mount's
// O_DIRECT qd1), fragmented into the default 128 KiB receive buffers and,
// beside it, unfragmented (1 MiB receive buffers): what fragmenting costs.
func BenchmarkWrite1MiBFragments(b *testing.B) {
	const size = 1 << 20
	for _, c := range []struct {
		name string
		cfg  server.Config
	}{
		{"fragmented", server.Config{}},
		{"whole", server.Config{MaxRecvBufferSize: size + 64, MaxBufferMemory: 1 << 30}},
	} {
		b.Run(c.name, func(b *testing.B) {
			_, f := benchEnvWith(b, c.cfg, Interrupt, 0)
			ctx := context.Background()
			data := testutil.RandBytes(size)
			b.SetBytes(size)
			run(b, 1, func(_ *mrand.Rand, i int) error {
				_, err := f.WriteAt(ctx, data, int64(i%(benchFileSize/size))*size)
				return err
			})
		})
	}
}

// BenchmarkRandRead4KiB: 4 KiB random reads at 1 and 32 outstanding; ns/op
// at depth 1 is the latency, ops/s the IOPS.
func BenchmarkRandRead4KiB(b *testing.B) {
	benchRand4KiB(b, func(f *File, depth int) func(context.Context, int64) error {
		bufs := make(chan []byte, depth)
		for i := 0; i < depth; i++ {
			bufs <- make([]byte, 4096)
		}
		return func(ctx context.Context, off int64) error {
			p := <-bufs
			defer func() { bufs <- p }()
			_, err := f.ReadAt(ctx, p, off)
			return err
		}
	})
}

// BenchmarkRandWrite4KiB: 4 KiB random writes at 1 and 32 outstanding.
func BenchmarkRandWrite4KiB(b *testing.B) {
	benchRand4KiB(b, func(f *File, _ int) func(context.Context, int64) error {
		data := testutil.RandBytes(4096)
		return func(ctx context.Context, off int64) error {
			_, err := f.WriteAt(ctx, data, off)
			return err
		}
	})
}

// benchRand4KiB runs, in each mode at 1 and 32 outstanding, the 4 KiB
// operation newOp makes for the file and the depth, at random 4 KiB-aligned
// offsets, and reports the IOPS.
func benchRand4KiB(b *testing.B, newOp func(f *File, depth int) func(ctx context.Context, off int64) error) {
	const size = 4096
	for _, mode := range modes {
		for _, depth := range []int{1, 32} {
			b.Run(fmt.Sprintf("%s/qd%d", mode, depth), func(b *testing.B) {
				_, f := benchEnv(b, mode, 0)
				ctx := context.Background()
				op := newOp(f, depth)
				b.SetBytes(size)
				start := time.Now()
				run(b, depth, func(rng *mrand.Rand, _ int) error {
					return op(ctx, int64(rng.Intn(benchFileSize/size))*size)
				})
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "IOPS")
			})
		}
	}
}

// benchRawWrite is the soft provider alone: RDMA WRITEs of size bytes with
// depth outstanding, the transfer a READ's data makes.
func benchRawWrite(b *testing.B, size, depth int) {
	srvP, cliP := soft.New(soft.Options{}), soft.New(soft.Options{})
	l, err := srvP.Listen("127.0.0.1:0", transport.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	cli, srv := conformance.Connect(b, cliP, l, l.Addr(), transport.Config{}, 10*time.Second)
	ctx := context.Background()
	src, err := srv.Domain().Alloc(size, transport.AccessLocal)
	if err != nil {
		b.Fatal(err)
	}
	dst, err := cli.Domain().Alloc(size*depth, transport.AccessLocal|transport.AccessRemoteWrite)
	if err != nil {
		b.Fatal(err)
	}
	comps := make([]transport.Completion, 64)
	wrs := []transport.SendWR{{Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(src)}, RKey: dst.Handle()}}
	b.SetBytes(int64(size))
	b.ResetTimer()
	posted, done := 0, 0
	for done < b.N {
		for posted < b.N && posted-done < depth {
			wrs[0].ID = uint64(posted)
			wrs[0].RemoteAddr = dst.Addr() + uint64((posted%depth)*size)
			if err := srv.Post(wrs...); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		done += len(conformance.WaitOK(ctx, b, srv, comps))
	}
}
