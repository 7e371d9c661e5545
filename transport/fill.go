package transport

// RemoteFiller is implemented by a connection that can let its user write
// straight into the peer's registered memory: softrdma's listener to a
// same-host dialer whose memory it maps (docs/transport.md, "WRITE filled
// in place"). An RDMA WRITE of data the caller would first
// read into a local buffer (a file's bytes) then costs no copy: the
// caller reads them into the target itself, and posts a WRITE that only
// tells the peer they are there.
//
// It is about memory, not messages: the capability knows nothing of what
// the bytes are. A provider whose NIC places data itself (verbs) does not
// implement it; a connection that implements it may still refuse any one
// fill (ok false), and the caller then posts its data as usual.
type RemoteFiller interface {
	// FillRemote takes the n bytes at addr of the peer's region rkey, as
	// an RDMA WRITE would name them, and calls fill with them. It refuses
	// (ok false, fill not called, err nil) unless the whole range is in
	// one live region of the peer open to remote write whose memory is
	// there now, and whenever the provider would not carry such a WRITE
	// by shared memory (too small, a sealed connection, a peer that
	// shares none). The peer cannot retire the region while fill runs.
	//
	// fill writes a prefix of dst and returns its length (and an error,
	// which FillRemote returns as err). fill must not keep dst, read it
	// back for anything that matters (the peer may change it), or block
	// for long: the peer's Deregister of the region waits for it.
	//
	// placed stands for the bytes fill wrote: post it, alone, as the SGL
	// of an OpWrite to the same RemoteAddr and RKey (with immediate data
	// or not), on this connection, as the next WRITE to that range; the
	// peer completes it as a WRITE of those bytes. Its Region is a token,
	// not memory: its Bytes are nil.
	FillRemote(rkey uint32, addr uint64, n int, fill func(dst []byte) (int, error)) (placed Segment, ok bool, err error)
}
