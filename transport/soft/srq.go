package soft

import (
	"errors"
	"fmt"
	"sync"

	"github.com/lwiofs/lwiofs/transport"
)

// srq is a shared receive queue (QueueDomain.CreateSRQ): one ring of posted
// receives that the receive engines of every connection using it take
// from, in posting order. A SEND that finds it empty waits, in its
// connection's reader goroutine, for PostRecv (receiver-not-ready), as on
// a connection's own queue.
type srq struct {
	pd *domain

	mu         sync.Mutex
	ring       []transport.RecvWR
	head, tail uint64
	limit      int // armed low watermark; 0: disarmed
	users      transport.SRQUsers
	// waiters are reader goroutines waiting for a receive; posted is
	// closed (and replaced) when receives are posted while some wait.
	waiters int
	posted  chan struct{}

	event chan struct{} // LimitReached (one slot)
}

var _ transport.SRQ = (*srq)(nil)

// CreateSRQ makes a shared receive queue in this domain.
func (d *domain) CreateSRQ(cfg transport.SRQConfig) (transport.SRQ, error) {
	depth, err := cfg.QueueDepth()
	if err != nil {
		return nil, fmt.Errorf("softrdma: %w", err)
	}
	return &srq{pd: d, ring: make([]transport.RecvWR, depth), posted: make(chan struct{}), event: make(chan struct{}, 1)}, nil
}

// CreateCQ makes a completion queue connections of this domain may share.
// It grows as needed (softrdma does not emulate CQ overflow), so depth is
// only checked.
func (d *domain) CreateCQ(depth int) (transport.SharedCQ, error) {
	if depth < 0 {
		return nil, fmt.Errorf("softrdma: CQ depth %d", depth)
	}
	return newCQ(d, nil), nil
}

func (s *srq) PostRecv(wrs ...transport.RecvWR) error {
	if err := s.pd.localRecvs(wrs); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users.Closed() {
		return transport.ErrClosed
	}
	if !fits(s.head, s.tail, len(s.ring), len(wrs)) {
		return transport.ErrQueueFull
	}
	for _, wr := range wrs {
		s.ring[s.tail%uint64(len(s.ring))] = wr
		s.tail++
	}
	if s.waiters > 0 && len(wrs) > 0 {
		close(s.posted)
		s.posted = make(chan struct{})
	}
	return nil
}

func (s *srq) SetLimit(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.users.CheckLimit(n, len(s.ring)); err != nil {
		return fmt.Errorf("softrdma: %w", err)
	}
	s.limit = n
	return nil
}

func (s *srq) LimitReached() <-chan struct{} { return s.event }

func (s *srq) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.users.Close(func() error {
		clear(s.ring)
		s.head = s.tail
		return nil
	})
}

func (s *srq) attach() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users.Attach() != nil {
		return errors.New("softrdma: shared receive queue is closed")
	}
	return nil
}

func (s *srq) detach() {
	s.mu.Lock()
	s.users.Detach()
	s.mu.Unlock()
}

// take pops the next receive; when there is none it returns a channel
// closed when one is posted, and the caller must call unwait after.
func (s *srq) take() (wr transport.RecvWR, ok bool, posted <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head == s.tail {
		s.waiters++
		return wr, false, s.posted
	}
	i := s.head % uint64(len(s.ring))
	wr = s.ring[i]
	s.ring[i] = transport.RecvWR{}
	s.head++
	if s.limit > 0 && s.tail-s.head < uint64(s.limit) {
		// IBV_EVENT_SRQ_LIMIT_REACHED, and the limit disarms.
		s.limit = 0
		signal(s.event)
	}
	return wr, true, nil
}

func (s *srq) unwait() {
	s.mu.Lock()
	s.waiters--
	s.mu.Unlock()
}

// tryTake pops the next receive without registering as a waiter.
func (s *srq) tryTake() (transport.RecvWR, bool) {
	wr, ok, _ := s.take()
	if !ok {
		s.unwait()
	}
	return wr, ok
}
