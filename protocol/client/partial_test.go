package client

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// partialProvider is the soft provider whose connections, once armed,
// post only the first work request of the next chain and fail the rest,
// as ibv_post_send does when it rejects one in the middle of a chain.
type partialProvider struct {
	transport.Provider
	armed atomic.Bool
	fired atomic.Pointer[partialConn]
	slot  atomic.Int64 // the fired chain's slot (its last SEND's ID)
}

type partialConn struct {
	transport.Conn
	p *partialProvider
}

func (p *partialProvider) Dial(ctx context.Context, addr string, cfg transport.Config) (transport.Conn, error) {
	c, err := p.Provider.Dial(ctx, addr, cfg)
	if err != nil {
		return nil, err
	}
	return &partialConn{Conn: c, p: p}, nil
}

func (c *partialConn) Post(wrs ...transport.SendWR) error {
	if len(wrs) > 1 && c.p.armed.CompareAndSwap(true, false) {
		if err := c.Conn.Post(wrs[0]); err != nil {
			return err
		}
		c.p.slot.Store(int64(wrs[len(wrs)-1].ID))
		c.p.fired.Store(c)
		return errors.New("partial: posted 1 of a chain")
	}
	return c.Conn.Post(wrs...)
}

// TestPartialPostEndsConnection: a fragmented write whose chain was posted
// in part ends its connection and keeps its slot: were the slot freed, its
// data buffer would go back to the pool (and to the next request) while
// the adapter may still be reading it.
func TestPartialPostEndsConnection(t *testing.T) {
	e := newEnv(t, server.Config{MaxRecvBufferSize: 2048, MaxRdmaWindowSize: 64 << 10})
	s := e.session()
	pp := &partialProvider{Provider: soft.New(soft.Options{})}
	cfg := s.config(Interrupt)
	cfg.Providers = []transport.Provider{pp}
	cfg.Connections = 1
	cl := s.client(t, cfg)
	key, _ := s.file(t, "f", testutil.RandBytes(64<<10))
	f := s.register(t, cl, key, protocol.FileNoIntermediateBuffering)

	pp.armed.Store(true)
	if _, err := f.WriteAt(ctxT(t), testutil.RandBytes(16<<10), 0); err == nil {
		t.Fatal("a write whose chain was posted in part succeeded")
	}
	pc := pp.fired.Load()
	if pc == nil {
		t.Fatal("the write was not sent as a chain")
	}
	var c *conn
	for _, x := range cl.conns {
		if x.tc == transport.Conn(pc) {
			c = x
		}
	}
	if c == nil {
		t.Fatal("no client connection has the transport connection that posted in part")
	}
	if c.alive() {
		t.Error("the connection lives on after a chain was posted in part")
	}
	sl := c.slotAt(int(pp.slot.Load()))
	if sl == nil {
		t.Fatalf("no slot %d", pp.slot.Load())
	}
	if sl.buf == nil || sl.state.Load() == slotIdle {
		t.Error("the slot of a chain posted in part was freed, its data buffer back in the pool")
	}
}
