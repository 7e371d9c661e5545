package session

import (
	"context"
	"testing"
)

// BenchmarkGetAttr is one session round trip at queue depth 1: a signed
// GETATTR request, an lstat on the server, a signed response.
func BenchmarkGetAttr(b *testing.B) {
	e := newEnv(b)
	e.writeFile("f", "x")
	getAttrLoop(b, e.tree("data"))
}

// getAttrLoop is GETATTR at queue depth 1 for the benchmark's iterations.
func getAttrLoop(b *testing.B, tr *Tree) {
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := tr.GetAttr(ctx, "f"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGetAttrParallel is GETATTR from many goroutines at once.
func BenchmarkGetAttrParallel(b *testing.B) {
	e := newEnv(b)
	e.writeFile("f", "x")
	tr := e.tree("data")
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := tr.GetAttr(ctx, "f"); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
