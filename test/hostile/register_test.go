package hostile

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/test/hostile/rig"
)

// TestRegisterForeignKeys has an authenticated peer REGISTER resume keys
// that are not its own: another session's, guessed ones, its own with
// another session's id, one whose handle was closed. Each is refused with
// the connection kept; its own key then registers.
func TestRegisterForeignKeys(t *testing.T) {
	s := newServer(t, rig.Options{})
	a := newLWIOSession(t, s)
	b := newLWIOSession(t, s)
	aKey := a.file(t, "a", []byte("session A's file"))
	bKey := b.file(t, "b", []byte("session B's file"))
	ctx := ctx10(t)
	h, closedKey, err := b.OpenKey(ctx, "b2")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Tree.CloseHandle(ctx, h); err != nil {
		t.Fatal(err)
	}
	p := dialPeer(t, s)
	p.auth(b, 4)
	refused := 0
	try := func(why string, key protocol.ResumeKey, sessionID uint64) {
		t.Helper()
		req := protocol.NewRegisterRequest(protocol.FidParams{ResumeKey: key, SessionID: sessionID}, 0, 77)
		if err := p.sendMsg(req.Append(nil)); err != nil {
			t.Fatal(err)
		}
		r := p.wantResponse(why)
		if r.Ios.Status == protocol.StatusSuccess {
			t.Fatalf("%s: REGISTER succeeded (Fid %d)", why, r.Ios.Information)
		}
		if refused < 5 {
			t.Logf("%-45s %v", why+":", r.Ios.Status)
		}
		refused++
	}
	try("session A's resume key", aKey, b.id)
	try("session A's resume key with A's session id", aKey, a.id)
	try("own resume key with another session's id", bKey, a.id)
	try("resume key of a closed handle", closedKey, b.id)
	guesses := 1000
	if testing.Short() {
		guesses = 100
	}
	for i := 0; i < guesses; i++ {
		var k protocol.ResumeKey
		rand.Read(k[:])
		try("guessed resume key", k, b.id)
	}
	// A's key with only one byte changed.
	near := aKey
	near[23] ^= 1
	try("A's key with one bit flipped", near, b.id)
	if st, _ := p.register(b, bKey); st != protocol.StatusSuccess {
		t.Fatalf("own resume key: %v", st)
	}
	s.Check(t)
	figures.Add(t, "%d REGISTERs of foreign, guessed (%d), closed and mislabelled resume keys: %d refused, connection kept; own key then registered", refused, guesses, refused)
}

// TestCreditBudgetHog has one authenticated session open LWIO connections
// until the server-wide credit budget is gone. A new client still gets the
// minimal grant (issue 20: the budget is overdrawn and the server asks the
// others to give credits back) — but the hog, a raw peer, never answers,
// and once the overdraft reaches a quarter of the budget the next AUTH is
// refused with STATUS_INSUFFICIENT_RESOURCES (no crash, no unbounded
// grant). When the hog goes away every credit comes back.
func TestCreditBudgetHog(t *testing.T) {
	const budget, credits = 64, 16
	s := newServer(t, rig.Options{Engine: server.Config{CreditBudget: budget, Credits: credits, MaxCredits: credits}})
	hog := newLWIOSession(t, s)
	var peers []*peer
	granted := 0
	for granted < budget {
		p := dialPeer(t, s)
		g := p.auth(hog, credits)
		if g <= 0 || g > credits {
			t.Fatalf("granted %d credits", g)
		}
		granted += g
		peers = append(peers, p)
	}
	if granted != budget {
		t.Fatalf("granted %d credits in all, budget %d", granted, budget)
	}
	// The budget is spent: new clients get the minimal grant, until the
	// overdraft is a quarter of the budget; then AUTH is refused.
	other := newLWIOSession(t, s)
	overdraft, refused := 0, false
	for i := 0; i < budget && !refused; i++ {
		p := dialPeer(t, s)
		ap := authParams(other.fresh(t), credits)
		ap.Sign(other.signing)
		if err := p.sendMsg(p.authMsg(ap, 9)); err != nil {
			t.Fatal(err)
		}
		r, ok := p.response()
		switch {
		case ok && r.Ios.Status == protocol.StatusSuccess:
			sp, _, err := protocol.DecodeAuthParamsPrefix(p.Data.Bytes())
			if err != nil || int(sp.Credits) != server.DefaultMinCredits {
				t.Fatalf("AUTH with the budget spent granted %d credits (%v), want the minimal %d", sp.Credits, err, server.DefaultMinCredits)
			}
			overdraft += int(sp.Credits)
			peers = append(peers, p)
		case ok && r.Ios.Status == protocol.StatusInsufficientResources:
			p.WantClosed("after INSUFFICIENT_RESOURCES")
			refused = true
		default:
			t.Fatalf("AUTH with the budget spent: %+v (ok %v)", r, ok)
		}
	}
	if !refused || overdraft != budget/4 {
		t.Fatalf("overdraft %d credits before a refusal (refused %v), want %d", overdraft, refused, budget/4)
	}
	if bi := s.Engine.Budget(); bi.Granted != budget+overdraft || bi.Credits != budget {
		t.Errorf("Budget() = %+v, want %d granted of %d", bi, budget+overdraft, budget)
	}
	// The hog leaves: its credits return, clients are served again.
	for _, hp := range peers {
		hp.Conn.Close()
	}
	if n := s.WaitConns(0, 5*time.Second); n != 0 {
		t.Fatalf("%d connections remain", n)
	}
	s.Check(t)
	// All of it: a new hog gets the whole budget again.
	again := 0
	for i := 0; i < budget/credits; i++ {
		p := dialPeer(t, s)
		again += p.auth(hog, credits)
	}
	if again != budget {
		t.Errorf("after the hog left, %d of %d credits could be granted again", again, budget)
	}
	figures.Add(t, "one session took the whole budget (%d credits on %d connections); new clients then got the minimal grant until %d credits (a quarter) were overdrawn, the next AUTH: STATUS_INSUFFICIENT_RESOURCES and disconnected; after the hog left all %d credits were granted again", budget, budget/credits, overdraft, again)
}
