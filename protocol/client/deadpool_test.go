package client

import (
	"errors"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
)

// TestReadBufferOnDeadConn: a READ (or a large WRITE) that took its slot while the connection
// was alive and its buffer after the connection died (the reaper dropped
// the pool) fails as a lost connection, which a mount's reconnect replays
// — not as transport.ErrClosed, which reached a reader as EIO (fs's
// TestSplitReadThroughRestart, 1 run in ~30 beside drop_caches).
func TestReadBufferOnDeadConn(t *testing.T) {
	e := newEnv(t, server.Config{})
	_, cl := e.oneConn(t, Interrupt)
	c := cl.conns[0]
	sl, err := c.beginN(ctxT(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	wsl, err := c.beginN(ctxT(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	c.die(errors.New("test: connection killed"))
	testutil.Eventually(t, "the pool dropped", 10*time.Second, func() bool {
		r, err := c.pool.Get(4096)
		if err == nil {
			c.pool.Put(r)
		}
		return err != nil
	})
	if _, err := c.readBuffer(sl, 64<<10); !protocol.IsConnectionLost(err) {
		t.Fatalf("a READ's buffer on a dead connection: %v, want a lost connection", err)
	}
	// A large WRITE's buffer the same (writeArea).
	if _, _, err := c.writeArea(wsl, 2*inlineWrite); !protocol.IsConnectionLost(err) {
		t.Fatalf("a WRITE's buffer on a dead connection: %v, want a lost connection", err)
	}
}
