package transport

// Lending a SEND's bytes (docs/transport.md, "SEND data lent"): a sender
// that keeps a SEND's data unchanged and registered after the send
// completes, until its own protocol says the receiver is done with it
// (the LWIO client keeps a WRITE's buffer until the server answers), may
// mark the SEND lent (SendWR.Lend). A provider that shares memory with
// the peer (softrdma on the same host) may then leave the message's tail
// in the sender's memory: the receive completes with the bytes before it
// placed (Completion.Len) and a descriptor of the tail (Completion.Lent).
// The receiver reads the tail where it is (PinLent), or has it placed
// behind the rest in the receive buffer (PlaceLent), as an ordinary SEND
// would have been. Providers that do not share memory ignore the mark,
// and a receiver whose user did not ask for lent tails (Config.TakeLent)
// gets every SEND placed whole.
//
// It is about memory, not messages: the capability knows nothing of what
// the bytes are.

// Lent names the tail of a received message that stayed in the sender's
// memory: Length bytes at Addr of the sender's region Handle. Zero Length:
// nothing was lent, the whole message is in the receive buffer.
type Lent struct {
	Handle uint32
	Addr   uint64
	Length int
}

// LentReader is implemented by a connection whose receives may complete
// with a lent tail (the completion's Conn: a wrapper of the connection
// need not forward it). A completion carrying one has placed only Len bytes:
// the receive buffer past them holds whatever it held before (on a shared
// receive queue, another connection's message) and must not be read as
// this message's until PlaceLent has put the tail there.
type LentReader interface {
	// PinLent takes the lent bytes for reading, where they are: the
	// sender cannot retire their region until UnpinLent. It refuses (ok
	// false, nothing held) unless the region is live and the bytes are in
	// memory now, and on a connection that has failed or is closing. The
	// caller must not parse src (the sender may change it); writing it
	// to a file as given is what it is for. Each ok PinLent is followed
	// by exactly one UnpinLent of the same Lent, soon: the sender's
	// Deregister of the region waits for it.
	PinLent(l Lent) (src []byte, ok bool)
	UnpinLent(l Lent)
	// PlaceLent copies the lent bytes into dst (len(dst) == l.Length), as
	// the SEND would have placed them. An error means they no longer
	// resolve (a sender that broke its promise, or the connection's end):
	// the message cannot be served.
	PlaceLent(l Lent, dst []byte) error
}
