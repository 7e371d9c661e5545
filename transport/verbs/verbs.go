// Package verbs is the verbs provider ("verbs"): the transport interface over
// libibverbs and librdmacm through cgo.
//
// Addressing and connection set-up go through rdma_cm (rdma_resolve_addr,
// rdma_resolve_route, rdma_connect / rdma_listen, rdma_accept) on one event
// channel per listener and per connection; a connection is an RC queue pair
// whose send and receive queues share one completion queue with a
// completion channel, or report to completion queues several connections
// share and take receives from a shared receive queue (QueueDomain.CreateCQ,
// QueueDomain.CreateSRQ, Config.Queues). Each device context gets one protection
// domain, the transport.Domain of every connection on that device;
// Domain.Alloc registers (ibv_reg_mr) page-aligned memory mapped by the
// provider, never Go heap. Post and PostRecv turn a batch into one chain of work requests
// and post it with one cgo call; Poll reaps completions in batches of up to
// 64 per cgo call; Wait blocks on the completion channel through Go's
// poller, so no OS thread is parked in C.
//
// The libraries are loaded at run time (dlopen of libibverbs.so.1 and
// librdmacm.so.1): a binary built with verbs support starts on a host
// without rdma-core's runtime libraries, and Available says why verbs is not
// usable there. Building needs the headers (libibverbs-dev, librdmacm-dev)
// and cgo; with CGO_ENABLED=0, on other systems, or with the build tag
// noverbs, a stub is built whose Available reports that.
//
// See docs/verbs.md for how the provider is tested over Soft-RoCE.
package verbs

import (
	"time"

	"github.com/sirupsen/logrus"
)

// Name is the provider's name in the negotiate.
const Name = "verbs"

// Options shape the provider; the zero value is usable.
type Options struct {
	// Logger receives connection set-up and teardown events; nil is quiet.
	Logger logrus.FieldLogger
	// ConnectTimeout bounds each step of connection set-up (address and
	// route resolution, establishment); 0 means 10 s.
	ConnectTimeout time.Duration
	// RNRRetry is how many times a SEND (or WRITE WITH IMMEDIATE) that finds
	// no receive posted at the peer is retried before it fails with
	// StatusRNRRetryExceeded; 0 means 6, the most that is still bounded
	// (7 means "forever" to the hardware and is refused).
	RNRRetry int
	// MinRNRTimer is the IB-encoded receiver-not-ready NAK timer this end's
	// queue pairs ask senders to wait before retrying; 0 means 28
	// (163.84 ms), so with RNRRetry 6 a SEND without a receive fails after
	// about one second.
	MinRNRTimer int
	// Retry is how many times a lost packet is retransmitted before the
	// connection fails with StatusTransportError; 0 means 4.
	Retry int
}

func (o Options) withDefaults() Options {
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.RNRRetry == 0 || o.RNRRetry > 6 {
		o.RNRRetry = 6
	}
	if o.MinRNRTimer == 0 || o.MinRNRTimer > 31 {
		o.MinRNRTimer = 28
	}
	if o.Retry == 0 || o.Retry > 7 {
		o.Retry = 4
	}
	return o
}
