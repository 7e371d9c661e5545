package session

import (
	"context"
	"testing"

	"github.com/lwiofs/lwiofs/protocol/share"
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

// BenchmarkGetAttr is one session round trip at queue depth 1: a signed
// GETATTR request, an lstat on the server, a signed response.
func BenchmarkGetAttr(b *testing.B) {
	getAttrLoop(b, getAttrTree(b))
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

// BenchmarkGetAttrAsUser is BenchmarkGetAttr with the user acting as an
// account of its own (uid 61001): the server switches its thread's
// credentials for the lstat (share's identity). Without root it is
// BenchmarkGetAttr.
func BenchmarkGetAttrAsUser(b *testing.B) {
	user := share.Account{Name: "bench-user", Uid: 61001, Gid: 61001, Groups: []uint32{61001}}
	e := newEnv(b, func(c *ServerConfig) {
		c.Accounts = share.AccountsConfig{Map: map[string]string{testUser: user.Name}, Lookup: accountsOf(user)}
	})
	e.writeFile("f", "x")
	getAttrLoop(b, e.tree("data"))
}
