package servertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/transport"
)

// Peer is a hand-driven LWIO client on a real transport connection: the
// test writes every message and reads every answer itself, transcript
// style, so it can also send what no well-behaved client would. The
// server's tests and the hostile tests (test/hostile) build their peers
// on it.
type Peer struct {
	T     testing.TB
	Conn  transport.Conn
	Shape PeerShape
	Send  transport.Region // messages are copied here
	Recv  transport.Region // Shape.Recvs receive buffers of Shape.RecvSize
	Data  transport.Region // remote-writable: AUTH params, read data, status blocks
	// Closed is set once the connection is seen to end; Sent counts the
	// SEND completions Next passed over.
	Closed bool
	Sent   int
	queue  []transport.Completion
}

// PeerShape sizes a Peer's memory.
type PeerShape struct {
	Recvs, RecvSize int
	SendSize        int
	DataSize        int
}

// DialPeer connects to addr through prov (failing the test if it cannot
// within 5s), closes the connection when the test ends, and posts every
// receive.
func DialPeer(t testing.TB, prov transport.Provider, addr string, shape PeerShape) *Peer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tc, err := prov.Dial(ctx, addr, transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	p := NewPeer(t, tc, shape)
	for i := range shape.Recvs {
		p.PostRecv(i)
	}
	return p
}

// NewPeer registers a peer's memory on tc; it posts no receive.
func NewPeer(t testing.TB, tc transport.Conn, shape PeerShape) *Peer {
	t.Helper()
	p := &Peer{T: t, Conn: tc, Shape: shape}
	dom := tc.Domain()
	p.Send = Alloc(t, dom, shape.SendSize, transport.AccessLocal)
	p.Recv = Alloc(t, dom, shape.Recvs*shape.RecvSize, transport.AccessLocal)
	p.Data = Alloc(t, dom, shape.DataSize, transport.AccessLocal|transport.AccessRemoteWrite)
	return p
}

// Alloc registers n bytes on dom with access a; the test fails if it
// cannot.
func Alloc(t testing.TB, dom transport.Domain, n int, a transport.Access) transport.Region {
	t.Helper()
	r, err := dom.Alloc(n, a)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// PostRecv posts receive buffer i (again); a closed connection is not an
// error.
func (p *Peer) PostRecv(i int) {
	err := p.Conn.PostRecv(transport.RecvWR{ID: uint64(i), Buf: transport.Segment{Region: p.Recv, Offset: i * p.Shape.RecvSize, Length: p.Shape.RecvSize}})
	if err != nil && !errors.Is(err, transport.ErrClosed) {
		p.T.Fatal(err)
	}
}

// Post sends msg, copied into the send region, as one SEND.
func (p *Peer) Post(msg []byte) error {
	n := copy(p.Send.Bytes(), msg)
	if n < len(msg) {
		p.T.Fatalf("message of %d bytes does not fit the send buffer", len(msg))
	}
	return p.Conn.Post(transport.SendWR{ID: 1, Op: transport.OpSend, SGL: []transport.Segment{{Region: p.Send, Length: n}}})
}

// Next returns the next receive completion, passing over SEND
// completions; ok is false when the connection ended instead (a failed
// completion, or the queue closed). The test fails if nothing comes
// within d.
func (p *Peer) Next(d time.Duration) (transport.Completion, bool) {
	p.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		for len(p.queue) > 0 {
			wc := p.queue[0]
			p.queue = p.queue[1:]
			if wc.Status != transport.StatusSuccess {
				p.Closed = true
				return wc, false
			}
			if wc.Op == transport.OpRecv {
				return wc, true
			}
			p.Sent++
		}
		var wcs [64]transport.Completion
		n, err := p.Conn.CQ().Wait(ctx, wcs[:])
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				p.T.Fatalf("no completion within %v", d)
			}
			p.Closed = true
			return transport.Completion{}, false
		}
		p.queue = append(p.queue, wcs[:n]...)
	}
}

// StatusResponse decodes the STATUS_RESPONSE that wc received and posts
// its receive buffer again; immediate data or a malformed response fails
// the test.
func (p *Peer) StatusResponse(why string, wc transport.Completion) protocol.StatusResponse {
	p.T.Helper()
	if wc.HasImm {
		p.T.Fatalf("%s: got immediate data %#x, want a STATUS_RESPONSE", why, wc.Imm)
	}
	off := int(wc.ID) * p.Shape.RecvSize
	r, err := protocol.DecodeStatusResponse(p.Recv.Bytes()[off : off+wc.Len])
	if err != nil {
		p.T.Fatalf("%s: malformed status response: %v", why, err)
	}
	p.PostRecv(int(wc.ID))
	return r
}

// WantImm expects an RDMA WRITE WITH IMMEDIATE (a full read completed)
// within 10s and returns its immediate data.
func (p *Peer) WantImm(why string) uint32 {
	p.T.Helper()
	wc, ok := p.Next(10 * time.Second)
	if !ok {
		p.T.Fatalf("%s: connection ended (%v), want immediate data", why, wc.Status)
	}
	if !wc.HasImm {
		p.T.Fatalf("%s: got a %d-byte SEND, want immediate data", why, wc.Len)
	}
	p.PostRecv(int(wc.ID))
	return wc.Imm
}

// WantClosed expects the connection to end, within 10s, with no message
// from the server; it returns how long that took.
func (p *Peer) WantClosed(why string) time.Duration {
	p.T.Helper()
	start := time.Now()
	wc, ok := p.Next(10 * time.Second)
	if ok {
		p.T.Fatalf("%s: got a %d-byte message (imm %v), want the connection to end", why, wc.Len, wc.HasImm)
	}
	return time.Since(start)
}
