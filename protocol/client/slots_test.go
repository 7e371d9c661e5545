package client

import (
	"context"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol/server"
)

// Delta-credit handshakes give their request slots back. Bursts of 64
// concurrent reads grow the connection's grant from 2 to 128 credits (a
// CREDIT answering each positive delta), and a long run of single reads
// makes the server take them back (a CREDIT per credit retired), cycle
// after cycle, until the connection has made twice as many CREDIT
// requests as it has slots. sendCredit kept its slot after the answer,
// so a mount whose grant went up and down long enough had every slot
// taken by CREDITs long finished, and its next request waited for good.
func TestCreditHandshakesGiveSlotsBack(t *testing.T) {
	const burst, most, cycles = 64, 128, 12
	e := newEnv(t, server.Config{Credits: 2, MaxCredits: most})
	cl, f := oneConnFile(t, e, Interrupt, 2, most, 4096)
	credits := func() int { return cl.Conns()[0].Credits }
	handshakes := func() uint64 { return cl.Stats().Ops["CREDIT"].Count }
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		read := func() error {
			var b [512]byte
			_, err := f.ReadAt(context.Background(), b[:], 0)
			return err
		}
		for c := 0; c < cycles && handshakes() < 2*maxSlots; c++ {
			// Grow: bursts of reads, each outstanding until all are.
			for i := 0; i < 50 && credits() < most; i++ {
				errs := make(chan error, burst)
				for j := 0; j < burst; j++ {
					go func() { errs <- read() }()
				}
				for j := 0; j < burst; j++ {
					if e := <-errs; e != nil && err == nil {
						err = e
					}
				}
				if err != nil {
					return
				}
			}
			// Shrink: one read at a time, a hint far under the grant.
			for i := 0; i < 20000 && credits() > 2; i++ {
				if err = read(); err != nil {
					return
				}
			}
		}
	}()
	watchdog(t, "reads while the grant goes up and down", 2*time.Minute, done)
	if err != nil {
		t.Fatal(err)
	}
	n := handshakes()
	t.Logf("%d CREDIT requests on a connection of %d slots; %+v", n, maxSlots, cl.Stats().Ops["CREDIT"])
	if n < 2*maxSlots {
		t.Fatalf("only %d CREDIT requests in %d cycles: the grant did not go up and down enough to prove anything", n, cycles)
	}
}
