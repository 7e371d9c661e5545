package server

import (
	"sync"
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

// lockedSRQ takes every receive under a lock of its own, as a provider's
// PostRecv does (softrdma's ring, verbs' free list before the post).
type lockedSRQ struct {
	mu   sync.Mutex
	ring [64]transport.RecvWR
	n    int
}

func (q *lockedSRQ) PostRecv(wrs ...transport.RecvWR) error {
	q.mu.Lock()
	for _, wr := range wrs {
		q.ring[q.n%len(q.ring)] = wr
		q.n++
	}
	q.mu.Unlock()
	return nil
}
func (*lockedSRQ) SetLimit(int) error            { return nil }
func (*lockedSRQ) LimitReached() <-chan struct{} { return nil }
func (*lockedSRQ) Close() error                  { return nil }

// BenchmarkRecvPoolTakeGive is the receive path's cost in the pool: a
// receive completion handed to its connection (take) and the buffer given
// back and posted again (give), from GOMAXPROCS goroutines at once (the
// reapers of connections sharing one queue), each on buffers of its own.
// The post is free (nop) or takes the provider's lock (locked).
func BenchmarkRecvPoolTakeGive(b *testing.B) {
	b.Run("nop", func(b *testing.B) { benchTakeGive(b, nopSRQ{}) })
	b.Run("locked", func(b *testing.B) { benchTakeGive(b, &lockedSRQ{}) })
}

func benchTakeGive(b *testing.B, srq transport.SRQ) {
	s := &Server{cfg: Config{MaxRecvBufferSize: 4096, MinCredits: 4}}
	p := newRecvPool(s, &gatedDomain{}, srq, nil)
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
