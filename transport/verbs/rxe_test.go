package verbs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
)

// TestLengthErrorSoftRoCE is the conformance case LengthError as Soft-RoCE
// can pass it: the receive too short for a SEND fails (rxe: with a local QP
// operation error, not a local length error), the receive behind it is
// flushed, the sender sees the peer refuse the SEND, its own receive is
// flushed, and both ends are then in error.
func TestLengthErrorSoftRoCE(t *testing.T) {
	addr := usable(t)
	if !softRoCE(t) {
		t.Skip("SKIP: not Soft-RoCE; the conformance case LengthError runs whole on this device")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cli, srv := connectPair(t, addr)
	alloc := func(c transport.Conn, n int) transport.Region {
		r, err := c.Domain().Alloc(n, transport.AccessLocal)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	conformance.StartLengthError(t, cli, srv)
	collect := func(c transport.Conn, n int) []transport.Completion { return waitN(ctx, t, c, n) }
	ss := collect(srv, 2)
	if ss[0].ID != 1 || ss[0].Op != transport.OpRecv || ss[0].Status == transport.StatusSuccess || ss[0].Status == transport.StatusFlushed {
		t.Errorf("short receive: %+v, want a failed receive 1", ss[0])
	}
	t.Logf("short receive completed with %v (the IB spec says %v)", ss[0].Status, transport.StatusLocalLength)
	if ss[1].ID != 2 || ss[1].Status != transport.StatusFlushed {
		t.Errorf("next receive: %+v, want flushed", ss[1])
	}
	cs := collect(cli, 2)
	if cs[0].Op == transport.OpRecv {
		cs[0], cs[1] = cs[1], cs[0]
	}
	if cs[0].ID != 5 || cs[0].Status != transport.StatusRemoteInvalidRequest {
		t.Errorf("long send: %+v, want remote invalid request", cs[0])
	}
	if cs[1].ID != 3 || cs[1].Status != transport.StatusFlushed {
		t.Errorf("initiator's receive: %+v, want flushed", cs[1])
	}
	// Both ends in error: nothing new succeeds.
	for side, c := range map[string]transport.Conn{"client": cli, "server": srv} {
		probe := alloc(c, 64)
		if err := c.PostRecv(transport.RecvWR{ID: 9, Buf: transport.Whole(probe)}); err == nil {
			if got := collect(c, 1)[0]; got.ID != 9 || got.Status != transport.StatusFlushed {
				t.Errorf("%s: receive posted after the error: %+v, want flushed", side, got)
			}
		} else if !errors.Is(err, transport.ErrClosed) {
			t.Errorf("%s: PostRecv after the error: %v", side, err)
		}
	}
}
