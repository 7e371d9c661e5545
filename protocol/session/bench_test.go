package session

import (
	"context"
	"testing"
)

// getAttrTree is a tree holding file "f", with the timer reset.
func getAttrTree(b *testing.B) *Tree {
	e := newEnv(b)
	e.writeFile("f", "x")
	tr := e.tree("data")
	b.ReportAllocs()
	b.ResetTimer()
	return tr
}

// BenchmarkGetAttr is one session round trip at queue depth 1: a signed
// GETATTR request, an lstat on the server, a signed response.
func BenchmarkGetAttr(b *testing.B) {
	tr := getAttrTree(b)
	for b.Loop() {
		if _, err := tr.GetAttr(context.Background(), "f"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGetAttrParallel is GETATTR from many goroutines at once.
func BenchmarkGetAttrParallel(b *testing.B) {
	tr := getAttrTree(b)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := tr.GetAttr(context.Background(), "f"); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
