package hostile

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server/servertest"
	"github.com/lwiofs/lwiofs/test/hostile/rig"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// peer is a hand-driven LWIO client on a real softrdma connection
// (servertest.Peer): the test writes every message and reads every answer
// itself, so it can send what no well-behaved client would.
type peer struct{ *servertest.Peer }

const (
	peerRecvs    = 64
	peerRecvSize = 64
	peerDataSize = 1 << 20
)

// peerShape is a peer's memory; send is its send buffer's size.
func peerShape(send int) servertest.PeerShape {
	return servertest.PeerShape{Recvs: peerRecvs, RecvSize: peerRecvSize, SendSize: send, DataSize: peerDataSize}
}

// pattern fills the peer's remote-writable memory, so that any byte the
// server RDMA-writes there shows.
const pattern = 0xA5

// dialPeer connects to the server's softrdma listener.
func dialPeer(t testing.TB, s *rig.Server) *peer {
	t.Helper()
	p := &peer{servertest.DialPeer(t, soft.New(soft.Options{RNRTimeout: 500 * time.Millisecond}), s.SoftAddr, peerShape(4<<20))}
	fill(p.Data.Bytes(), pattern)
	return p
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// untouched reports whether the peer's remote-writable memory still holds
// the pattern in [off, off+n).
func (p *peer) untouched(off, n int) bool {
	for _, b := range p.Data.Bytes()[off : off+n] {
		if b != pattern {
			return false
		}
	}
	return true
}

// sendMsg sends msg as one SEND.
func (p *peer) sendMsg(msg []byte) error { return p.Post(msg) }

// sendChain sends each message as its own SEND, in one post.
func (p *peer) sendChain(msgs [][]byte) error {
	wrs := make([]transport.SendWR, len(msgs))
	off := 0
	for i, m := range msgs {
		n := copy(p.Send.Bytes()[off:], m)
		wrs[i] = transport.SendWR{ID: uint64(i + 1), Op: transport.OpSend, SGL: []transport.Segment{{Region: p.Send, Offset: off, Length: n}}}
		off += n
	}
	return p.Conn.Post(wrs...)
}

func (p *peer) sendHeader(h protocol.Header) error { return p.sendMsg(h.Append(nil)) }

// response returns the next STATUS_RESPONSE, skipping delta-credit
// messages; ok is false when the connection ended instead.
func (p *peer) response() (protocol.StatusResponse, bool) {
	p.T.Helper()
	for {
		wc, ok := p.Next(10 * time.Second)
		if !ok {
			return protocol.StatusResponse{}, false
		}
		r := p.StatusResponse("response", wc)
		if r.Cookie == protocol.DeltaCreditCookie && r.Ios.Status == protocol.NotifyCredit {
			continue
		}
		return r, true
	}
}

func (p *peer) wantResponse(why string) protocol.StatusResponse {
	p.T.Helper()
	r, ok := p.response()
	if !ok {
		p.T.Fatalf("%s: connection ended, want a response", why)
	}
	return r
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
	req := protocol.NewAuthRequest(ap, p.Data.Addr(), p.Data.Handle(), cookie)
	return req.Append(nil)
}

// auth authenticates with a fresh negotiate Key of the session (a Key
// authenticates one connection); it returns the credits granted.
func (p *peer) auth(ls *lwioSession, credits int) int {
	p.T.Helper()
	ap := authParams(ls.fresh(p.T), credits)
	ap.Sign(ls.signing)
	if err := p.sendMsg(p.authMsg(ap, 42)); err != nil {
		p.T.Fatal(err)
	}
	r := p.wantResponse("AUTH")
	if r.Cookie != 42 || r.Ios.Status != protocol.StatusSuccess {
		p.T.Fatalf("AUTH refused: %+v", r)
	}
	sp, _, err := protocol.DecodeAuthParamsPrefix(p.Data.Bytes())
	if err != nil {
		p.T.Fatal(err)
	}
	if !sp.Verify(ls.signing) || sp.SessionID != ls.id {
		p.T.Fatalf("server AUTH params do not verify (session %d, want %d)", sp.SessionID, ls.id)
	}
	fill(p.Data.Bytes(), pattern)
	return int(sp.Credits)
}

// register registers a resume key; it returns the status and the Fid.
func (p *peer) register(ls *lwioSession, key protocol.ResumeKey) (protocol.Status, uint16) {
	p.T.Helper()
	req := protocol.NewRegisterRequest(protocol.FidParams{ResumeKey: key, SessionID: ls.id}, 0, 77)
	if err := p.sendMsg(req.Append(nil)); err != nil {
		p.T.Fatal(err)
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
