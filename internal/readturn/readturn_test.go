package readturn

import (
	"testing"
	"time"
)

// fakeConn records the read deadlines set.
type fakeConn struct{ set []time.Time }

func (f *fakeConn) SetReadDeadline(t time.Time) error { f.set = append(f.set, t); return nil }

// past reports whether the deadline last set is in the past (a read now
// would fail).
func (f *fakeConn) past() bool { return len(f.set) > 0 && !f.set[len(f.set)-1].IsZero() }

func TestInterruptRules(t *testing.T) {
	var nc fakeConn
	i := New(&nc)

	// Between reads: remembered, no deadline; the next read is not started.
	n := i.Begin()
	i.Interrupt(n)
	if len(nc.set) != 0 || i.Enter() {
		t.Fatalf("interrupted between reads: deadlines %v, Enter true", nc.set)
	}
	i.End()

	// In a read: the deadline goes into the past once, Leave clears it
	// and reports the end of the turn.
	n = i.Begin()
	if !i.Enter() {
		t.Fatal("a fresh turn cannot read")
	}
	i.Interrupt(n)
	i.Interrupt(n)
	if len(nc.set) != 1 || !nc.past() {
		t.Fatalf("interrupted in a read: deadlines %v", nc.set)
	}
	if !i.Leave() || nc.past() {
		t.Fatalf("Leave: deadline %v left behind", nc.set)
	}
	i.End()

	// A late interruption (of a turn that ended, or an earlier one) is
	// stale: the next turn reads on, no deadline set.
	late := n
	n = i.Begin()
	i.Interrupt(late)
	if !i.Enter() || !i.Reading() {
		t.Fatal("a stale interruption ended the next turn")
	}
	if i.Leave() || len(nc.set) != 2 {
		t.Fatalf("a stale interruption: deadlines %v", nc.set)
	}
	i.End()
	i.Interrupt(n) // after End
	n = i.Begin()
	if !i.Enter() {
		t.Fatal("an interruption after End ended the next turn")
	}
	i.Leave()
	i.End()
}
