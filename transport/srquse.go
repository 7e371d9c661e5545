package transport

import "fmt"

// DefaultSRQDepth is SRQConfig.Depth's zero value.
const DefaultSRQDepth = 4096

// QueueDepth is c.Depth, DefaultSRQDepth for 0; an error for a negative
// depth.
func (c SRQConfig) QueueDepth() (int, error) {
	switch {
	case c.Depth < 0:
		return 0, fmt.Errorf("SRQ depth %d", c.Depth)
	case c.Depth == 0:
		return DefaultSRQDepth, nil
	}
	return c.Depth, nil
}

// SRQUsers is the bookkeeping every provider's SRQ keeps alike: how many
// connections take receives from it, and whether it is destroyed. It has
// no lock of its own: its methods run under the SRQ's.
type SRQUsers struct {
	n      int
	closed bool
}

// Attach counts one more connection taking receives; ErrClosed once the
// queue is destroyed.
func (u *SRQUsers) Attach() error {
	if u.closed {
		return ErrClosed
	}
	u.n++
	return nil
}

// Detach counts one connection fewer.
func (u *SRQUsers) Detach() { u.n-- }

// Closed reports whether the queue is destroyed.
func (u *SRQUsers) Closed() bool { return u.closed }

// CanClose is what SRQ.Close returns before it destroys anything:
// ErrClosed a second time, ErrInUse while a connection still uses the
// queue, nil when it may go.
func (u *SRQUsers) CanClose() error {
	if u.closed {
		return ErrClosed
	}
	if u.n > 0 {
		return ErrInUse
	}
	return nil
}

// MarkClosed records that the queue is destroyed.
func (u *SRQUsers) MarkClosed() { u.closed = true }

// CheckSRQLimit is SRQ.SetLimit's check of n against the queue's depth.
func CheckSRQLimit(n, depth int) error {
	if n < 0 || n > depth {
		return fmt.Errorf("SRQ limit %d outside 0..%d", n, depth)
	}
	return nil
}
