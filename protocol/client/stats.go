package client

import (
	"sync/atomic"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/stats"
	"github.com/lwiofs/lwiofs/transport"
)

// Counters are what a client counts: every request by opcode (count, file
// bytes, errors, latency from post to completion), the bytes its LWIO
// connections moved by provider, and its completions by mode. Counting is a
// few atomic adds per request, without allocation. One Counters may serve
// several Clients in turn (Config.Counters): a mount keeps its figures
// across reconnects.
type Counters struct {
	ops        stats.Ops
	rdma       stats.ByName // payload bytes moved by RDMA WRITE / SEND, by provider
	modes      stats.ByName // I/O completions by mode
	interrupts atomic.Int64
	collapsed  atomic.Int64
	splitReads atomic.Int64
	registered atomic.Int64
	attached   atomic.Int64
}

// Stats are a client's counters at one moment.
type Stats struct {
	// Ops are the requests by opcode name ("READ", "VEC_WRITE"…).
	Ops map[string]stats.OpSnapshot
	// RDMABytes are the bytes of file data the LWIO connections moved, by
	// provider: read data the server RDMA-wrote, write data sent (a
	// collapsed VEC_WRITE sends one page).
	RDMABytes map[string]uint64
	// Completions are the I/O requests completed by mode: "interrupt"
	// (STATUS_RESPONSE or immediate data) and "polling" (status block).
	Completions map[string]uint64
	// Collapsed is the number of VEC_WRITEs sent collapsed (FIG. 17B).
	Collapsed int64
	// SplitReads is the number of reads sent as pieces on several idle
	// connections at once (split.go).
	SplitReads int64
	// Interrupts is the number of INTERRUPT requests sent by polling waits
	// that outlasted SpinTime (FIG. 9A).
	Interrupts int64
	// Registered is the number of files registered by REGISTER (FIG. 7A),
	// Attached the number whose Fid came with the session's OPEN (Attach).
	Registered, Attached int64
}

// Snapshot returns the counters.
func (ctr *Counters) Snapshot() Stats {
	return Stats{
		Ops: ctr.ops.Snapshot(), RDMABytes: ctr.rdma.Snapshot(), Completions: ctr.modes.Snapshot(),
		Collapsed: ctr.collapsed.Load(), SplitReads: ctr.splitReads.Load(), Interrupts: ctr.interrupts.Load(),
		Registered: ctr.registered.Load(), Attached: ctr.attached.Load(),
	}
}

// Stats returns the client's counters (those of Config.Counters, so
// including earlier clients that shared them).
func (cl *Client) Stats() Stats { return cl.ctr.Snapshot() }

// connCounters are one connection's own figures, for `lwio stat`'s
// connection list; the provider and mode counters are the Counters' own.
type connCounters struct {
	requests    atomic.Uint64
	bytes       atomic.Uint64
	polled      atomic.Uint64
	interrupted atomic.Uint64
	rdma        *atomic.Uint64 // Counters.rdma[provider]
	byPolling   *atomic.Uint64 // Counters.modes["polling"]
	byInterrupt *atomic.Uint64 // Counters.modes["interrupt"]
}

func (cc *connCounters) init(ctr *Counters, provider string) {
	cc.rdma = ctr.rdma.Counter(provider)
	cc.byPolling = ctr.modes.Counter(Polling.String())
	cc.byInterrupt = ctr.modes.Counter(Interrupt.String())
}

// count records a finished request: the hook of roundTrip, the one place
// every request but INTERRUPT goes through. payload is the write data the
// request sent.
func (c *conn) count(op protocol.Opcode, polling bool, payload int, r result, err error, start time.Time) {
	d := time.Since(start)
	// NOTIFY_CREDIT completing a retiring CREDIT is its success (FIG. 11C).
	ok := err == nil && (r.st == protocol.StatusSuccess || op == protocol.OpCredit && r.st == protocol.NotifyCredit)
	var file, moved uint64
	if ok && op.IsIO() {
		file = uint64(r.info)
		moved = file
		if op == protocol.OpWrite || op == protocol.OpVecWrite {
			moved = uint64(payload)
		}
	}
	failed := err != nil || !ok && r.st != protocol.StatusEndOfFile
	c.cl.ctr.ops.Done(op, file, failed, d)
	if !op.IsIO() || err != nil {
		return
	}
	cc := &c.ctr
	cc.requests.Add(1)
	cc.bytes.Add(moved)
	cc.rdma.Add(moved)
	if polling {
		cc.polled.Add(1)
		cc.byPolling.Add(1)
	} else {
		cc.interrupted.Add(1)
		cc.byInterrupt.Add(1)
	}
}

// ConnInfo describes one connection, for logs and status commands.
type ConnInfo struct {
	Provider string
	// Carrier is the socket under a softrdma connection, "tcp", "unix",
	// "unix+shm", "pipe" or "pipe+shm" (transport.Carrier); "" for verbs.
	Carrier    string
	LocalAddr  string
	RemoteAddr string
	Credits    int
	Alive      bool
	// Completion is the connection's completion mode; with Auto, the mode
	// it is in now ("auto/polling" or "auto/interrupt").
	Completion string
	// Requests and Bytes are the I/O requests completed on the connection
	// and the file data they moved.
	Requests uint64
	Bytes    uint64
	// Polled and Interrupted are its I/O completions by mode; Switches is
	// how often Auto changed its mind, Load the moving average of pending
	// requests it decides by (auto.go; 0 in the fixed modes).
	Polled      uint64
	Interrupted uint64
	Switches    uint64
	Load        float64
}

func (c *conn) info() ConnInfo {
	mode := c.cl.cfg.Completion.String()
	if c.cl.cfg.Completion == Auto {
		m := Interrupt
		if c.auto.busy.Load() {
			m = Polling
		}
		mode += "/" + m.String()
	}
	return ConnInfo{
		Provider: c.tc.Provider(), Carrier: transport.CarrierOf(c.tc), LocalAddr: c.tc.LocalAddr(), RemoteAddr: c.tc.RemoteAddr(),
		Credits: c.credits.Limit(), Alive: c.alive(), Completion: mode,
		Requests: c.ctr.requests.Load(), Bytes: c.ctr.bytes.Load(),
		Polled: c.ctr.polled.Load(), Interrupted: c.ctr.interrupted.Load(), Switches: c.auto.switches.Load(),
		Load: float64(c.auto.load.Load()) / loadOne,
	}
}
