package server

import (
	"sync/atomic"
	"testing"

	"github.com/lwiofs/lwiofs/transport"
)

// nopSRQ takes every receive and does nothing: the benchmark measures the
// pool, not a provider.
type nopSRQ struct{}

func (nopSRQ) PostRecv(...transport.RecvWR) error { return nil }
func (nopSRQ) SetLimit(int) error                 { return nil }
func (nopSRQ) LimitReached() <-chan struct{}      { return nil }
func (nopSRQ) Close() error                       { return nil }

// BenchmarkRecvPoolTakeGive is the receive path's cost in the pool: a
// receive completion handed to its connection (take) and the buffer given
// back and posted again (give), from GOMAXPROCS goroutines at once (the
// reapers of connections sharing one queue), each on buffers of its own.
func BenchmarkRecvPoolTakeGive(b *testing.B) {
	s := &Server{cfg: Config{MaxRecvBufferSize: 4096, MinCredits: 4}}
	p := newRecvPool(s, &gatedDomain{}, nopSRQ{}, nil)
	const credits = 256
	if err := p.addCredits(credits); err != nil {
		b.Fatal(err)
	}
	var next atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		c := &conn{}
		base := next.Add(16) - 16 // 16 buffers of this goroutine's own
		i := uint64(0)
		for pb.Next() {
			id := base + i%16
			i++
			rb, ok := p.take(c, id)
			if !ok {
				b.Fatalf("take %d failed", id)
			}
			if err := p.give(c, rb); err != nil {
				b.Fatal(err)
			}
		}
	})
}
