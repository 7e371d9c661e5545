package transport

import (
	"errors"
	"testing"
)

func TestSRQUsers(t *testing.T) {
	var u SRQUsers
	if err := u.Attach(); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if err := u.CanClose(); !errors.Is(err, ErrInUse) {
		t.Fatalf("CanClose with a user = %v, want ErrInUse", err)
	}
	u.Detach()
	if err := u.CanClose(); err != nil {
		t.Fatalf("CanClose with none = %v", err)
	}
	u.MarkClosed()
	if !u.Closed() {
		t.Fatal("Closed after MarkClosed = false")
	}
	if err := u.CanClose(); !errors.Is(err, ErrClosed) {
		t.Fatalf("CanClose again = %v, want ErrClosed", err)
	}
	if err := u.Attach(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Attach after close = %v, want ErrClosed", err)
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
	if CheckSRQLimit(5, 4) == nil || CheckSRQLimit(-1, 4) == nil || CheckSRQLimit(4, 4) != nil {
		t.Error("CheckSRQLimit accepts 5 or -1 of 4, or refuses 4 of 4")
	}
}
