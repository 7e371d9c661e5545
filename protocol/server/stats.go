package server

import (
	"sync/atomic"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/stats"
	"github.com/lwiofs/lwiofs/transport"
)

// Completion modes as Stats names them: how the server finished an I/O
// request (FIG. 8, seed 002).
const (
	CompletionImmediate = "immediate" // RDMA WRITE WITH IMMEDIATE on the last data write
	CompletionStatus    = "status"    // a STATUS_RESPONSE send (interrupt mode)
	CompletionPolling   = "polling"   // an IO_STATUS_BLOCK RDMA-written to IosVa
)

// counters are the engine's: requests by opcode (latency from arrival to
// the completion's post), I/O completions by mode, RDMA bytes by provider
// and refused AUTHs. A few atomic adds per request, no allocation.
type counters struct {
	ops                        stats.Ops
	immediate, status, polling atomic.Uint64
	rdma                       stats.ByName
	authRefused                atomic.Uint64
	readsInPlace               atomic.Uint64
	writesInPlace              atomic.Uint64
}

// count records a request as complete finishes it: wrs is its chain (its
// last work request carries the immediate data when that completes it).
// The hook of complete, the one place every request ends.
func (c *conn) count(sl *slot, wrs []transport.SendWR, st protocol.Status, info uint32) {
	h := &sl.req.Header
	var d time.Duration
	if !sl.start.IsZero() {
		d = time.Since(sl.start)
		sl.start = time.Time{}
	}
	ok := st == protocol.StatusSuccess
	if sl.authn && !ok {
		c.s.ctr.authRefused.Add(1)
	}
	var file uint64
	if ok && h.Opcode.IsIO() {
		file = uint64(info)
		moved := file
		if h.Flags&protocol.FlagCollapse != 0 {
			moved = min(file, uint64(h.PageSize())) // one page was sent
		}
		c.rdma.Add(moved)
	}
	c.s.ctr.ops.Done(h.Opcode, file, !ok && st != protocol.StatusEndOfFile && st != protocol.NotifyCredit, d)
	switch {
	case !h.Opcode.IsIO():
	case h.Flags&protocol.FlagInterrupt == 0:
		c.s.ctr.polling.Add(1)
	case len(wrs) > 0 && wrs[len(wrs)-1].HasImm:
		c.s.ctr.immediate.Add(1)
	default:
		c.s.ctr.status.Add(1)
	}
}

// Stats are the engine's figures at one moment, for the server's /metrics.
type Stats struct {
	// Ops are the requests served, by opcode name ("READ", …).
	Ops map[string]stats.OpSnapshot
	// Completions are the I/O requests completed, by mode
	// (CompletionImmediate, CompletionStatus, CompletionPolling).
	Completions map[string]uint64
	// RDMABytes are the bytes of file data moved by RDMA, by provider: read
	// data RDMA-written, write data received (a collapsed VEC_WRITE one page).
	RDMABytes map[string]uint64
	// Connections are the live connections by provider; Sessions the
	// sessions with at least one.
	Connections map[string]int
	Sessions    int
	// CreditsGranted is the credits granted over the live connections,
	// CreditsInUse those held by requests the server has not completed;
	// CreditBudget is the server-wide budget in credits (budget.go:
	// Config.MaxBufferMemory over a receive buffer's size). Granted may
	// pass the budget while new connections' minimal grants overdraw it.
	CreditsGranted int
	CreditsInUse   int
	CreditBudget   int
	// BufferMemory is the budget in bytes (Config.MaxBufferMemory);
	// RecvBufferBytes the receive buffers registered now, posted or spare
	// — the memory the budget bounds.
	BufferMemory    int64
	RecvBufferBytes int64
	// AuthRefused counts AUTH requests refused (bad key, signature,
	// session or budget).
	AuthRefused uint64
	// ReadsInPlace counts READs the server read straight into the
	// client's memory (transport.RemoteFiller), not through a buffer.
	ReadsInPlace uint64
	// WritesInPlace counts WRITEs the server wrote straight from the
	// client's memory (transport.LentReader, lent.go), not from a
	// receive buffer.
	WritesInPlace uint64
}

// Stats returns the engine's counters and its live connections' state.
func (s *Server) Stats() Stats {
	bi := s.Budget()
	st := Stats{
		Ops: s.ctr.ops.Snapshot(),
		Completions: map[string]uint64{
			CompletionImmediate: s.ctr.immediate.Load(),
			CompletionStatus:    s.ctr.status.Load(),
			CompletionPolling:   s.ctr.polling.Load(),
		},
		RDMABytes:       s.ctr.rdma.Snapshot(),
		Connections:     map[string]int{},
		CreditsInUse:    bi.Outstanding,
		CreditBudget:    bi.Credits,
		BufferMemory:    bi.MaxBufferMemory,
		RecvBufferBytes: bi.RecvBytes,
		AuthRefused:     s.ctr.authRefused.Load(),
		ReadsInPlace:    s.ctr.readsInPlace.Load(),
		WritesInPlace:   s.ctr.writesInPlace.Load(),
	}
	s.mu.Lock()
	st.Sessions = len(s.sessions)
	s.mu.Unlock()
	for _, c := range s.connList() {
		st.Connections[c.tc.Provider()]++
		if g := c.openGrant(); g != nil {
			st.CreditsGranted += g.Granted()
		}
	}
	return st
}
