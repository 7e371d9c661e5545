package server

import (
	"testing"
	"time"

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

// overdrawn starts a server with a budget of 16 credits (8 asked per
// connection, MinCredits 2) and spends it to the overdraft's cap: two
// connections at 8 credits each, two more at the minimal 2 (an overdraft
// of 4, a quarter of the budget). The balancer has asked (or asks) the
// first two to give back what is above their fair share; they do not
// answer until the test says. It returns those two and a fifth
// connection whose AUTH, asking for 8, is sent and not yet answered.
func overdrawn(t *testing.T) (full []*peer, late *peer) {
	e := newEnv(t, Config{CreditBudget: 16, Credits: 8, MaxCredits: 16, MinCredits: 2})
	key, signing := e.session(5)
	for i, want := range []uint16{8, 8, 2, 2} {
		p := e.dial()
		k := e.auth.AnotherKey(key)
		if i == 0 {
			k = key
		}
		if sp := p.auth(k, signing, 8); sp.Credits != want {
			t.Fatalf("connection %d got %d credits, want %d", i, sp.Credits, want)
		}
		if want == 8 {
			full = append(full, p)
		}
	}
	late = e.dial()
	ap := late.authParams(e.auth.AnotherKey(key), 8)
	ap.Sign(signing)
	req := protocol.NewAuthRequest(ap, late.Data.Addr(), late.Data.Handle(), 42)
	late.sendMsg(req.Append(nil))
	return full, late
}

// payBack answers the balancer's negative delta on p: one CREDIT message
// per credit asked back (FIG. 11B).
func (p *peer) payBack() {
	p.T.Helper()
	r := p.wantResponse("delta credit")
	if !r.IsDeltaCredit() || r.CreditDelta() >= 0 {
		p.T.Fatalf("%+v, want a negative delta credit", r)
	}
	for v := r.CreditDelta(); v <= -1; v++ {
		p.credit(v, 0, uint64(100-v), protocol.NotifyCredit)
	}
}

// A client logging on while the budget is overdrawn to the cap, with
// others still paying the overdraft back, gets its LWIO connection once
// they have, not STATUS_INSUFFICIENT_RESOURCES: the refusal depended on
// whether the balancer's round trips beat the AUTH (issue 20; with many
// clients mounting at once TestManyClientsGetLWIO failed 1 run in 15).
func TestAuthWaitsForOverdraftPayBack(t *testing.T) {
	full, late := overdrawn(t)
	full[0].payBack()
	r := late.wantResponse("AUTH")
	if r.Cookie != 42 || r.Ios.Status != protocol.StatusSuccess {
		t.Fatalf("AUTH once the overdraft was paid back: %+v, want SUCCESS", r)
	}
	if sp, _, err := protocol.DecodeAuthParamsPrefix(late.Data.Bytes()); err != nil || sp.Credits != 2 {
		t.Fatalf("late connection's parameters %+v (%v), want the minimal 2 credits", sp, err)
	}
}

// The cap still holds against clients that never pay back: the AUTH is
// refused after the bounded wait, not granted and not left hanging.
func TestAuthRefusedWhenNoOnePaysBack(t *testing.T) {
	_, late := overdrawn(t)
	start := time.Now()
	r := late.wantResponse("AUTH")
	if r.Ios.Status != protocol.StatusInsufficientResources {
		t.Fatalf("AUTH past the overdraft cap, no one paying back: %+v, want STATUS_INSUFFICIENT_RESOURCES", r)
	}
	if d := time.Since(start); d < authWait/2 {
		t.Fatalf("refused after %v: did not wait for the balancer (authWait %v)", d, authWait)
	}
}
