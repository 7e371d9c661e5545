package transport

import (
	"errors"
	"sync"
	"testing"
)

// countingDomain registers plain memory and counts what is live.
type countingDomain struct {
	mu     sync.Mutex
	allocs int
	live   map[*fakeRegion]bool
	fail   error
}

type fakeRegion struct {
	dom    *countingDomain
	b      []byte
	access Access
}

func (r *fakeRegion) Bytes() []byte     { return r.b }
func (r *fakeRegion) Addr() uint64      { return 0 }
func (r *fakeRegion) Handle() uint32    { return 0 }
func (r *fakeRegion) Access() Access    { return r.access }
func (r *fakeRegion) Deregister() error { r.dom.deregister(r); return nil }

func (d *countingDomain) Alloc(n int, access Access) (Region, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return nil, d.fail
	}
	if d.live == nil {
		d.live = map[*fakeRegion]bool{}
	}
	r := &fakeRegion{dom: d, b: make([]byte, n), access: access}
	d.allocs++
	d.live[r] = true
	return r, nil
}

func (d *countingDomain) deregister(r *fakeRegion) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.live[r] {
		panic("region deregistered twice")
	}
	delete(d.live, r)
}

func (d *countingDomain) counts() (allocs, live int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.allocs, len(d.live)
}

func TestBufferPoolClasses(t *testing.T) {
	d := &countingDomain{}
	p := NewBufferPool(d, AccessLocal|AccessRemoteWrite, 1<<20)
	for _, c := range []struct{ n, size int }{
		{1, 4096}, {4096, 4096}, {4097, 8192}, {65536, 65536}, {65537, 131072}, {1 << 20, 1 << 20},
	} {
		r, err := p.Get(c.n)
		if err != nil {
			t.Fatalf("Get(%d): %v", c.n, err)
		}
		if len(r.Bytes()) != c.size || r.Access() != AccessLocal|AccessRemoteWrite {
			t.Errorf("Get(%d): %d bytes, access %v; want %d", c.n, len(r.Bytes()), r.Access(), c.size)
		}
		p.Put(r)
	}
	// Steady state registers nothing more: each class's region comes back.
	before, _ := d.counts()
	for i := 0; i < 100; i++ {
		a, _ := p.Get(5000)
		b, _ := p.Get(5000) // a second one of the class while a is out
		if a == b {
			t.Fatal("one region handed out twice")
		}
		p.Put(a)
		p.Put(b)
	}
	if after, _ := d.counts(); after != before+1 {
		t.Errorf("%d registrations in steady state, want 1 (the second 8 KiB region)", after-before)
	}
}

func TestBufferPoolOversize(t *testing.T) {
	d := &countingDomain{}
	p := NewBufferPool(d, AccessLocal, 8192)
	r, err := p.Get(100000)
	if err != nil || len(r.Bytes()) < 100000 {
		t.Fatalf("oversize Get: %v", err)
	}
	p.Put(r)
	if _, live := d.counts(); live != 0 {
		t.Errorf("an oversize region was kept: %d live", live)
	}
}

func TestBufferPoolDrop(t *testing.T) {
	d := &countingDomain{}
	p := NewBufferPool(d, AccessLocal, 1<<16)
	out, _ := p.Get(4096)
	idle, _ := p.Get(4096)
	p.Put(idle)
	p.Drop()
	if _, live := d.counts(); live != 1 {
		t.Fatalf("after Drop %d regions live, want only the one still out", live)
	}
	out.Bytes()[0] = 1 // still the holder's until Put
	p.Put(out)
	if _, live := d.counts(); live != 0 {
		t.Fatalf("a region Put after Drop stayed registered (%d live)", live)
	}
	if _, err := p.Get(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Drop: %v, want ErrClosed", err)
	}
	p.Drop() // twice is harmless
}

func TestBufferPoolAllocFails(t *testing.T) {
	boom := errors.New("no memory")
	p := NewBufferPool(&countingDomain{fail: boom}, AccessLocal, 1<<16)
	if _, err := p.Get(10); !errors.Is(err, boom) {
		t.Fatalf("Get: %v, want the domain's error", err)
	}
}

func TestBufferPoolConcurrent(t *testing.T) {
	d := &countingDomain{}
	p := NewBufferPool(d, AccessLocal, 1<<16)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 500 {
				r, err := p.Get(1 + (i*4099)%(1<<16))
				if err != nil {
					t.Error(err)
					return
				}
				r.Bytes()[0]++
				p.Put(r)
			}
		})
	}
	wg.Wait()
	p.Drop()
	if _, live := d.counts(); live != 0 {
		t.Fatalf("%d regions live after Drop with none out", live)
	}
}

// SetKeep bounds what the pool keeps while nothing is out: regions put
// back beyond it go, and a class that runs dry makes room by freeing other
// classes' idle regions.
func TestBufferPoolKeep(t *testing.T) {
	d := &countingDomain{}
	p := NewBufferPool(d, AccessLocal, 1<<20)
	p.SetKeep(2 << 20)
	var out []Region
	for i := 0; i < 8; i++ {
		r, err := p.Get(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	for _, r := range out {
		p.Put(r)
	}
	if _, live := d.counts(); live != 2 {
		t.Errorf("8 MiB put back with a 2 MiB bound: %d regions kept, want 2", live)
	}
	// A 64 KiB class with none free: a 1 MiB region goes to make room.
	r, err := p.Get(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, live := d.counts(); live != 2 {
		t.Errorf("after a 64 KiB Get: %d regions live, want 2 (one 1 MiB freed for it)", live)
	}
	p.Put(r)
	if _, live := d.counts(); live != 2 {
		t.Errorf("64 KiB put back: %d live, want 2 (1 MiB + 64 KiB within 2 MiB)", live)
	}
	// Unbounded, everything stays.
	p.SetKeep(0)
	out = out[:0]
	for i := 0; i < 4; i++ {
		r, _ := p.Get(1 << 20)
		out = append(out, r)
	}
	for _, r := range out {
		p.Put(r)
	}
	if _, live := d.counts(); live != 5 {
		t.Errorf("unbounded: %d live, want 5", live)
	}
}
