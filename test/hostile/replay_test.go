package hostile

import (
	"testing"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/test/hostile/rig"
)

// TestAuthReplay replays, on a new connection, the exact bytes of an AUTH
// another connection of the same session sent — what anyone who can watch
// a softrdma connection (plain TCP) sees. Holding the session key should be
// needed to authenticate; a captured message should not be enough.
func TestAuthReplay(t *testing.T) {
	s := newServer(t, rig.Options{})
	ls := newLWIOSession(t, s)
	victim := dialPeer(t, s)
	ap := authParams(ls.key, 4)
	ap.Sign(ls.signing)
	captured := victim.authMsg(ap, 1)
	if err := victim.sendMsg(captured); err != nil {
		t.Fatal(err)
	}
	if r := victim.wantResponse("genuine AUTH"); r.Ios.Status != protocol.StatusSuccess {
		t.Fatalf("genuine AUTH: %v", r.Ios.Status)
	}
	// The attacker's connection: the same bytes, except where the server
	// is to write its answer (the attacker's own memory, not signed).
	attacker := dialPeer(t, s)
	replay := append([]byte(nil), captured...)
	h, err := protocol.DecodeHeader(replay)
	if err != nil {
		t.Fatal(err)
	}
	h.DataVa, h.DataMh = attacker.Data.Addr(), attacker.Data.Handle()
	h.Put(replay)
	if err := attacker.sendMsg(replay); err != nil {
		t.Fatal(err)
	}
	r, ok := attacker.response()
	if ok && r.Ios.Status == protocol.StatusSuccess {
		t.Fatalf("a replayed AUTH authenticated a new connection as session %d", ls.id)
	}
}
