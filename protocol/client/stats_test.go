package client

import (
	"testing"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// TestStatsCount: both engines count what moved — requests by opcode with
// bytes and latency, RDMA bytes by provider, completions by mode — and the
// figures match the I/O done, on both ends.
func TestStatsCount(t *testing.T) {
	e := newEnv(t, server.Config{})
	s := e.session()
	ctr := new(Counters)
	cfg := s.config(Interrupt)
	cfg.Counters = ctr
	cl := s.client(t, cfg)
	key, _ := s.file(t, "f", testutil.RandBytes(1<<20))
	f := s.register(t, cl, key, 0)
	ctx := ctxT(t)
	p := make([]byte, 64<<10)
	for i := 0; i < 4; i++ {
		if _, err := f.ReadAt(ctx, p, int64(i)*int64(len(p))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.WriteAt(ctx, p[:100], 0); err != nil {
		t.Fatal(err)
	}
	f.SetCompletion(Polling)
	if _, err := f.ReadAt(ctx, p[:4096], 0); err != nil {
		t.Fatal(err)
	}

	st := cl.Stats()
	r, w := st.Ops["READ"], st.Ops["WRITE"]
	if r.Count != 5 || r.Bytes != 4*64<<10+4096 || r.Errors != 0 || r.P50us <= 0 || r.P99us < r.P50us {
		t.Errorf("client READ %+v", r)
	}
	if w.Count != 1 || w.Bytes != 100 {
		t.Errorf("client WRITE %+v", w)
	}
	if st.Ops["REGISTER"].Count != 1 {
		t.Errorf("client REGISTER %+v", st.Ops["REGISTER"])
	}
	want := uint64(4*64<<10 + 4096 + 100)
	if st.RDMABytes[soft.Name] != want {
		t.Errorf("client RDMA bytes %v, want %d on %s", st.RDMABytes, want, soft.Name)
	}
	if st.Completions["interrupt"] != 5 || st.Completions["polling"] != 1 {
		t.Errorf("client completions %v, want 5 interrupt and 1 polling", st.Completions)
	}
	var sum uint64
	for _, ci := range cl.Conns() {
		sum += ci.Bytes
		if ci.Completion != "interrupt" {
			t.Errorf("connection mode %q", ci.Completion)
		}
	}
	if sum != want {
		t.Errorf("connections carried %d bytes, want %d", sum, want)
	}

	// A second client on the same Counters adds to them (a mount's
	// reconnect).
	cl2 := s.client(t, cfg)
	f2 := s.register(t, cl2, key, 0)
	if _, err := f2.ReadAt(ctx, p[:10], 0); err != nil {
		t.Fatal(err)
	}
	if n := ctr.Snapshot().Ops["READ"].Count; n != 6 {
		t.Errorf("shared counters: %d READs, want 6", n)
	}

	ss := e.srv.Stats()
	if sr := ss.Ops["READ"]; sr.Count != 6 || sr.Bytes != 4*64<<10+4096+10 {
		t.Errorf("server READ %+v", sr)
	}
	if ss.Ops["WRITE"].Bytes != 100 || ss.Ops["AUTH"].Count < 2 {
		t.Errorf("server WRITE %+v AUTH %+v", ss.Ops["WRITE"], ss.Ops["AUTH"])
	}
	if ss.Completions[server.CompletionImmediate] != 5 || ss.Completions[server.CompletionPolling] != 1 || ss.Completions[server.CompletionStatus] != 1 {
		t.Errorf("server completions %v: want 5 immediate (full reads), 1 status (the write), 1 polling", ss.Completions)
	}
	if ss.RDMABytes[soft.Name] != want+10 {
		t.Errorf("server RDMA bytes %v, want %d", ss.RDMABytes, want+10)
	}
	if ss.Connections[soft.Name] != 2*DefaultConnections() || ss.Sessions != 1 || ss.CreditsGranted < 2*DefaultConnections() ||
		ss.CreditBudget != int(server.DefaultMaxBufferMemory)/(server.DefaultMaxRecvBufferSize+4096-protocol.HeaderSize) || ss.BufferMemory != server.DefaultMaxBufferMemory {
		t.Errorf("server connections %v sessions %d credits %d/%d memory %d", ss.Connections, ss.Sessions, ss.CreditsGranted, ss.CreditBudget, ss.BufferMemory)
	}
	if want := int64(ss.CreditsGranted) * (server.DefaultMaxRecvBufferSize + 4096 - protocol.HeaderSize); ss.RecvBufferBytes < want || ss.RecvBufferBytes > want+int64(ss.CreditBudget)*(server.DefaultMaxRecvBufferSize+4096-protocol.HeaderSize) {
		t.Errorf("server receive buffers %d bytes for %d credits granted", ss.RecvBufferBytes, ss.CreditsGranted)
	}
}
