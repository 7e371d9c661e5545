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

// Close is SRQ.Close's bookkeeping around destroy, the provider's
// teardown: ErrClosed a second time and ErrInUse while a connection still
// uses the queue, without calling destroy; otherwise destroy's error, and
// the queue counts as destroyed only when destroy succeeded.
func (u *SRQUsers) Close(destroy func() error) error {
	if u.closed {
		return ErrClosed
	}
	if u.n > 0 {
		return ErrInUse
	}
	if err := destroy(); err != nil {
		return err
	}
	u.closed = true
	return nil
}

// CheckLimit is SRQ.SetLimit's check: ErrClosed once the queue is
// destroyed, an error for n outside 0..depth.
func (u *SRQUsers) CheckLimit(n, depth int) error {
	if u.closed {
		return ErrClosed
	}
	if n < 0 || n > depth {
		return fmt.Errorf("SRQ limit %d outside 0..%d", n, depth)
	}
	return nil
}
