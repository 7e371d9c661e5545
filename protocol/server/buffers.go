package server

import (
	"math/bits"
	"sync"

	"github.com/lwiofs/lwiofs/transport"
)

// minBufShift is the smallest pooled buffer, 4 KiB.
const minBufShift = 12

// bufPool hands out registered buffers by power-of-two size class, so that
// no request registers memory on the hot path: a buffer is registered the
// first time its class runs dry and kept until the connection ends.
type bufPool struct {
	dom     transport.Domain
	access  transport.Access
	max     int // largest buffer
	mu      sync.Mutex
	free    [][]transport.Region // by class
	all     []transport.Region
	dropped bool
}

func newBufPool(dom transport.Domain, access transport.Access, max int) *bufPool {
	classes := classOf(max) + 1
	return &bufPool{dom: dom, access: access, max: max, free: make([][]transport.Region, classes)}
}

// classOf is the size class holding n bytes.
func classOf(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufShift
}

// get returns a registered buffer of at least n bytes (n ≤ max).
func (p *bufPool) get(n int) (transport.Region, error) {
	c := classOf(n)
	p.mu.Lock()
	if l := len(p.free[c]); l > 0 {
		r := p.free[c][l-1]
		p.free[c] = p.free[c][:l-1]
		p.mu.Unlock()
		return r, nil
	}
	p.mu.Unlock()
	size := 1 << (c + minBufShift)
	r, err := p.dom.Alloc(size, p.access)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropped {
		r.Deregister()
		return nil, transport.ErrClosed
	}
	p.all = append(p.all, r)
	return r, nil
}

func (p *bufPool) put(r transport.Region) {
	c := classOf(len(r.Bytes()))
	p.mu.Lock()
	p.free[c] = append(p.free[c], r)
	p.mu.Unlock()
}

// drop deregisters every buffer the pool ever made.
func (p *bufPool) drop() {
	p.mu.Lock()
	all := p.all
	p.all, p.dropped = nil, true
	for i := range p.free {
		p.free[i] = nil
	}
	p.mu.Unlock()
	for _, r := range all {
		r.Deregister()
	}
}
