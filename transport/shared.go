package transport

import "errors"

// Completion queues and receive queues shared by several connections (issue
// 16 item 2, issue 20 item 2): a server runs one completion queue per CPU
// and handles each completion where it was issued (seed 003), and keeps one
// pool of posted receive buffers for every client instead of a queue per
// connection. The shapes are verbs': ibv_create_cq and ibv_create_srq on a
// device, the queue pair created naming its send CQ, receive CQ and SRQ.

// QueueDomain is a protection domain that also makes queues several
// connections may share. Both providers' domains are QueueDomains (a
// Domain of theirs can be asserted to one); the interface stands apart from
// Domain so that a Domain wrapper or test double needs only Alloc.
type QueueDomain interface {
	Domain
	// CreateCQ creates a completion queue several connections of this
	// domain may share (ibv_create_cq), named by Config.Queues. depth is
	// the most completions it must hold unreaped; 0 means 4096.
	CreateCQ(depth int) (SharedCQ, error)
	// CreateSRQ creates a receive queue several connections of this
	// domain may take their receives from (ibv_create_srq), named by
	// Config.Queues.
	CreateSRQ(cfg SRQConfig) (SRQ, error)
}

// Queues names the shared queues a connection uses (ibv_qp_init_attr's
// send_cq, recv_cq and srq). Each must come from the connection's Domain.
type Queues struct {
	// SendCQ receives the connection's send completions; nil: a
	// completion queue of the connection's own (Conn.CQ).
	SendCQ SharedCQ
	// RecvCQ receives its receive completions; nil: wherever its send
	// completions go.
	RecvCQ SharedCQ
	// SRQ is where its receives come from; nil: a receive queue of its
	// own, filled with Conn.PostRecv.
	SRQ SRQ
}

// QueueChooser picks a connection's shared queues (Config.Queues). The
// provider calls ChooseQueues as it creates the connection's queue pair —
// for Dial once it knows the device that reaches the peer, for a listener
// once per incoming connection — with that device's protection domain:
// the place to create per-device completion queues and receive queues on
// first use and to spread connections over them (one CQ per CPU). An
// error refuses the connection. Calls may come from several goroutines
// at once. Implement it on a pointer type: Config stays comparable.
type QueueChooser interface {
	ChooseQueues(d QueueDomain) (Queues, error)
}

// SharedCQ is a completion queue made by QueueDomain.CreateCQ. Completions of
// one connection keep their order per queue (send or receive); those of
// different connections interleave, and Completion.Conn tells them apart.
// When a connection using it closes or fails, its flushed work requests
// complete here like any other; the queue itself stays open.
type SharedCQ interface {
	CQ
	// Close destroys the queue (ibv_destroy_cq). Every connection using
	// it must be closed first (ErrInUse otherwise); completions not yet
	// reaped are dropped, and Wait then returns ErrClosed.
	Close() error
}

// SRQConfig shapes a shared receive queue (ibv_srq_init_attr).
type SRQConfig struct {
	// Depth is the most receives posted at once (max_wr); 0 means 4096.
	Depth int
}

// SRQ is a shared receive queue made by QueueDomain.CreateSRQ: one pool of
// posted receive buffers from which every connection using it takes the
// next one, in posting order, for each SEND or RDMA WRITE WITH IMMEDIATE
// it receives. The completion goes to that connection's receive CQ and
// names it (Completion.Conn). A SEND that finds the queue empty is
// receiver-not-ready, as on a connection's own queue: it waits the
// initiator's RNR time for a receive to be posted here, then fails. When
// a connection closes, receives still in the queue are not flushed: they
// stay for the others.
type SRQ interface {
	// PostRecv queues receive buffers (ibv_post_srq_recv). It fails at
	// once, posting none, if they would not fit (ErrQueueFull) or a
	// buffer is not registered memory of the queue's domain.
	PostRecv(wrs ...RecvWR) error
	// SetLimit arms the low-watermark event (ibv_modify_srq srq_limit):
	// when a connection takes a receive and fewer than n remain posted,
	// LimitReached is signalled and the limit disarms, as
	// IBV_EVENT_SRQ_LIMIT_REACHED does; the owner replenishes and arms it
	// again. 0 disarms.
	SetLimit(n int) error
	// LimitReached is signalled (one pending signal at most) each time
	// an armed limit is crossed.
	LimitReached() <-chan struct{}
	// Close destroys the queue (ibv_destroy_srq). Every connection using
	// it must be closed first (ErrInUse otherwise); receives still posted
	// are dropped without completions, so their buffers are the
	// caller's again.
	Close() error
}

// ErrInUse is returned by SharedCQ.Close and SRQ.Close while a connection
// still uses the queue.
var ErrInUse = errors.New("transport: queue in use by a connection")
