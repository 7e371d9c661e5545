package server

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/transport"
)

// nicSRQ is a shared receive queue as the NIC sees it: the ids posted and
// not yet consumed. A receive posted twice, or posted without a buffer, is
// an error.
type nicSRQ struct {
	mu     sync.Mutex
	posted map[uint64]transport.RecvWR
	errs   []string
}

func (q *nicSRQ) PostRecv(wrs ...transport.RecvWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, wr := range wrs {
		if _, dup := q.posted[wr.ID]; dup {
			q.errs = append(q.errs, "receive posted twice")
		}
		if wr.Buf.Region == nil {
			q.errs = append(q.errs, "receive posted without a buffer")
		}
		q.posted[wr.ID] = wr
	}
	return nil
}

// consume completes one posted receive, any; false when none is posted.
func (q *nicSRQ) consume() (uint64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for id := range q.posted {
		delete(q.posted, id)
		return id, true
	}
	return 0, false
}

func (q *nicSRQ) count() int                  { q.mu.Lock(); defer q.mu.Unlock(); return len(q.posted) }
func (*nicSRQ) SetLimit(int) error            { return nil }
func (*nicSRQ) LimitReached() <-chan struct{} { return nil }
func (*nicSRQ) Close() error                  { return nil }

// TestRecvPoolConcurrentTakeGive: connections sharing a queue take what
// completes and give it back from many goroutines while credits are
// granted and taken back and spares dropped. Every completed receive is
// found (take), none is posted twice or without its buffer, and at rest
// the pool's count agrees with what is posted.
func TestRecvPoolConcurrentTakeGive(t *testing.T) {
	s := &Server{cfg: Config{MaxRecvBufferSize: 4096, MinCredits: 4}, budget: protocol.NewCreditPool(48)}
	q := &nicSRQ{posted: map[uint64]transport.RecvWR{}}
	p := newRecvPool(s, &gatedDomain{}, q, nil)
	if err := p.addCredits(32); err != nil {
		t.Fatal(err)
	}
	stop := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for range 8 { // reapers
		wg.Go(func() {
			c := &conn{}
			for time.Now().Before(stop) {
				id, ok := q.consume()
				if !ok {
					time.Sleep(10 * time.Microsecond)
					continue
				}
				rb, ok := p.take(c, id)
				if !ok {
					t.Errorf("take %d: no posted buffer", id)
					return
				}
				if rand.IntN(4) == 0 {
					time.Sleep(time.Duration(rand.IntN(50)) * time.Microsecond)
				}
				if err := p.give(c, rb); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() { // the balancer
		for time.Now().Before(stop) {
			n := 1 + rand.IntN(8)
			if err := p.addCredits(n); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(100 * time.Microsecond)
			p.addCredits(-n)
			if rand.IntN(8) == 0 {
				p.dropSpares()
			}
		}
	})
	wg.Wait()
	q.mu.Lock()
	for _, e := range q.errs[:min(len(q.errs), 5)] {
		t.Error(e)
	}
	q.mu.Unlock()
	p.mu.Lock()
	live := p.live
	p.mu.Unlock()
	if got := q.count(); got != live {
		t.Errorf("%d receives posted at rest, the pool counts %d live", got, live)
	}
}
