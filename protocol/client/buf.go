package client

import (
	"sync"

	"github.com/lwiofs/lwiofs/transport"
)

// Buffer is data a read returned (File.ReadBuf). Release gives its memory
// back to the engine's pool — a no-op for ordinary memory — and Bytes must
// not be used after. fs's DataFile returns the same type, so a registered
// file is a data file as it is.
type Buffer interface {
	Bytes() []byte
	Release()
}

// Buf is a pooled registered buffer holding the result of ReadBuf, or the
// caller's own memory when the read landed there. Reply from Bytes and call
// Release once when done (a second call does nothing); the memory is reused.
type Buf struct {
	r    transport.Region
	b    []byte
	pool *transport.BufferPool
	held bool // from newBuf until Release: a second Release is a no-op
}

var _ Buffer = (*Buf)(nil)

// Bytes is the data read.
func (b *Buf) Bytes() []byte { return b.b }

// Len is len(Bytes()).
func (b *Buf) Len() int { return len(b.b) }

// Release returns the buffer to its pool. Bytes must not be used after,
// nor the Buf itself: it is reused. A second Release before that reuse
// does nothing: putting the Buf (and its region) into the pools twice
// would hand one buffer to two later reads.
func (b *Buf) Release() {
	if b == nil || !b.held {
		return
	}
	if p := b.pool; p != nil {
		p.Put(b.r)
	}
	*b = Buf{}
	bufs.Put(b)
}

// bufs recycles Bufs, so that a read allocates nothing once warm.
var bufs = sync.Pool{New: func() any { return new(Buf) }}

// newBuf returns a Buf of b, in region r of pool (nil for the caller's own
// memory).
func newBuf(b []byte, r transport.Region, pool *transport.BufferPool) *Buf {
	x := bufs.Get().(*Buf)
	x.b, x.r, x.pool, x.held = b, r, pool, true
	return x
}
