package client

import (
	"math/bits"
	"sync"

	"github.com/lwiofs/lwiofs/transport"
)

// minBufShift is the smallest pooled buffer, 4 KiB.
const minBufShift = 12

// Buf is a pooled registered buffer holding the result of ReadBuf. Reply
// from Bytes and call Release exactly once when done; the memory is reused.
type Buf struct {
	r    transport.Region
	n    int
	pool *bufPool
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
	p.put(b.r)
}

// bufPool hands out registered buffers by power-of-two size class; a class
// registers a new buffer only when it runs dry, so steady-state I/O never
// registers memory.
type bufPool struct {
	dom     transport.Domain
	access  transport.Access
	mu      sync.Mutex
	free    [][]transport.Region
	dropped bool
}

func newBufPool(dom transport.Domain, access transport.Access, max int) *bufPool {
	return &bufPool{dom: dom, access: access, free: make([][]transport.Region, classOf(max)+1)}
}

func classOf(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufShift
}

func (p *bufPool) get(n int) (transport.Region, error) {
	c := classOf(n)
	p.mu.Lock()
	if c < len(p.free) {
		if l := len(p.free[c]); l > 0 {
			r := p.free[c][l-1]
			p.free[c] = p.free[c][:l-1]
			p.mu.Unlock()
			return r, nil
		}
	}
	p.mu.Unlock()
	r, err := p.dom.Alloc(1<<(c+minBufShift), p.access)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropped {
		r.Deregister()
		return nil, transport.ErrClosed
	}
	return r, nil
}

func (p *bufPool) put(r transport.Region) {
	c := classOf(len(r.Bytes()))
	p.mu.Lock()
	if !p.dropped && c < len(p.free) {
		p.free[c] = append(p.free[c], r)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	r.Deregister() // the pool is gone: a buffer released late goes with it
}

// drop deregisters the free buffers; buffers still out are deregistered
// when they come back.
func (p *bufPool) drop() {
	p.mu.Lock()
	var all []transport.Region
	for i := range p.free {
		all = append(all, p.free[i]...)
		p.free[i] = nil
	}
	p.dropped = true
	p.mu.Unlock()
	for _, r := range all {
		r.Deregister()
	}
}
