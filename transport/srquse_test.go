package transport

import (
	"errors"
	"testing"
)

func TestSRQUsers(t *testing.T) {
	var u SRQUsers
	destroyed := 0
	destroy := func() error { destroyed++; return nil }
	if err := u.Attach(); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if err := u.Close(destroy); !errors.Is(err, ErrInUse) || destroyed != 0 {
		t.Fatalf("Close with a user = %v (destroyed %d), want ErrInUse", err, destroyed)
	}
	u.Detach()
	failed := errors.New("teardown failed")
	if err := u.Close(func() error { return failed }); err != failed || u.Closed() {
		t.Fatalf("Close with a failing destroy = %v, closed %v; want its error, not closed", err, u.Closed())
	}
	if err := u.Close(destroy); err != nil || destroyed != 1 {
		t.Fatalf("Close with none = %v (destroyed %d)", err, destroyed)
	}
	if !u.Closed() {
		t.Fatal("Closed after Close = false")
	}
	if err := u.Close(destroy); !errors.Is(err, ErrClosed) || destroyed != 1 {
		t.Fatalf("Close again = %v (destroyed %d), want ErrClosed", err, destroyed)
	}
	if err := u.Attach(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Attach after close = %v, want ErrClosed", err)
	}
	if err := u.CheckLimit(0, 4); !errors.Is(err, ErrClosed) {
		t.Fatalf("CheckLimit after close = %v, want ErrClosed", err)
	}
}

func TestSRQConfigQueueDepth(t *testing.T) {
	for _, tc := range []struct {
		depth, want int
		fail        bool
	}{{0, DefaultSRQDepth, false}, {7, 7, false}, {-1, 0, true}} {
		got, err := SRQConfig{Depth: tc.depth}.QueueDepth()
		if got != tc.want || (err != nil) != tc.fail {
			t.Errorf("QueueDepth(%d) = %d, %v; want %d, fail %v", tc.depth, got, err, tc.want, tc.fail)
		}
	}
	var u SRQUsers
	if u.CheckLimit(5, 4) == nil || u.CheckLimit(-1, 4) == nil || u.CheckLimit(4, 4) != nil {
		t.Error("CheckLimit accepts 5 or -1 of 4, or refuses 4 of 4")
	}
}
