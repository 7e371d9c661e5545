package fs

import (
	"context"
	"sync/atomic"

	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// Stats are a mount's own counters, kept across reconnects: the LWIO
// client engine's (every Client a Dial makes counts into LWIO), the file
// data carried by the session channel instead (the fallback data path, and
// small appends), and the reconnects. A
// mount makes one and hands it to DialConfig.Stats and
// Reconnector.CountInto; `lwio stat` reads it.
type Stats struct {
	LWIO client.Counters

	sessionRead    atomic.Uint64
	sessionWritten atomic.Uint64
	reconnects     atomic.Uint64
}

// SessionBytes are the bytes of file data read and written over the
// session channel.
func (s *Stats) SessionBytes() (read, written uint64) {
	return s.sessionRead.Load(), s.sessionWritten.Load()
}

// Reconnects is how often the mount dialled the server again after losing
// it.
func (s *Stats) Reconnects() uint64 { return s.reconnects.Load() }

// countRead and countWrite add n to the session channel's figures; a nil
// Stats counts nothing.
func (s *Stats) countRead(n int) {
	if s != nil && n > 0 {
		s.sessionRead.Add(uint64(n))
	}
}

func (s *Stats) countWrite(n int) {
	if s != nil && n > 0 {
		s.sessionWritten.Add(uint64(n))
	}
}

// countedIO is a session channel's HandleIO that counts the file data it
// carries.
type countedIO struct {
	io HandleIO
	st *Stats
}

func (c countedIO) ReadAt(ctx context.Context, h session.Handle, p []byte, off int64) (int, error) {
	n, err := c.io.ReadAt(ctx, h, p, off)
	c.st.countRead(n)
	return n, err
}

func (c countedIO) WriteAt(ctx context.Context, h session.Handle, p []byte, off int64) (int, error) {
	n, err := c.io.WriteAt(ctx, h, p, off)
	c.st.countWrite(n)
	return n, err
}
