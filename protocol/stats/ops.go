package stats

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
)

// Op counts the requests of one opcode.
type Op struct {
	count   atomic.Uint64
	errors  atomic.Uint64
	bytes   atomic.Uint64
	latency Histogram
}

// Ops counts requests by LWIO opcode. The zero value is ready to use; Done
// is safe for concurrent use and does not allocate.
type Ops struct {
	ops [protocol.NumOpcodes]Op
}

// Done counts one finished request of opcode op: the file bytes it moved
// (0 for control requests), whether it failed (a status other than success
// or end of file, or a lost connection) and how long it took from post (or
// arrival) to completion.
func (o *Ops) Done(op protocol.Opcode, bytes uint64, failed bool, d time.Duration) {
	if !op.Valid() {
		return
	}
	c := &o.ops[op]
	c.count.Add(1)
	if failed {
		c.errors.Add(1)
	}
	if bytes > 0 {
		c.bytes.Add(bytes)
	}
	c.latency.Observe(d)
}

// OpSnapshot is one opcode's counters at one moment. Its JSON is what
// `lwio stat -json` prints per opcode.
type OpSnapshot struct {
	Count  uint64  `json:"count"`
	Bytes  uint64  `json:"bytes"`
	Errors uint64  `json:"errors"`
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	// Latency is the histogram behind the percentiles (for Prometheus).
	Latency *HistogramSnapshot `json:"-"`
}

// Snapshot returns the opcodes used so far, keyed by their seed names
// ("READ", "VEC_WRITE"…).
func (o *Ops) Snapshot() map[string]OpSnapshot {
	out := map[string]OpSnapshot{}
	for i := range o.ops {
		c := &o.ops[i]
		if c.count.Load() == 0 {
			continue
		}
		h := c.latency.Snapshot()
		out[protocol.Opcode(i).String()] = OpSnapshot{
			Count: c.count.Load(), Bytes: c.bytes.Load(), Errors: c.errors.Load(),
			P50us: micros(h.Quantile(0.50)), P99us: micros(h.Quantile(0.99)),
			Latency: &h,
		}
	}
	return out
}

func micros(d time.Duration) float64 {
	return float64(d.Nanoseconds()/10) / 100 // 2 decimals
}

// ByName is a set of counters keyed by a small number of names (providers,
// completion modes), each looked up once and then counted on without a
// lock: the connection keeps the *atomic.Uint64 it was given.
type ByName struct {
	mu sync.Mutex
	m  map[string]*atomic.Uint64
}

// Counter returns name's counter, making it on first use.
func (b *ByName) Counter(name string) *atomic.Uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]*atomic.Uint64{}
	}
	c := b.m[name]
	if c == nil {
		c = new(atomic.Uint64)
		b.m[name] = c
	}
	return c
}

// Snapshot returns every counter's value.
func (b *ByName) Snapshot() map[string]uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]uint64, len(b.m))
	for k, v := range b.m {
		out[k] = v.Load()
	}
	return out
}
