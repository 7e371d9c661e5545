package server

import (
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// TestGrantWaitsForSlowRegistrations: fill counts a buffer live before it
// is registered and posted; a fill that found live at want returned while
// another fill was still registering, so a grant went out with fewer
// receives posted than could arrive. Two connections start AUTH with slow
// registrations, and an authenticated client is granted 4 credits
// meanwhile: addCredits (after which the grant is sent) must return only
// with 4 credits + 2 AUTHs + the headroom posted. (From the review of the
// shared receive queue: it returned with 5.)
func TestGrantWaitsForSlowRegistrations(t *testing.T) {
	s := &Server{cfg: Config{MaxRecvBufferSize: 4096}}
	g2, g3 := make(chan struct{}), make(chan struct{})
	dom := &gatedDomain{gate: map[int]chan struct{}{2: g2, 3: g3}, entered: make(chan int, 2)}
	srq := &countSRQ{}
	p := newRecvPool(s, dom, srq, nil)
	if err := p.fill(); err != nil { // the headroom
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 2 { // two connections accepted, their AUTH receives registering
		wg.Go(func() { p.authStart() })
	}
	<-dom.entered
	<-dom.entered
	posted := make(chan int, 1)
	wg.Go(func() {
		if err := p.addCredits(4); err != nil { // an authenticated client's grant
			t.Error(err)
		}
		posted <- srq.count() // the grant would go out now
	})
	// A fill that does not wait returns at once; give it the chance
	// before the registrations finish.
	time.Sleep(50 * time.Millisecond)
	close(g2)
	close(g3)
	wg.Wait()
	if got, need := <-posted, 4+2+srqHeadroom; got < need {
		t.Errorf("the grant of 4 credits went out with %d receives posted; 4 credits, 2 AUTHs and the headroom can arrive (%d)", got, need)
	}
}

// A registration that fails while another fill waits for it: the waiter
// makes up for it instead of returning short.
func TestFillMakesUpForAFailedRegistration(t *testing.T) {
	s := &Server{cfg: Config{MaxRecvBufferSize: 4096}}
	g := make(chan struct{})
	dom := &gatedDomain{gate: map[int]chan struct{}{1: g}, entered: make(chan int, 1), fail: map[int]bool{1: true}}
	srq := &countSRQ{}
	p := newRecvPool(s, dom, srq, nil)
	failed := make(chan error, 1)
	go func() { failed <- p.fill() }() // the headroom's registration, slow, then failing
	<-dom.entered
	done := make(chan error, 1)
	go func() { done <- p.addCredits(2) }()
	time.Sleep(20 * time.Millisecond)
	close(g)
	if err := <-failed; err == nil {
		t.Fatal("the gated registration did not fail")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, need := srq.count(), 2+srqHeadroom; got < need {
		t.Errorf("%d receives posted for 2 credits and the headroom (%d)", got, need)
	}
}

// fakeRegion, gatedDomain and countSRQ let a test drive a recvPool alone.
type fakeRegion struct{ b []byte }

func (r *fakeRegion) Bytes() []byte            { return r.b }
func (r *fakeRegion) Addr() uint64             { return 0 }
func (r *fakeRegion) Handle() uint32           { return 0 }
func (r *fakeRegion) Access() transport.Access { return transport.AccessLocal }
func (r *fakeRegion) Deregister() error        { return nil }

// gatedDomain's Alloc calls listed in gate (1-based) wait for their
// channel, a slow memory registration, and those in fail then fail.
type gatedDomain struct {
	mu      sync.Mutex
	n       int
	gate    map[int]chan struct{}
	fail    map[int]bool
	entered chan int
}

func (d *gatedDomain) Alloc(n int, _ transport.Access) (transport.Region, error) {
	d.mu.Lock()
	d.n++
	k := d.n
	g := d.gate[k]
	d.mu.Unlock()
	if g != nil {
		d.entered <- k
		<-g
	}
	if d.fail[k] {
		return nil, transport.ErrClosed
	}
	return &fakeRegion{b: make([]byte, n)}, nil
}

type countSRQ struct {
	mu     sync.Mutex
	posted int
}

func (q *countSRQ) PostRecv(wrs ...transport.RecvWR) error {
	q.mu.Lock()
	q.posted += len(wrs)
	q.mu.Unlock()
	return nil
}
func (q *countSRQ) SetLimit(int) error            { return nil }
func (q *countSRQ) LimitReached() <-chan struct{} { return nil }
func (q *countSRQ) Close() error                  { return nil }
func (q *countSRQ) count() int                    { q.mu.Lock(); defer q.mu.Unlock(); return q.posted }
