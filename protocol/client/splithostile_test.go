package client

import (
	"bytes"
	"context"
	"errors"
	"io"
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

// refusingProvider is the soft provider whose connections, once armed with
// n, refuse the n-th READ posted after (counted over all of them): the
// post fails, nothing goes out, the connection lives on, as when the
// adapter rejects a work request.
type refusingProvider struct {
	transport.Provider
	left    atomic.Int32
	refused atomic.Int32
}

type refusingConn struct {
	transport.Conn
	p *refusingProvider
}

var errRefused = errors.New("refusing: READ not posted")

func (p *refusingProvider) Dial(ctx context.Context, addr string, cfg transport.Config) (transport.Conn, error) {
	c, err := p.Provider.Dial(ctx, addr, cfg)
	if err != nil {
		return nil, err
	}
	return &refusingConn{Conn: c, p: p}, nil
}

func (c *refusingConn) Post(wrs ...transport.SendWR) error {
	if len(wrs) == 1 && len(wrs[0].SGL) == 1 {
		seg := wrs[0].SGL[0]
		h, err := protocol.DecodeHeader(seg.Region.Bytes()[seg.Offset : seg.Offset+seg.Length])
		if err == nil && h.Opcode == protocol.OpRead && c.p.left.Load() > 0 && c.p.left.Add(-1) == 0 {
			c.p.refused.Add(1)
			return errRefused
		}
	}
	return c.Conn.Post(wrs...)
}

// A split read whose later piece cannot be posted answers as one READ
// would when an earlier piece ended it (short, or at end of file): with
// that piece's bytes, or io.EOF; only a read that no earlier piece ended
// fails with the posting error. A read whose first piece cannot be posted
// was not split: it reads as one READ. Every slot comes back.
func TestSplitReadPieceNotPosted(t *testing.T) {
	const piece = 344 << 10 // 1 MiB in three pieces: 344, 344 and 336 KiB
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			for _, tc := range []struct {
				name   string
				size   int   // the file's
				off    int64 // the 1 MiB read's
				refuse int32 // the READ refused, from 1
				want   int   // bytes; 0: io.EOF; -1: the refusal
				split  bool  // counted as a split read
			}{
				{"short first, second refused", 100 << 10, 0, 2, 100 << 10, false},
				{"first at end of file, second refused", 1 << 20, 1 << 20, 2, 0, false},
				{"first full, second short, third refused", 500 << 10, 0, 3, 500 << 10, true},
				{"first full, second at end of file, third refused", piece, 0, 3, piece, true},
				{"first full, second refused", 2 << 20, 0, 2, -1, false},
				{"second full, third refused", 2 << 20, 0, 3, -1, true},
				{"first refused", 2 << 20, 4096, 1, 1 << 20, false},
				{"first refused, at end of file", 1 << 20, 1 << 20, 1, 0, false},
			} {
				// A server and client of their own: the refusal ends a
				// connection, and another client's would move credits.
				e := newEnv(t, server.Config{})
				s := e.session()
				rp := &refusingProvider{Provider: soft.New(soft.Options{})}
				cfg := s.config(mode)
				cfg.Providers = []transport.Provider{rp}
				cfg.Connections, cfg.SplitRead = 3, 256<<10
				cl := s.client(t, cfg)
				content := randomBytes(tc.size)
				f, _ := s.splitFile(t, cl, tc.name, content)
				waitIdle(t, cl)
				splits := cl.Stats().SplitReads
				rp.refused.Store(0)
				rp.left.Store(tc.refuse)
				b, err := f.ReadBuf(ctxT(t), make([]byte, 1<<20), tc.off)
				rp.left.Store(0)
				if rp.refused.Load() != 1 {
					t.Fatalf("%s: refused %d READs, want 1", tc.name, rp.refused.Load())
				}
				if d := cl.Stats().SplitReads - splits; d != 0 == !tc.split {
					t.Errorf("%s: SplitReads moved by %d, want split %v", tc.name, d, tc.split)
				}
				switch {
				case tc.want < 0:
					if !errors.Is(err, errRefused) {
						t.Errorf("%s: (%v, %v), want the refusal", tc.name, b, err)
					}
				case tc.want == 0:
					if b != nil || err != io.EOF {
						t.Errorf("%s: (%v, %v), want (nil, io.EOF)", tc.name, b, err)
					}
				case err != nil:
					t.Errorf("%s: %v, want %d bytes", tc.name, err, tc.want)
				default:
					got := joined(t, b)
					if !bytes.Equal(got, content[tc.off:tc.off+int64(tc.want)]) {
						t.Errorf("%s: %d bytes, want %d", tc.name, len(got), tc.want)
					}
				}
				if err == nil && b != nil {
					b.Release()
				}
				slotsBack(t, cl)
				waitIdle(t, cl)
			}
		})
	}
}
