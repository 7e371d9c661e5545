package client

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// lyingProvider is the soft provider whose connections, once armed, tamper
// with the next STATUS_RESPONSE reporting exactly match bytes: inflate
// says one byte more than the server read, twice hands it to the client a
// second time. A hostile (or broken) server, seen from the client.
type lyingProvider struct {
	transport.Provider
	match   uint32
	inflate atomic.Bool
	twice   atomic.Bool
	fired   atomic.Int32
}

type lyingConn struct {
	transport.Conn
	p    *lyingProvider
	mu   sync.Mutex
	recv map[uint64]transport.Segment // posted receives by ID
	cq   lyingCQ
}

type lyingCQ struct {
	transport.CQ
	c *lyingConn
}

func (p *lyingProvider) Dial(ctx context.Context, addr string, cfg transport.Config) (transport.Conn, error) {
	tc, err := p.Provider.Dial(ctx, addr, cfg)
	if err != nil {
		return nil, err
	}
	c := &lyingConn{Conn: tc, p: p, recv: map[uint64]transport.Segment{}}
	c.cq = lyingCQ{CQ: tc.CQ(), c: c}
	return c, nil
}

func (c *lyingConn) PostRecv(wrs ...transport.RecvWR) error {
	c.mu.Lock()
	for _, wr := range wrs {
		c.recv[wr.ID] = wr.Buf
	}
	c.mu.Unlock()
	return c.Conn.PostRecv(wrs...)
}

func (c *lyingConn) CQ() transport.CQ { return &c.cq }

func (q *lyingCQ) Poll(out []transport.Completion) int { return q.c.tamper(out, q.CQ.Poll(out)) }

func (q *lyingCQ) Wait(ctx context.Context, out []transport.Completion) (int, error) {
	n, err := q.CQ.Wait(ctx, out)
	return q.c.tamper(out, n), err
}

// tamper rewrites out[:n] as armed and returns its new length.
func (c *lyingConn) tamper(out []transport.Completion, n int) int {
	for i := 0; i < n; i++ {
		wc := out[i]
		if wc.Op != transport.OpRecv || wc.HasImm || wc.Err() != nil || wc.Len != protocol.StatusResponseSize {
			continue
		}
		c.mu.Lock()
		seg := c.recv[wc.ID]
		c.mu.Unlock()
		b := seg.Region.Bytes()[seg.Offset : seg.Offset+protocol.StatusResponseSize]
		r, err := protocol.DecodeStatusResponse(b)
		if err != nil || r.IsDeltaCredit() || r.Ios.Information != c.p.match {
			continue
		}
		switch {
		case c.p.inflate.CompareAndSwap(true, false):
			r.Ios.Information++
			r.Put(b)
			c.p.fired.Add(1)
		case n < len(out) && c.p.twice.CompareAndSwap(true, false):
			copy(out[i+2:n+1], out[i+1:n])
			out[i+1] = wc
			n++
			i++
			c.p.fired.Add(1)
		}
	}
	return n
}

// slotsBack waits until every slot of cl's live connections is free again
// (its data buffer back in the pool with it).
func slotsBack(t *testing.T, cl *Client) {
	t.Helper()
	waitNone(t, "slots still taken", func() int {
		out := 0
		for _, c := range cl.conns {
			if c.alive() {
				out += int(c.nslots.Load()) - len(c.free)
			}
		}
		return out
	})
}

// A server answering a split read's piece with more bytes than asked
// fails the read (an invalid response, never bytes of the buffer beyond
// the piece), and one answering a piece twice ends that connection; in
// both the read returns no wrong data and every slot of the live
// connections comes back.
func TestSplitReadHostileAnswers(t *testing.T) {
	e := newEnv(t, server.Config{NoImmediate: true}) // interrupt-mode reads answer with a STATUS_RESPONSE
	content := randomBytes(2 << 20)
	for _, how := range []string{"inflate", "twice"} {
		t.Run(how, func(t *testing.T) {
			s := e.session()
			lp := &lyingProvider{Provider: soft.New(soft.Options{}), match: 512 << 10}
			cfg := s.config(Interrupt)
			cfg.Providers = []transport.Provider{lp}
			cfg.Connections = 2
			cl := s.client(t, cfg)
			f, _ := s.splitFile(t, cl, "f", content)
			waitIdle(t, cl)
			splits := cl.Stats().SplitReads
			if how == "inflate" {
				lp.inflate.Store(true)
			} else {
				lp.twice.Store(true)
			}
			b, err := f.ReadBuf(ctxT(t), make([]byte, 1<<20), 0)
			if cl.Stats().SplitReads == splits {
				t.Fatal("not split")
			}
			if lp.fired.Load() != 1 {
				t.Fatalf("tampered with %d answers, want 1", lp.fired.Load())
			}
			switch {
			case how == "inflate" && !errors.Is(err, protocol.StatusInvalidNetworkResp):
				t.Errorf("a piece answered with a byte too many: %v, want an invalid network response", err)
			case err == nil:
				if got := joined(t, b); !bytes.Equal(got, content[:1<<20]) {
					t.Errorf("wrong data (%d bytes)", len(got))
				}
				b.Release()
			}
			slotsBack(t, cl)
		})
	}
}
