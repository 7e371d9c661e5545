package client

import "github.com/lwiofs/lwiofs/transport"

// Buf is a pooled registered buffer holding the result of ReadBuf. Reply
// from Bytes and call Release exactly once when done; the memory is reused.
type Buf struct {
	r    transport.Region
	n    int
	pool *transport.BufferPool
}

// Bytes is the data read.
func (b *Buf) Bytes() []byte { return b.r.Bytes()[:b.n] }

// Len is len(Bytes()).
func (b *Buf) Len() int { return b.n }

// Release returns the buffer to its pool. Bytes must not be used after.
func (b *Buf) Release() {
	if b == nil || b.pool == nil {
		return
	}
	p := b.pool
	b.pool = nil
	p.Put(b.r)
}
