package transport

import (
	"math/bits"
	"sync"
)

// minPoolShift is the smallest pooled buffer, 4 KiB.
const minPoolShift = 12

// BufferPool hands out registered regions by power-of-two size class, so
// that steady-state I/O never registers memory: a class registers a new
// region only when it runs dry, and keeps it until Drop. Both LWIO engines
// use one per connection for their data buffers. Safe for concurrent use.
type BufferPool struct {
	dom     Domain
	access  Access
	mu      sync.Mutex
	free    [][]Region // by class, up to the class of max
	dropped bool
	// keep bounds the bytes of free regions the pool holds (0: no bound;
	// SetKeep); kept is what it holds now.
	keep, kept int
}

// SetKeep bounds the memory the pool keeps registered while no request
// holds it to n bytes (0: unbounded): a region Put beyond that is
// deregistered, and a Get of a class that has none free first gives back
// free regions of other classes that would not fit. Regions in use are
// not counted — the caller's credits bound those.
func (p *BufferPool) SetKeep(n int) {
	p.mu.Lock()
	p.keep = n
	p.mu.Unlock()
}

// NewBufferPool returns a pool of regions of dom registered with access.
// Regions of up to max bytes are pooled; a larger Get is registered for
// that request alone and deregistered by Put.
func NewBufferPool(dom Domain, access Access, max int) *BufferPool {
	return &BufferPool{dom: dom, access: access, free: make([][]Region, poolClass(max)+1)}
}

// poolClass is the size class holding n bytes: 4 KiB << class.
func poolClass(n int) int {
	if n <= 1<<minPoolShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minPoolShift
}

// Get returns a registered region of at least n bytes (its class's size).
// After Drop it fails with ErrClosed.
func (p *BufferPool) Get(n int) (Region, error) {
	c := poolClass(n)
	p.mu.Lock()
	if p.dropped {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if c < len(p.free) {
		if l := len(p.free[c]); l > 0 {
			r := p.free[c][l-1]
			p.free[c] = p.free[c][:l-1]
			p.kept -= len(r.Bytes())
			p.mu.Unlock()
			return r, nil
		}
	}
	var trim []Region
	if p.keep > 0 {
		// Another class's free regions make room for this one's.
		for i := len(p.free) - 1; i >= 0 && p.kept+1<<(c+minPoolShift) > p.keep; i-- {
			for len(p.free[i]) > 0 && p.kept+1<<(c+minPoolShift) > p.keep {
				r := p.free[i][len(p.free[i])-1]
				p.free[i] = p.free[i][:len(p.free[i])-1]
				p.kept -= len(r.Bytes())
				trim = append(trim, r)
			}
		}
	}
	p.mu.Unlock()
	for _, r := range trim {
		r.Deregister()
	}
	r, err := p.dom.Alloc(1<<(c+minPoolShift), p.access)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropped {
		r.Deregister()
		return nil, ErrClosed
	}
	return r, nil
}

// Put gives r, from Get, back. After Drop, or for a region larger than
// the pool keeps, r is deregistered instead.
func (p *BufferPool) Put(r Region) {
	c := poolClass(len(r.Bytes()))
	p.mu.Lock()
	if !p.dropped && c < len(p.free) && (p.keep == 0 || p.kept+len(r.Bytes()) <= p.keep) {
		p.free[c] = append(p.free[c], r)
		p.kept += len(r.Bytes())
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	r.Deregister()
}

// Drop deregisters the free regions and makes later Gets fail. Regions
// still out are deregistered when they are Put: their memory stays valid
// for whoever holds them until then.
func (p *BufferPool) Drop() {
	p.mu.Lock()
	var all []Region
	for i := range p.free {
		all = append(all, p.free[i]...)
		p.free[i] = nil
	}
	p.kept = 0
	p.dropped = true
	p.mu.Unlock()
	for _, r := range all {
		r.Deregister()
	}
}
