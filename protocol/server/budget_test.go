package server

import (
	"testing"

	"github.com/lwiofs/lwiofs/protocol"
)

// A connection the balancer found idle, then busy again, is busy at the
// balancer's next look, a poke (another connection came up short) as well
// as a tick; so is one whose requests are all still outstanding. Before,
// only a tick noticed new requests, so a poke took a busy-again
// connection down to MinCredits, and a connection waiting on slow I/O
// (no new requests for idleSweeps ticks) lost its credits too.
func TestBusyAgainIsNotIdle(t *testing.T) {
	c := &conn{s: &Server{cfg: Config{MinCredits: 2}}, grant: protocol.NewCreditGrant(16)}
	const fair = 8
	for i := 0; i < idleSweeps; i++ {
		c.keep(true, false, fair, 16)
	}
	if k := c.keep(false, false, fair, 16); k != 2 {
		t.Fatalf("idle for %d ticks: keeps %d credits, want MinCredits 2", idleSweeps, k)
	}
	c.requests.Add(1) // busy again
	if k := c.keep(false, false, fair, 16); k != 16 {
		t.Fatalf("busy again, at a poke: keeps %d of 16 credits, want all", k)
	}
	if k := c.keep(false, true, fair, 16); k != fair {
		t.Fatalf("busy again, budget short: keeps %d of 16 credits, want the fair share %d", k, fair)
	}
	// Requests outstanding, none arriving, for more than idleSweeps ticks.
	if err := c.grant.Receive(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2*idleSweeps; i++ {
		if k := c.keep(true, false, fair, 16); k != 16 {
			t.Fatalf("tick %d with a request outstanding: keeps %d of 16 credits, want all", i, k)
		}
	}
	c.grant.Complete()
	for i := 0; i < idleSweeps; i++ {
		c.keep(true, false, fair, 16)
	}
	if k := c.keep(true, false, fair, 16); k != 2 {
		t.Fatalf("idle again: keeps %d credits, want MinCredits 2", k)
	}
}
