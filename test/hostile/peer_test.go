package hostile

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/test/hostile/rig"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// peer is a hand-driven LWIO client on a real softrdma connection: the
// test writes every message and reads every answer itself, so it can send
// what no well-behaved client would.
type peer struct {
	t     testing.TB
	tc    transport.Conn
	send  transport.Region // messages are copied here
	recv  transport.Region // peerRecvs receive buffers
	data  transport.Region // remote-writable: AUTH params, read data
	queue []transport.Completion
	sent  int // SEND completions seen
}

const (
	peerRecvs    = 64
	peerRecvSize = 64
	peerDataSize = 1 << 20
)

// pattern fills the peer's remote-writable memory, so that any byte the
// server RDMA-writes there shows.
const pattern = 0xA5

// dialPeer connects to the server's softrdma listener.
func dialPeer(t testing.TB, s *rig.Server) *peer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tc, err := soft.New(soft.Options{RNRTimeout: 500 * time.Millisecond}).Dial(ctx, s.SoftAddr, transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	p := &peer{t: t, tc: tc}
	dom := tc.Domain()
	p.send = alloc(t, dom, 4<<20, transport.AccessLocal)
	p.recv = alloc(t, dom, peerRecvs*peerRecvSize, transport.AccessLocal)
	p.data = alloc(t, dom, peerDataSize, transport.AccessLocal|transport.AccessRemoteWrite)
	fill(p.data.Bytes(), pattern)
	for i := 0; i < peerRecvs; i++ {
		p.postRecv(i)
	}
	return p
}

func alloc(t testing.TB, dom transport.Domain, n int, a transport.Access) transport.Region {
	t.Helper()
	r, err := dom.Alloc(n, a)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// untouched reports whether the peer's remote-writable memory still holds
// the pattern in [off, off+n).
func (p *peer) untouched(off, n int) bool {
	for _, b := range p.data.Bytes()[off : off+n] {
		if b != pattern {
			return false
		}
	}
	return true
}

func (p *peer) postRecv(i int) {
	err := p.tc.PostRecv(transport.RecvWR{ID: uint64(i), Buf: transport.Segment{Region: p.recv, Offset: i * peerRecvSize, Length: peerRecvSize}})
	if err != nil && !errors.Is(err, transport.ErrClosed) {
		p.t.Fatal(err)
	}
}

// sendMsg sends msg as one SEND.
func (p *peer) sendMsg(msg []byte) error {
	n := copy(p.send.Bytes(), msg)
	if n < len(msg) {
		p.t.Fatalf("message of %d bytes does not fit the send buffer", len(msg))
	}
	return p.tc.Post(transport.SendWR{ID: 1, Op: transport.OpSend, SGL: []transport.Segment{{Region: p.send, Length: n}}})
}

// sendChain sends each message as its own SEND, in one post.
func (p *peer) sendChain(msgs [][]byte) error {
	wrs := make([]transport.SendWR, len(msgs))
	off := 0
	for i, m := range msgs {
		n := copy(p.send.Bytes()[off:], m)
		wrs[i] = transport.SendWR{ID: uint64(i + 1), Op: transport.OpSend, SGL: []transport.Segment{{Region: p.send, Offset: off, Length: n}}}
		off += n
	}
	return p.tc.Post(wrs...)
}

func (p *peer) sendHeader(h protocol.Header) error { return p.sendMsg(h.Append(nil)) }

// next returns the next receive completion; ok is false when the
// connection ended instead (a failed completion, or the queue closed).
func (p *peer) next(d time.Duration) (transport.Completion, bool) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		for len(p.queue) > 0 {
			wc := p.queue[0]
			p.queue = p.queue[1:]
			if wc.Status != transport.StatusSuccess {
				return wc, false
			}
			if wc.Op == transport.OpRecv {
				return wc, true
			}
			p.sent++
		}
		var wcs [64]transport.Completion
		n, err := p.tc.CQ().Wait(ctx, wcs[:])
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				p.t.Fatalf("no completion within %v", d)
			}
			return transport.Completion{}, false
		}
		p.queue = append(p.queue, wcs[:n]...)
	}
}

// response returns the next STATUS_RESPONSE, skipping delta-credit
// messages; ok is false when the connection ended instead.
func (p *peer) response() (protocol.StatusResponse, bool) {
	p.t.Helper()
	for {
		wc, ok := p.next(10 * time.Second)
		if !ok {
			return protocol.StatusResponse{}, false
		}
		if wc.HasImm {
			p.t.Fatalf("immediate data %#x, want a STATUS_RESPONSE", wc.Imm)
		}
		buf := p.recv.Bytes()[int(wc.ID)*peerRecvSize : int(wc.ID)*peerRecvSize+wc.Len]
		r, err := protocol.DecodeStatusResponse(buf)
		if err != nil {
			p.t.Fatalf("server sent a malformed status response: %v", err)
		}
		p.postRecv(int(wc.ID))
		if r.Cookie == protocol.DeltaCreditCookie && r.Ios.Status == protocol.NotifyCredit {
			continue
		}
		return r, true
	}
}

func (p *peer) wantResponse(why string) protocol.StatusResponse {
	p.t.Helper()
	r, ok := p.response()
	if !ok {
		p.t.Fatalf("%s: connection ended, want a response", why)
	}
	return r
}

// wantImm expects an RDMA WRITE WITH IMMEDIATE (a full read completed).
func (p *peer) wantImm(why string) uint32 {
	p.t.Helper()
	wc, ok := p.next(10 * time.Second)
	if !ok {
		p.t.Fatalf("%s: connection ended, want immediate data", why)
	}
	if !wc.HasImm {
		p.t.Fatalf("%s: got a %d-byte SEND, want immediate data", why, wc.Len)
	}
	p.postRecv(int(wc.ID))
	return wc.Imm
}

// wantClosed expects the connection to end with no message from the
// server; it returns how long that took.
func (p *peer) wantClosed(why string) time.Duration {
	p.t.Helper()
	start := time.Now()
	for {
		wc, ok := p.next(10 * time.Second)
		if !ok {
			return time.Since(start)
		}
		p.t.Fatalf("%s: got a %d-byte message (imm %v), want the connection to end", why, wc.Len, wc.HasImm)
	}
}

// authParams are a well-formed client AUTH's parameters for key.
func authParams(key [16]byte, credits int) protocol.AuthParams {
	return protocol.AuthParams{
		RevID: protocol.RevID, Endian: protocol.AuthEndian, PageSize: 4096,
		MaxRdmaWindowSize: 1 << 20, MaxSendBufferSize: 1 << 20, MaxRecvBufferSize: peerRecvSize,
		HeaderSize: protocol.HeaderSize, Credits: uint16(credits), HasKey: true, Key: key,
	}
}

// authMsg encodes an AUTH with params p (signed by the caller) asking the
// server to write its parameters to the peer's data region.
func (p *peer) authMsg(ap protocol.AuthParams, cookie uint64) []byte {
	req := protocol.NewAuthRequest(ap, p.data.Addr(), p.data.Handle(), cookie)
	return req.Append(nil)
}

// auth authenticates with a fresh negotiate Key of the session (a Key
// authenticates one connection); it returns the credits granted.
func (p *peer) auth(ls *lwioSession, credits int) int {
	p.t.Helper()
	ap := authParams(ls.fresh(p.t), credits)
	ap.Sign(ls.signing)
	if err := p.sendMsg(p.authMsg(ap, 42)); err != nil {
		p.t.Fatal(err)
	}
	r := p.wantResponse("AUTH")
	if r.Cookie != 42 || r.Ios.Status != protocol.StatusSuccess {
		p.t.Fatalf("AUTH refused: %+v", r)
	}
	sp, _, err := protocol.DecodeAuthParamsPrefix(p.data.Bytes())
	if err != nil {
		p.t.Fatal(err)
	}
	if !sp.Verify(ls.signing) || sp.SessionID != ls.id {
		p.t.Fatalf("server AUTH params do not verify (session %d, want %d)", sp.SessionID, ls.id)
	}
	fill(p.data.Bytes(), pattern)
	return int(sp.Credits)
}

// register registers a resume key; it returns the status and the Fid.
func (p *peer) register(ls *lwioSession, key protocol.ResumeKey) (protocol.Status, uint16) {
	p.t.Helper()
	req := protocol.NewRegisterRequest(protocol.FidParams{ResumeKey: key, SessionID: ls.id}, 0, 77)
	if err := p.sendMsg(req.Append(nil)); err != nil {
		p.t.Fatal(err)
	}
	r := p.wantResponse("REGISTER")
	return r.Ios.Status, uint16(r.Ios.Information)
}

// lwioSession is a legitimate session with an LWIO negotiate key: what a
// hostile peer can hold honestly.
type lwioSession struct {
	*rig.Session
	id      uint64
	signing []byte
	key     [16]byte
}

func newLWIOSession(t testing.TB, s *rig.Server) *lwioSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ss := s.TestSession(ctx, t)
	var ck [16]byte
	rand.Read(ck[:])
	resp, err := ss.Tree.Negotiate(ctx, protocol.NewNegotiateRequest("hostile", ck, []transport.ProviderInfo{{Name: soft.Name}}))
	if err != nil {
		t.Fatal(err)
	}
	return &lwioSession{Session: ss, id: ss.C.SessionID(), signing: ss.C.SessionKey(), key: resp.Key}
}

// fresh asks \PIPE\LWIO for another negotiate Key of the session, as the
// client engine does for each connection: the server lets a Key
// authenticate one connection only.
func (ls *lwioSession) fresh(t testing.TB) [16]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ck [16]byte
	rand.Read(ck[:])
	resp, err := ls.Tree.Negotiate(ctx, protocol.NewNegotiateRequest("hostile", ck, []transport.ProviderInfo{{Name: soft.Name}}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Key
}

// file creates name in the share with content through the session and
// returns its resume key.
func (ls *lwioSession) file(t testing.TB, name string, content []byte) protocol.ResumeKey {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, rk, err := ls.OpenKey(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ls.Tree.WriteAt(ctx, h, content, 0); err != nil {
		t.Fatal(err)
	}
	return rk
}
