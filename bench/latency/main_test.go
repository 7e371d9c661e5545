package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPingPong runs the echoing peer and the pinger of each network and
// checks every round trip was timed and took a plausible time.
func TestPingPong(t *testing.T) {
	for _, network := range []string{"tcp", "soft", "unix", "pipe"} {
		t.Run(network, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			addrs := make(chan string, 1)
			done := make(chan error, 1)
			go func() { done <- serve(ctx, network, "127.0.0.1:0", func(a string) { addrs <- a }) }()
			var addr string
			select {
			case addr = <-addrs:
			case err := <-done:
				t.Fatalf("serve: %v", err)
			}
			d, err := ping(ctx, network, addr, 200)
			if err != nil {
				t.Fatalf("ping: %v", err)
			}
			if len(d) != 200 {
				t.Fatalf("%d round trips timed, want 200", len(d))
			}
			for _, x := range d {
				if x <= 0 || x > 10*time.Second {
					t.Fatalf("a round trip took %v", x)
				}
			}
			cancel()
			<-done
		})
	}
}

func TestPingWrongNetwork(t *testing.T) {
	if _, err := ping(context.Background(), "udp", "127.0.0.1:1", 1); err == nil {
		t.Fatal("ping -net udp did not fail")
	}
}

func TestPreads(t *testing.T) {
	f := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(f, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := preads(f, 100)
	if err != nil || len(d) != 100 {
		t.Fatalf("preads: %d timed, %v", len(d), err)
	}
	if err := os.WriteFile(f, []byte("short"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := preads(f, 1); err == nil {
		t.Fatal("preads of a file shorter than 4 KiB did not fail")
	}
}
