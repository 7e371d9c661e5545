package client

import (
	"context"
	"testing"

	"github.com/lwiofs/lwiofs/protocol/server"
)

// warmRings runs enough small requests over every connection that each
// entry of both ends' send queues has been used (the soft provider grows
// an entry's gather list the first time it carries one): what is left
// allocating after that is per request.
func warmRings(t testing.TB, cl *Client, f *File) {
	t.Helper()
	ctx := context.Background()
	// Each connection in turn (the client alone while the test does
	// nothing else): 8 KiB writes, two-segment SENDs, twice round its
	// send queue; then 4 KiB reads, round the server's (one segment per
	// work request, as every other request of the server's).
	all := cl.conns
	defer func() { cl.conns = all }()
	wr, rd := make([]byte, 8192), make([]byte, 4096)
	for i := range all {
		cl.conns = all[i : i+1]
		for j := 0; j < 2*(maxSlots+8); j++ {
			if _, err := f.WriteAt(ctx, wr, int64(j%64)*8192); err != nil {
				t.Fatal(err)
			}
		}
		for j := 0; j < server.DefaultSendQueueDepth+64; j++ {
			if _, err := f.ReadAt(ctx, rd, int64(j%64)*4096); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Once warm, the READ and WRITE round trips allocate nothing on either
// end (issue 16 item 5): client and server engines and the soft provider
// in this process, counted by testing.AllocsPerRun.
func TestNoAllocationPerRequest(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	_, f := benchEnv(t, Interrupt, 0)
	cl := f.cl
	warmRings(t, cl, f)
	ctx := context.Background()
	small, large := make([]byte, 4096), make([]byte, 1<<20)
	cases := []struct {
		name string
		op   func() error
	}{
		{"ReadAt 4 KiB", func() error { _, err := f.ReadAt(ctx, small, 8192); return err }},
		{"ReadAt 1 KiB (bounce)", func() error { _, err := f.ReadAt(ctx, small[:1024], 8192); return err }},
		{"ReadBuf 4 KiB", func() error {
			b, err := f.ReadBuf(ctx, small, 4096)
			if err == nil {
				b.Release()
			}
			return err
		}},
		{"ReadBuf 1 MiB", func() error {
			b, err := f.ReadBuf(ctx, large, 1<<20)
			if err == nil {
				b.Release()
			}
			return err
		}},
		{"WriteAt 4 KiB", func() error { _, err := f.WriteAt(ctx, small, 4096); return err }},
		{"WriteAt 1 MiB", func() error { _, err := f.WriteAt(ctx, large, 1<<20); return err }},
	}
	for _, c := range cases {
		for i := 0; i < 64; i++ { // this op's buffers and slots, on every connection
			if err := c.op(); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		}
		var opErr error
		allocs := testing.AllocsPerRun(200, func() {
			if err := c.op(); err != nil {
				opErr = err
			}
		})
		if opErr != nil {
			t.Fatalf("%s: %v", c.name, opErr)
		}
		if allocs != 0 {
			t.Errorf("%s: %.2f allocations per request, want 0", c.name, allocs)
		}
	}
	// With the client's default connections (two or more) and nothing
	// else in flight, the 1 MiB ReadBuf went split (split.go): its
	// pieces and their SplitBuf were measured too.
	if cl.Stats().SplitReads == 0 {
		t.Error("the 1 MiB ReadBuf was never split: the split path was not measured")
	}
}
