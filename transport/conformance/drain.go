package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// Drain collects c's completions until its CQ ends with ErrClosed, as it
// must after Close or a connection failure, and returns them. Another
// error from Wait, or no end within d, fails the test.
func Drain(t testing.TB, c transport.Conn, d time.Duration) []transport.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var all []transport.Completion
	buf := make([]transport.Completion, 16)
	for {
		n, err := c.CQ().Wait(ctx, buf)
		all = append(all, buf[:n]...)
		if errors.Is(err, transport.ErrClosed) {
			return all
		}
		if err != nil {
			t.Fatalf("draining: %v after %d completions", err, len(all))
		}
	}
}
