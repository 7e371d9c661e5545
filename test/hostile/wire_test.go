package hostile

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/test/hostile/rig"
)

// TestWireRulesEndConnection sends, on an authenticated connection with a
// registered file, one message that breaks a rule of docs/wire.md. The live
// server must end that connection at the message — no answer, nothing read
// or written — with a log line naming the rule, and go on serving another
// client. (Before the engine dispatched on protocol.DecodeRequest several of
// these were served or answered with a status.)
func TestWireRulesEndConnection(t *testing.T) {
	e := newRuleEnv(t, server.Config{})
	ls, rk := e.ls, e.rk

	set := func(b []byte, off int, v byte) []byte { b[off] = v; return b }
	put32 := func(b []byte, off int, v uint32) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b }
	read := func(p *peer, fid uint16) []byte {
		h := protocol.NewReadRequest(fid, 0, 4096, p.Data.Addr(), p.Data.Handle(), 0, protocol.InterruptMode(1, 9))
		return h.Append(nil)
	}
	write := func(fid uint16) []byte {
		r := protocol.NewWriteRequest(fid, 0, bytes.Repeat([]byte("EVIL"), 256), 0, protocol.InterruptMode(0, 9))
		return r.Append(nil)
	}
	vecRead := func(p *peer, fid uint16, last uint32) []byte {
		regs := []protocol.RDMARegion{
			{DataVa: p.Data.Addr(), DataMh: p.Data.Handle(), Length: 4096},
			{DataVa: p.Data.Addr() + 4096, DataMh: p.Data.Handle(), Length: last},
		}
		r := protocol.NewVecReadRequest(fid, 0, 4096+last, 4096, regs, 0, protocol.InterruptMode(1, 9))
		return r.Append(nil)
	}
	cases := []struct {
		name string
		rule string // the FieldError's Msg.Field the log line must name
		msg  func(p *peer, fid uint16) []byte
	}{
		{"READ with Marker 0", "READ.Marker", func(p *peer, fid uint16) []byte { return set(read(p, fid), 7, 0) }},
		{"READ with an unknown flag bit", "READ.Flags", func(p *peer, fid uint16) []byte { return set(read(p, fid), 5, protocol.FlagInterrupt|0x01) }},
		{"READ with COLLAPSE_IO", "READ.Flags", func(p *peer, fid uint16) []byte {
			return set(read(p, fid), 5, protocol.FlagInterrupt|protocol.FlagCollapse)
		}},
		{"READ with trailing bytes", "READ.Length", func(p *peer, fid uint16) []byte { return append(read(p, fid), 0) }},
		{"WRITE with COLLAPSE_IO", "WRITE.Flags", func(p *peer, fid uint16) []byte {
			return set(write(fid), 5, protocol.FlagInterrupt|protocol.FlagCollapse)
		}},
		{"WRITE with Marker 0xFE", "WRITE.Marker", func(p *peer, fid uint16) []byte { return set(write(fid), 7, 0xfe) }},
		{"WRITE with Length past its data", "WRITE.Length", func(p *peer, fid uint16) []byte { return put32(write(fid), 0, 1025) }},
		{"VEC_WRITE collapsed with two pages of data", "VEC_WRITE.Length", func(p *peer, fid uint16) []byte {
			r := protocol.NewCollapsedVecWriteRequest(fid, 0, 3*4096, bytes.Repeat([]byte{1}, 4096), 0, protocol.InterruptMode(0, 9))
			return append(r.Append(nil), make([]byte, 4096)...)
		}},
		{"VEC_READ with a final region not a sector multiple", "VEC_READ.Regions[1].Length", func(p *peer, fid uint16) []byte { return vecRead(p, fid, 1000) }},
		{"VEC_READ with a short middle region", "VEC_READ.Regions[0].Length", func(p *peer, fid uint16) []byte {
			return put32(vecRead(p, fid, 4096), protocol.HeaderSize+12, 2048)
		}},
		{"CANCEL with trailing bytes", "CANCEL.Length", func(p *peer, fid uint16) []byte {
			h := protocol.NewCancelRequest(fid, 0, 9)
			return append(h.Append(nil), 0)
		}},
		{"CANCEL with Length 0xFFFFFFFF", "CANCEL.Length", func(p *peer, fid uint16) []byte {
			h := protocol.NewCancelRequest(fid, 0, 9)
			return put32(h.Append(nil), 0, 0xffffffff)
		}},
		{"CLOSE with Length 0", "CLOSE.Length", func(p *peer, fid uint16) []byte {
			h := protocol.NewCloseRequest(fid, 0, 9)
			return put32(h.Append(nil), 0, 0)
		}},
		{"INTERRUPT with trailing bytes", "INTERRUPT.Length", func(p *peer, fid uint16) []byte {
			h := protocol.NewInterruptRequest(0, 9)
			return append(h.Append(nil), 1, 2, 3)
		}},
		{"CREDIT with Length 47", "CREDIT.Length", func(p *peer, fid uint16) []byte {
			h := protocol.NewCreditRequest(0, 0, 9)
			return put32(h.Append(nil), 0, protocol.HeaderSize-1)
		}},
		{"REGISTER with truncated parameters", "FID_PARAMS.FID_PARAMS", func(p *peer, fid uint16) []byte {
			r := protocol.NewRegisterRequest(protocol.FidParams{ResumeKey: rk, SessionID: ls.id}, 0, 9)
			b := r.Append(nil)
			b = b[:len(b)-1]
			return put32(b, 0, uint32(len(b)))
		}},
		{"a second AUTH with a bad Magic", "AUTH_PARAMS.Magic", func(p *peer, fid uint16) []byte {
			return set(p.authMsg(authParams(ls.key, 1), 9), protocol.HeaderSize, 'X')
		}},
		{"opcode 0x0B", "REQUEST.Opcode", func(p *peer, fid uint16) []byte { return set(read(p, fid), 4, 0x0b) }},
	}
	breaks := make([]ruleBreak, len(cases))
	for i, c := range cases {
		breaks[i] = ruleBreak{c.name, c.rule, func(p *peer, fid uint16) [][]byte { return [][]byte{c.msg(p, fid)} }}
	}
	e.wantEnded(t, breaks)
	figures.Add(t, "%d messages breaking a wire rule after AUTH: %d connections ended with the rule logged, nothing read or written, another client served after each",
		len(cases), len(cases))
}

// ruleEnv is a live server whose engine logs into hook, a victim client
// served throughout, and an LWIO session owning the file "own" (content),
// whose resume key is rk: where a peer sends messages that break a wire
// rule.
type ruleEnv struct {
	s       *rig.Server
	hook    *logtest.Hook
	v       *victim
	ls      *lwioSession
	rk      protocol.ResumeKey
	content []byte
}

// newRuleEnv starts a ruleEnv on a server with engine (its Logger set here).
func newRuleEnv(t *testing.T, engine server.Config) *ruleEnv {
	logger := logrus.New()
	logger.Out = io.Discard
	e := &ruleEnv{hook: logtest.NewLocal(logger), content: bytes.Repeat([]byte{7}, 64<<10)}
	engine.Logger = logger
	e.s = newServer(t, rig.Options{Engine: engine})
	e.v = newVictim(t, e.s, "victim")
	e.ls = newLWIOSession(t, e.s)
	e.rk = e.ls.file(t, "own", e.content)
	return e
}

// ruleBreak is a message sequence that breaks a rule of docs/wire.md.
type ruleBreak struct {
	name string
	rule string // the FieldError's Msg.Field the log line must name; "" for a credit violation (no wire rule)
	msgs func(p *peer, fid uint16) [][]byte
}

// wantEnded sends each break on a new authenticated connection with "own"
// registered, and checks that the server ended that connection at the
// offending message — no answer, nothing written into the peer's memory or
// to the file — logging the rule, while the victim was served and kept its
// connection.
func (e *ruleEnv) wantEnded(t *testing.T, breaks []ruleBreak) {
	t.Helper()
	for _, c := range breaks {
		p := dialPeer(t, e.s)
		p.auth(e.ls, 4)
		st, fid := p.register(e.ls, e.rk)
		if st != protocol.StatusSuccess {
			t.Fatalf("%s: REGISTER %v", c.name, st)
		}
		e.hook.Reset()
		if err := p.sendChain(c.msgs(p, fid)); err != nil {
			t.Fatal(err)
		}
		p.WantClosed(c.name)
		if !p.untouched(0, peerDataSize) {
			t.Errorf("%s: the server wrote into the peer's memory", c.name)
		}
		if c.rule != "" && !logged(e.hook, c.rule) {
			t.Errorf("%s: no log line naming rule %s; got %v", c.name, c.rule, rules(e.hook))
		}
		if disk, err := os.ReadFile(filepath.Join(e.s.Dir, "own")); err != nil || !bytes.Equal(disk, e.content) {
			t.Fatalf("%s: the peer's own file changed: something it sent was written (%v)", c.name, err)
		}
		e.v.intact(t)
		if n := e.s.WaitConns(1, 5*time.Second); n != 1 {
			t.Fatalf("%s: %d server connections remain, want the victim's 1", c.name, n)
		}
		e.s.Check(t)
	}
}

// logged reports whether the engine logged a malformed message naming rule.
func logged(hook *logtest.Hook, rule string) bool {
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel && e.Data["rule"] == rule {
			return true
		}
	}
	return false
}

// rules lists the rules the engine logged, for a failure message.
func rules(hook *logtest.Hook) []any {
	var out []any
	for _, e := range hook.AllEntries() {
		if r, ok := e.Data["rule"]; ok {
			out = append(out, r)
		}
	}
	return out
}
