package hostile

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
)

// TestFragmentSequences (issue 20): a write longer than a receive buffer
// comes fragmented (docs/wire.md, "Fragmented writes"). A well-formed
// sequence is written; every malformed, overlong or wrongly interleaved
// one ends its connection at the offending message, logged with the rule,
// with nothing of it written to the file and nothing written into the
// peer's memory, while another client is served throughout.
func TestFragmentSequences(t *testing.T) {
	const recv = protocol.HeaderSize + 4096 // 4 KiB of data a message
	e := newRuleEnv(t, server.Config{MaxRecvBufferSize: recv, MaxRdmaWindowSize: 64 << 10})
	s, ls, rk, content := e.s, e.ls, e.rk, e.content

	// seq is a fragmented write of n bytes of b at off, as a client sends
	// it: the first message and its FRAGMENTs.
	seq := func(fid uint16, off uint64, n int, b byte, cookie uint64) [][]byte {
		w := protocol.NewWriteRequest(fid, off, bytes.Repeat([]byte{b}, n), 0, protocol.InterruptMode(uint32(cookie), cookie))
		first := w.Fragment(4096)
		msgs := [][]byte{first.Append(nil)}
		for done := 4096; done < n; done += 4096 {
			k := min(4096, n-done)
			h := protocol.NewFragmentHeader(&first.Header, off+uint64(done), uint32(k), 0)
			msgs = append(msgs, (&protocol.WriteRequest{Header: h, Data: w.Data[done : done+k]}).Append(nil))
		}
		return msgs
	}
	read := func(p *peer, fid uint16) []byte {
		h := protocol.NewReadRequest(fid, 0, 4096, p.Data.Addr(), p.Data.Handle(), 0, protocol.InterruptMode(1, 9))
		return h.Append(nil)
	}

	t.Run("well formed", func(t *testing.T) {
		p := dialPeer(t, s)
		p.auth(ls, 8)
		_, fid := p.register(ls, rk)
		if err := p.sendChain(seq(fid, 100, 3*4096+10, 0xee, 5)); err != nil {
			t.Fatal(err)
		}
		if r := p.wantResponse("fragmented WRITE"); r.Cookie != 5 || r.Ios.Status != protocol.StatusSuccess || r.Ios.Information != 3*4096+10 {
			t.Fatalf("fragmented WRITE answered %+v", r)
		}
		disk, _ := os.ReadFile(filepath.Join(s.Dir, "own"))
		want := append([]byte(nil), content...)
		copy(want[100:], bytes.Repeat([]byte{0xee}, 3*4096+10))
		if !bytes.Equal(disk, want) {
			t.Fatal("the fragmented write is not on disk as sent")
		}
		if err := os.WriteFile(filepath.Join(s.Dir, "own"), content, 0o644); err != nil {
			t.Fatal(err)
		}
	})

	cases := []ruleBreak{
		{"a FRAGMENT with no write open", "FRAGMENT.Opcode", func(p *peer, fid uint16) [][]byte { return seq(fid, 0, 3*4096, 1, 9)[1:2] }},
		{"a first fragment short of a buffer", "WRITE.Length", func(p *peer, fid uint16) [][]byte {
			w := protocol.NewWriteRequest(fid, 0, make([]byte, 3*4096), 0, protocol.InterruptMode(9, 9))
			f := w.Fragment(4000)
			return [][]byte{f.Append(nil)}
		}},
		{"overlong: a write past MaxRdmaWindowSize", "WRITE.Length", func(p *peer, fid uint16) [][]byte {
			return seq(fid, 0, 64<<10+4096, 1, 9)[:1]
		}},
		{"a READ between fragments", "FRAGMENT.Opcode", func(p *peer, fid uint16) [][]byte {
			m := seq(fid, 0, 3*4096, 1, 9)
			return [][]byte{m[0], m[1], read(p, fid), m[2]}
		}},
		{"a second write started inside the first", "FRAGMENT.Opcode", func(p *peer, fid uint16) [][]byte {
			m := seq(fid, 0, 3*4096, 1, 9)
			return [][]byte{m[0], seq(fid, 8192, 2*4096, 2, 10)[0]}
		}},
		{"another write's FRAGMENT", "FRAGMENT.Offset", func(p *peer, fid uint16) [][]byte {
			m := seq(fid, 0, 3*4096, 1, 9)
			return [][]byte{m[0], seq(fid, 0, 3*4096, 2, 10)[1]}
		}},
		{"FRAGMENTs out of order", "FRAGMENT.Offset", func(p *peer, fid uint16) [][]byte {
			m := seq(fid, 0, 3*4096, 1, 9)
			return [][]byte{m[0], m[2], m[1]}
		}},
		{"a middle FRAGMENT short of a buffer", "FRAGMENT.Length", func(p *peer, fid uint16) [][]byte {
			m := seq(fid, 0, 3*4096, 1, 9)
			h, _ := protocol.DecodeHeader(m[1])
			h.Length = 1000
			return [][]byte{m[0], append(h.Append(nil), make([]byte, 1000)...)}
		}},
		{"the last FRAGMENT longer than what is left", "FRAGMENT.Length", func(p *peer, fid uint16) [][]byte {
			m := seq(fid, 0, 2*4096+100, 1, 9)
			h, _ := protocol.DecodeHeader(m[2])
			h.Length = 200
			return [][]byte{m[0], m[1], append(h.Append(nil), make([]byte, 200)...)}
		}},
		{"FRAGMENTED on a READ", "READ.Flags", func(p *peer, fid uint16) [][]byte {
			b := read(p, fid)
			b[5] |= protocol.FlagFragmented
			return [][]byte{b}
		}},
		{"more messages than credits", "", func(p *peer, fid uint16) [][]byte { return seq(fid, 0, 5*4096, 1, 9) }},
	}
	e.wantEnded(t, cases)
	figures.Add(t, "a fragmented write served; %d malformed, overlong or interleaved fragment sequences: %d connections ended at the offending message (the rule logged), nothing of them written, another client served after each",
		len(cases), len(cases))
}
