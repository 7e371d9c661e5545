// Package stats holds the LWIO engines' counters: per-opcode request counts,
// bytes and latency histograms that cost a few atomic adds per request and
// never allocate on the data path. The engines (protocol/client,
// protocol/server) own their counters; the mount's `lwio stat` and the
// server's Prometheus /metrics read snapshots of them. See docs/usage.md,
// "Seeing what carries the bytes".
package stats

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// Histogram bucket layout: log-linear over nanoseconds, subBuckets buckets
// per power of two (HDR histogram style), so a quantile read from it is
// within 1/(2*subBuckets) ≈ 6% of the true value; values below subBuckets ns
// get one bucket each and values beyond maxExp are counted in the last.
const (
	subBits    = 3
	subBuckets = 1 << subBits
	maxExp     = 40 // 2^40 ns ≈ 18 minutes
	// NumBuckets is the number of buckets of a Histogram.
	NumBuckets = (maxExp - subBits + 1) * subBuckets
)

// Histogram counts durations in fixed log-scale buckets with atomic
// counters: Observe is a few atomic adds and never allocates, so it can sit
// on every request. The zero value is ready to use.
type Histogram struct {
	buckets [NumBuckets]atomic.Uint64
	sum     atomic.Int64 // nanoseconds
}

// bucketOf returns the bucket of a duration of ns nanoseconds.
func bucketOf(ns int64) int {
	if ns < subBuckets {
		return int(max(ns, 0))
	}
	e := bits.Len64(uint64(ns)) - 1 // ns in [2^e, 2^(e+1))
	if e >= maxExp {
		return NumBuckets - 1
	}
	sub := int(ns>>(e-subBits)) & (subBuckets - 1)
	return (e-subBits+1)*subBuckets + sub
}

// BucketBounds returns the half-open range [lo, hi) of durations bucket i
// counts.
func BucketBounds(i int) (lo, hi time.Duration) {
	if i < subBuckets {
		return time.Duration(i), time.Duration(i + 1)
	}
	e := i/subBuckets + subBits - 1
	sub := int64(i % subBuckets)
	width := int64(1) << (e - subBits)
	lo64 := (subBuckets + sub) * width
	return time.Duration(lo64), time.Duration(lo64 + width)
}

// Observe counts one duration.
func (h *Histogram) Observe(d time.Duration) {
	h.buckets[bucketOf(int64(d))].Add(1)
	h.sum.Add(int64(d))
}

// Snapshot copies the counts. Concurrent Observes may or may not be in it.
func (h *Histogram) Snapshot() HistogramSnapshot {
	var s HistogramSnapshot
	for i := range h.buckets {
		n := h.buckets[i].Load()
		s.Counts[i] = n
		s.Count += n
	}
	s.Sum = time.Duration(h.sum.Load())
	return s
}

// HistogramSnapshot is a Histogram's counts at one moment.
type HistogramSnapshot struct {
	Counts [NumBuckets]uint64
	Count  uint64
	Sum    time.Duration
}

// Quantile returns the q-quantile (0 < q ≤ 1) as the middle of the bucket
// it falls in; 0 when nothing was counted.
func (s *HistogramSnapshot) Quantile(q float64) time.Duration {
	if s.Count == 0 {
		return 0
	}
	rank := uint64(q*float64(s.Count) + 0.5)
	rank = min(max(rank, 1), s.Count)
	var seen uint64
	for i, n := range s.Counts {
		seen += n
		if seen >= rank {
			lo, hi := BucketBounds(i)
			return lo + (hi-lo)/2
		}
	}
	return 0
}

// Add adds o's counts to s.
func (s *HistogramSnapshot) Add(o *HistogramSnapshot) {
	for i := range s.Counts {
		s.Counts[i] += o.Counts[i]
	}
	s.Count += o.Count
	s.Sum += o.Sum
}

// PowerOfTwoBounds are the upper bounds (in seconds) the Prometheus
// exposition uses: 2^10 ns (≈1 µs) to 2^34 ns (≈17 s), each a bucket edge
// of the Histogram, so Cumulative is exact at every one.
func PowerOfTwoBounds() []time.Duration {
	var out []time.Duration
	for e := 10; e <= 34; e++ {
		out = append(out, time.Duration(1)<<e)
	}
	return out
}

// Cumulative returns, for each upper bound (ascending, each a bucket edge
// such as those of PowerOfTwoBounds), the number of durations below it.
func (s *HistogramSnapshot) Cumulative(bounds []time.Duration) []uint64 {
	out := make([]uint64, len(bounds))
	var seen uint64
	b := 0
	for i, n := range s.Counts {
		_, hi := BucketBounds(i)
		for b < len(bounds) && bounds[b] < hi {
			out[b] = seen
			b++
		}
		seen += n
	}
	for ; b < len(bounds); b++ {
		out[b] = seen
	}
	return out
}
