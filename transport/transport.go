// Package transport is a verbs-shaped RDMA provider interface and its providers.
//
// The interface models a NIC, not a socket: memory is registered in a Domain
// (a protection domain) and gets an address and an unguessable handle (rkey);
// a Conn is a reliable-connected queue pair with posted receives, SEND, RDMA
// WRITE and RDMA WRITE WITH IMMEDIATE; completions are reaped from a
// completion queue that can be polled without blocking or waited on.
//
// The package knows nothing of LWIO messages. Two providers implement it:
// the software provider ("softrdma", package transport/soft), which emulates
// a NIC over TCP faithfully enough that protocol code cannot cheat, and the
// verbs provider (package transport/verbs) over libibverbs and librdmacm.
// Both pass the conformance suite in transport/conformance.
package transport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/lwiofs/lwiofs/internal/enum"
)

// Access says what a registered region may be used for.
type Access uint32

const (
	// AccessLocal allows local use: the source of a SEND or RDMA WRITE and
	// the target of a posted receive. Every region has it.
	AccessLocal Access = 1 << iota
	// AccessRemoteWrite lets the peer place data into the region with RDMA
	// WRITE, naming it by Addr and Handle (IBV_ACCESS_REMOTE_WRITE).
	AccessRemoteWrite
)

// Region is registered memory (ibv_mr). Its bytes stay at a fixed place
// until Deregister; the peer names it by Addr and Handle.
type Region interface {
	// Bytes is the registered memory. It must not be used after Deregister.
	Bytes() []byte
	// Addr is the address a peer uses to target the region's first byte.
	Addr() uint64
	// Handle is the region's remote key (rkey). It is unguessable: a peer
	// cannot name a region it was not told about.
	Handle() uint32
	// Access is what the region was registered for.
	Access() Access
	// Deregister invalidates the handle at once: a remote write naming it
	// after Deregister returns fails with a remote-access error.
	Deregister() error
}

// Domain is a protection domain: the scope in which memory is registered and
// connections are made. Regions of one domain can be used with every Conn
// whose Domain it is.
type Domain interface {
	// Alloc allocates n bytes of memory owned by the provider and registers
	// them. Providers may round n up; Bytes has length n.
	Alloc(n int, access Access) (Region, error)
}

// Segment is a piece of a registered region: one scatter/gather entry.
type Segment struct {
	Region Region
	Offset int
	Length int
}

// Bytes returns the segment's memory.
func (s Segment) Bytes() []byte { return s.Region.Bytes()[s.Offset : s.Offset+s.Length] }

// Whole returns a segment covering all of r.
func Whole(r Region) Segment { return Segment{Region: r, Length: len(r.Bytes())} }

// Op is the kind of a work request or completion.
type Op uint8

const (
	// OpSend is a SEND; the peer receives it into a posted receive buffer.
	OpSend Op = iota + 1
	// OpWrite is an RDMA WRITE into the peer's registered memory; with
	// HasImm it is RDMA WRITE WITH IMMEDIATE and consumes a posted receive.
	OpWrite
	// OpRecv completes a posted receive: a SEND arrived (Len bytes) or an
	// RDMA WRITE WITH IMMEDIATE landed (Len 0, HasImm set).
	OpRecv
)

var opNames = [...]string{OpSend: "SEND", OpWrite: "RDMA_WRITE", OpRecv: "RECV"}

func (o Op) String() string { return enum.Name(opNames[:], o, "Op") }

// SendWR is a work request on the send queue (ibv_send_wr).
type SendWR struct {
	// ID is returned in the completion.
	ID uint64
	// Op is OpSend or OpWrite.
	Op Op
	// SGL is the gather list; its total is the message length.
	SGL []Segment
	// RemoteAddr and RKey name the target of an OpWrite.
	RemoteAddr uint64
	RKey       uint32
	// Imm is sent with the message when HasImm is set.
	Imm    uint32
	HasImm bool
	// Lend (OpSend) says the sender keeps the SGL's bytes unchanged and
	// registered after the send completes, until its own protocol says
	// the receiver is done with them: a provider that shares memory with
	// the peer may leave them there for the receiver to read (lend.go).
	Lend bool
}

// RecvWR is a work request on the receive queue (ibv_recv_wr).
type RecvWR struct {
	ID  uint64
	Buf Segment
}

// Status is a completion status (ibv_wc_status).
type Status uint8

const (
	StatusSuccess Status = iota
	// StatusLocalLength: the incoming SEND was longer than the posted buffer.
	StatusLocalLength
	// StatusLocalProtection: a local segment is not a live registered region.
	StatusLocalProtection
	// StatusRemoteAccess: a remote write named a bad handle, went out of
	// bounds, or targeted a region without remote-write access.
	StatusRemoteAccess
	// StatusRemoteInvalidRequest: the peer refused the request (e.g. its
	// receive buffer was too short for our SEND).
	StatusRemoteInvalidRequest
	// StatusRNRRetryExceeded: no receive was posted at the peer in time.
	StatusRNRRetryExceeded
	// StatusFlushed: the connection went to error or was closed before
	// the work request finished.
	StatusFlushed
	// StatusTransportError: the link failed (peer gone, reset).
	StatusTransportError
)

var statusNames = [...]string{
	StatusSuccess:              "success",
	StatusLocalLength:          "local length error",
	StatusLocalProtection:      "local protection error",
	StatusRemoteAccess:         "remote access error",
	StatusRemoteInvalidRequest: "remote invalid request",
	StatusRNRRetryExceeded:     "receiver not ready retry exceeded",
	StatusFlushed:              "work request flushed",
	StatusTransportError:       "transport error",
}

func (s Status) String() string { return enum.Name(statusNames[:], s, "Status") }

// Completion is one reaped work completion (ibv_wc).
type Completion struct {
	ID     uint64
	Op     Op
	Status Status
	// Conn is the connection the work request belongs to (ibv_wc's
	// qp_num): on a completion queue shared by several connections it
	// says whose completion this is; for a receive taken from a shared
	// receive queue, which connection the message came by.
	Conn Conn
	// Len is the number of bytes received (OpRecv of a SEND).
	Len int
	// Imm is the immediate data when HasImm is set.
	Imm    uint32
	HasImm bool
	// Lent (OpRecv of a SEND marked Lend) is the message's tail left in
	// the sender's memory; Len counts only the bytes before it, placed in
	// the buffer (lend.go, LentReader).
	Lent Lent
}

// Err returns nil for a successful completion, else a *CompletionError.
func (c Completion) Err() error {
	if c.Status == StatusSuccess {
		return nil
	}
	return &CompletionError{Op: c.Op, Status: c.Status}
}

// CompletionError is a failed work completion.
type CompletionError struct {
	Op     Op
	Status Status
}

func (e *CompletionError) Error() string { return fmt.Sprintf("%v: %v", e.Op, e.Status) }

// CQ is a completion queue. Completions of one connection arrive in the
// order their work requests were posted, per queue (send or receive).
type CQ interface {
	// Poll copies up to len(out) ready completions into out without
	// blocking and returns how many it copied.
	Poll(out []Completion) int
	// Wait blocks until at least one completion is ready (then behaves like
	// Poll), the context ends, or the queue is closed (ErrClosed) and drained.
	Wait(ctx context.Context, out []Completion) (int, error)
}

// Limits are what a connection was built with.
type Limits struct {
	SendQueueDepth int // most send work requests outstanding at once
	RecvQueueDepth int // most receives posted at once
	MaxSGE         int // most segments in one SendWR
	MaxMessageSize int // largest SEND or RDMA WRITE
}

// Conn is a reliable connected queue pair.
type Conn interface {
	// Post queues send work requests in order (a chain, as ibv_post_send).
	// It fails at once, posting none, if the queue would overflow or a
	// request is malformed; failures discovered later arrive as completions.
	// A chain a provider's device rejects part-way (verbs) may have been
	// posted in part: after an error for a chain the caller cannot reuse
	// its memory until the connection is closed.
	Post(wrs ...SendWR) error
	// PostRecv queues receive buffers. A connection that takes its
	// receives from a shared receive queue refuses it.
	PostRecv(wrs ...RecvWR) error
	// CQ is where this connection's send completions arrive, and its
	// receive completions unless Config.Queues named a RecvCQ: its own
	// completion queue, or the SendCQ Config.Queues named.
	CQ() CQ
	// Domain is the protection domain the connection's memory belongs to.
	Domain() Domain
	// Limits is what the connection was built with.
	Limits() Limits
	// LocalAddr and RemoteAddr name the two ends ("ip:port").
	LocalAddr() string
	RemoteAddr() string
	// Provider is the name of the provider carrying the connection.
	Provider() string
	// Close disconnects. Every outstanding work request completes with
	// StatusFlushed; Close does not wait for the peer.
	Close() error
}

// Carrier is implemented by a connection a provider runs over an
// operating-system socket (softrdma): Carrier names the socket's kind,
// "tcp" or, to a peer on the same host, "unix" ("unix+shm" when the
// dialer's registered memory is shared with the listener as well; "pipe"
// and "pipe+shm" when the frames go on two pipes, as by default).
type Carrier interface {
	Carrier() string
}

// CarrierOf is c's Carrier, or "" when it has none.
func CarrierOf(c Conn) string {
	if cr, ok := c.(Carrier); ok {
		return cr.Carrier()
	}
	return ""
}

// SharedMemory reports whether c's carrier shares the dialer's registered
// memory with the listener ("+shm"). It says nothing of sealing: a sealed
// connection keeps its carrier's name but moves nothing through the
// memory.
func SharedMemory(c Conn) bool { return strings.HasSuffix(CarrierOf(c), "+shm") }

// Listener accepts connections.
type Listener interface {
	Accept(ctx context.Context) (Conn, error)
	// Addr is the "ip:port" it listens on.
	Addr() string
	Close() error
}

// Config shapes a connection; the zero value picks the provider's defaults.
type Config struct {
	// SendQueueDepth and RecvQueueDepth: 0 means 256.
	SendQueueDepth int
	RecvQueueDepth int
	// MaxSGE: 0 means 16.
	MaxSGE int
	// MaxMessageSize: 0 means 16 MiB.
	MaxMessageSize int
	// Queues, when not nil, names shared queues for each connection (see
	// QueueChooser). Nil: every connection has its own completion queue
	// and receive queue.
	Queues QueueChooser
	// TakeLent says the user reads a receive's lent tail (Completion.Lent,
	// LentReader on Completion.Conn): a provider may then leave a lent
	// SEND's data in the sender's memory. Without it every SEND is placed
	// whole (lend.go).
	TakeLent bool
}

// WithDefaults returns c with zero fields replaced by the defaults.
func (c Config) WithDefaults() Config {
	c.SendQueueDepth = cmp.Or(c.SendQueueDepth, 256)
	c.RecvQueueDepth = cmp.Or(c.RecvQueueDepth, 256)
	c.MaxSGE = cmp.Or(c.MaxSGE, 16)
	c.MaxMessageSize = cmp.Or(c.MaxMessageSize, 16<<20)
	return c
}

// Instance is one way to reach a provider on a host: the pair the LWIO
// negotiate carries (HostAddressLen/DiscriminatorLen). For both providers
// the host address is an IPv4 (4 bytes) or IPv6 (16 bytes) address and the
// discriminator is a 2-byte big-endian port.
type Instance struct {
	HostAddress   []byte
	Discriminator []byte
}

// InstanceFor builds the Instance of an "ip:port" address.
func InstanceFor(addr string) (Instance, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return Instance{}, err
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return Instance{}, fmt.Errorf("transport: %q is not an IP address", host)
	}
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return Instance{}, fmt.Errorf("transport: bad port %q", port)
	}
	return Instance{HostAddress: []byte(ip), Discriminator: []byte{byte(p >> 8), byte(p)}}, nil
}

// Addr returns the "ip:port" the instance names.
func (in Instance) Addr() (string, error) {
	if (len(in.HostAddress) != 4 && len(in.HostAddress) != 16) || len(in.Discriminator) != 2 {
		return "", fmt.Errorf("transport: instance with %d-byte host address and %d-byte discriminator is not ip:port",
			len(in.HostAddress), len(in.Discriminator))
	}
	port := int(in.Discriminator[0])<<8 | int(in.Discriminator[1])
	return net.JoinHostPort(net.IP(in.HostAddress).String(), strconv.Itoa(port)), nil
}

func (in Instance) String() string {
	if a, err := in.Addr(); err == nil {
		return a
	}
	return fmt.Sprintf("%x/%x", in.HostAddress, in.Discriminator)
}

// Provider is one RDMA provider (a kind of NIC).
type Provider interface {
	// Name identifies the provider in the negotiate; both ends use the
	// same name for the same kind of provider.
	Name() string
	// Available reports nil if the provider can be used on this host, or
	// an error saying plainly why not.
	Available() error
	// Listen listens on addr ("ip:port"; port 0 picks one).
	Listen(addr string, cfg Config) (Listener, error)
	// Dial connects to addr.
	Dial(ctx context.Context, addr string, cfg Config) (Conn, error)
}

// ErrClosed is returned by operations on a closed connection, listener or
// completion queue.
var ErrClosed = errors.New("transport: closed")

// ErrQueueFull is returned by Post and PostRecv when the work queue is full.
var ErrQueueFull = errors.New("transport: work queue full")
