package server

import (
	"os"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/server/servertest"
)

// TestSlowInlineRequestIsTakenOver: a READ running inline on the reaper
// that does not finish (a stuck disk: a gated file) does not hold up the
// connection — the stall timer hands the reaper role to a new goroutine
// and the next request is served while the first still waits. Several
// rounds, with idle spells between them longer than the timer's period:
// the timer rests once nothing runs inline and the next inline run sets it
// again; and in each round many quick requests run inline first, which
// must not make the timer take over the slow one late or never.
func TestSlowInlineRequestIsTakenOver(t *testing.T) {
	e := newEnv(t, Config{Credits: 8})
	key, signing := e.session(5)
	content := testutil.RandBytes(64 << 10)
	rk, _ := e.file(5, "quick", content)
	p, quick := e.open(key, signing, 5, rk)
	c := e.serverConn()
	cookie := uint64(0)
	for round := range 3 {
		// Quick inline reads: the timer ticks while they go on.
		for range 50 {
			cookie++
			p.read(quick, 0, 4096, 1, cookie)
			if imm := p.WantImm("quick READ"); uint64(imm) != cookie&0xffffffff {
				t.Fatalf("round %d: quick READ answered %d, want %d", round, imm, cookie)
			}
		}
		f, err := os.CreateTemp(e.dir, "g")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if _, err := f.Write(content[:4096]); err != nil {
			t.Fatal(err)
		}
		g := servertest.NewGatedFile(osFile{f})
		t.Cleanup(g.Open)
		slow := uint16(p.register(e.auth.AddFile(5, g), 5, 0).Ios.Information)
		epoch := c.hand.Load() >> 1
		cookie++
		slowCookie := cookie
		p.read(slow, 0, 10, 1, slowCookie)
		<-g.Entered
		if c.hand.Load()&1 == 0 && c.hand.Load()>>1 == epoch {
			t.Fatalf("round %d: the gated READ is not running inline on the reaper", round)
		}
		start := time.Now()
		cookie++
		p.read(quick, 0, 4096, 1, cookie)
		if imm := p.WantImm("READ behind a stuck inline READ"); uint64(imm) != cookie&0xffffffff {
			t.Fatalf("round %d: READ behind the stuck one answered %d, want %d", round, imm, cookie)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("round %d: the READ behind a stuck inline READ took %v", round, took)
		}
		if c.hand.Load()>>1 == epoch {
			t.Errorf("round %d: served, but the reaper role was not taken over", round)
		}
		g.Open()
		if imm := p.WantImm("the stuck READ, let go"); uint64(imm) != slowCookie&0xffffffff {
			t.Fatalf("round %d: the stuck READ answered %d, want %d", round, imm, slowCookie)
		}
		time.Sleep(10 * stallAfter) // idle: the timer rests
		if c.stallArmed.Load() {
			t.Errorf("round %d: the stall timer is still set after an idle spell", round)
		}
	}
}
