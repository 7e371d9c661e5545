package stats

import (
	"math"
	"math/rand"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
)

// The buckets tile [0, 2^maxExp) with no gap or overlap, and bucketOf puts
// each bound in its own bucket.
func TestBucketsTile(t *testing.T) {
	var prev time.Duration
	for i := 0; i < NumBuckets; i++ {
		lo, hi := BucketBounds(i)
		if lo != prev || hi <= lo {
			t.Fatalf("bucket %d is [%d, %d), previous ended at %d", i, lo, hi, prev)
		}
		if got := bucketOf(int64(lo)); got != i {
			t.Fatalf("bucketOf(%d) = %d, want %d", lo, got, i)
		}
		if got := bucketOf(int64(hi - 1)); got != i {
			t.Fatalf("bucketOf(%d) = %d, want %d", hi-1, got, i)
		}
		prev = hi
	}
	if prev != 1<<maxExp {
		t.Fatalf("buckets end at %d, want 2^%d", prev, maxExp)
	}
	if bucketOf(-5) != 0 || bucketOf(1<<62) != NumBuckets-1 {
		t.Fatal("out-of-range values are not clamped")
	}
}

// Quantiles from the histogram are within 7% of the exact ones.
func TestQuantileAccuracy(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	var h Histogram
	var all []time.Duration
	for i := 0; i < 20000; i++ {
		// Log-uniform from 1 µs to 100 ms, like request latencies.
		d := time.Duration(1000 * math.Pow(10, rng.Float64()*5))
		all = append(all, d)
		h.Observe(d)
	}
	slices.Sort(all)
	s := h.Snapshot()
	if s.Count != uint64(len(all)) {
		t.Fatalf("count %d, want %d", s.Count, len(all))
	}
	for _, q := range []float64{0.5, 0.9, 0.99} {
		exact := all[int(q*float64(len(all)))-1]
		got := s.Quantile(q)
		if r := float64(got) / float64(exact); r < 0.93 || r > 1.07 {
			t.Errorf("q%.2f = %v, exact %v (ratio %.3f)", q, got, exact, r)
		}
	}
	var empty HistogramSnapshot
	if empty.Quantile(0.5) != 0 {
		t.Fatal("quantile of nothing is not 0")
	}
}

func TestCumulative(t *testing.T) {
	var h Histogram
	for _, d := range []time.Duration{500, 1024, 1500, 3000, 5 * time.Second, time.Hour} {
		h.Observe(d)
	}
	s := h.Snapshot()
	bounds := PowerOfTwoBounds()
	got := s.Cumulative(bounds)
	want := map[time.Duration]uint64{1 << 10: 1, 1 << 11: 3, 1 << 12: 4, 1 << 32: 4, 1 << 33: 5, 1 << 34: 5}
	for i, b := range bounds {
		if w, ok := want[b]; ok && got[i] != w {
			t.Errorf("below %v: %d, want %d", b, got[i], w)
		}
		if i > 0 && got[i] < got[i-1] {
			t.Errorf("not cumulative at %v", b)
		}
	}
	if s.Sum != 500+1024+1500+3000+5*time.Second+time.Hour {
		t.Errorf("sum %v", s.Sum)
	}
}

// Done on the data path allocates nothing.
func TestOpsDoneDoesNotAllocate(t *testing.T) {
	var o Ops
	allocs := testing.AllocsPerRun(1000, func() {
		o.Done(protocol.OpRead, 4096, false, 20*time.Microsecond)
	})
	if allocs != 0 {
		t.Fatalf("Done allocates %v times per call", allocs)
	}
}

func TestOpsSnapshot(t *testing.T) {
	var o Ops
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 1000 {
				o.Done(protocol.OpRead, 4096, false, time.Duration(10+i%10)*time.Microsecond)
				if i%100 == 0 {
					o.Done(protocol.OpWrite, 0, true, time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	o.Done(protocol.Opcode(200), 1, false, 0) // unknown: ignored
	s := o.Snapshot()
	if len(s) != 2 {
		t.Fatalf("opcodes %v, want READ and WRITE", s)
	}
	r := s["READ"]
	if r.Count != 8000 || r.Bytes != 8000*4096 || r.Errors != 0 {
		t.Fatalf("READ %+v", r)
	}
	if r.P50us < 13 || r.P50us > 16 || r.P99us < 18 || r.P99us > 21 {
		t.Fatalf("READ p50 %v µs p99 %v µs, want about 14.5 and 19", r.P50us, r.P99us)
	}
	if w := s["WRITE"]; w.Count != 80 || w.Errors != 80 || w.Bytes != 0 {
		t.Fatalf("WRITE %+v", w)
	}
}

func TestByName(t *testing.T) {
	var b ByName
	b.Counter("verbs").Add(3)
	b.Counter("softrdma").Add(1)
	b.Counter("verbs").Add(2)
	got := b.Snapshot()
	if got["verbs"] != 5 || got["softrdma"] != 1 || len(got) != 2 {
		t.Fatalf("%v", got)
	}
}

// BenchmarkOpsDone is the per-request cost of counting on the data path:
// the two clock reads around a request and Done.
func BenchmarkOpsDone(b *testing.B) {
	var o Ops
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			start := time.Now()
			o.Done(protocol.OpRead, 4096, false, time.Since(start))
		}
	})
}
