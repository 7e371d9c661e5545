package server

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server/servertest"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

type osFile struct{ *os.File }

func (osFile) ReadOnly() bool { return false }

// Append is share.OpenFile's, for the engine's WriteToEndOfFile.
func (f osFile) Append(p []byte) (int, int64, error) { return share.AppendFile(f.File, p) }

type env struct {
	t    *testing.T
	dir  string
	auth *servertest.Authority
	srv  *Server
	addr string
}

func newEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	e := &env{t: t, dir: t.TempDir(), auth: servertest.NewAuthority()}
	cfg.Authority = e.auth
	if l := testutil.Logger("server"); l != nil {
		cfg.Logger = l
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv, e.addr = srv, servertest.ServeOn(t, srv, soft.New(soft.Options{}))
	t.Cleanup(func() { srv.Close() })
	return e
}

// session issues a negotiate Key for a new session.
func (e *env) session(id uint64) (key [16]byte, signing []byte) {
	signing = make([]byte, 16)
	rand.Read(signing)
	return e.auth.NegotiateKey(id, signing), signing
}

// file creates name with content in the server's directory, opens it
// read-write until the test ends and issues it a resume key on session id.
func (e *env) file(id uint64, name string, content []byte) (protocol.ResumeKey, *os.File) {
	path := filepath.Join(e.dir, name)
	if err := os.WriteFile(path, content, 0o644); err != nil {
		e.t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { f.Close() })
	return e.auth.AddFile(id, osFile{f}), f
}

// serverConn returns the server's side of the only connection.
func (e *env) serverConn() *conn {
	e.t.Helper()
	e.srv.mu.Lock()
	defer e.srv.mu.Unlock()
	for c := range e.srv.conns {
		return c
	}
	e.t.Fatal("no server connection")
	return nil
}

// peer is a hand-driven client (servertest.Peer) with the messages these
// tests send.
type peer struct{ *servertest.Peer }

const (
	peerRecvs    = 16
	peerRecvSize = 64
	peerDataSize = 4 << 20
)

func (e *env) dial() *peer {
	e.t.Helper()
	shape := servertest.PeerShape{Recvs: peerRecvs, RecvSize: peerRecvSize, SendSize: 3 << 20, DataSize: peerDataSize}
	return &peer{servertest.DialPeer(e.t, soft.New(soft.Options{}), e.addr, shape)}
}

// sendMsg sends msg (copied into registered memory) as one SEND.
func (p *peer) sendMsg(msg []byte) {
	p.T.Helper()
	if err := p.Post(msg); err != nil {
		p.T.Fatal(err)
	}
}

func (p *peer) sendHeader(h protocol.Header) { p.sendMsg(h.Append(nil)) }

// trySend sends msg, reporting false if the connection is gone.
func (p *peer) trySend(msg []byte) bool {
	err := p.Post(msg)
	if errors.Is(err, transport.ErrClosed) {
		p.Closed = true
		return false
	}
	if err != nil {
		p.T.Fatal(err)
	}
	return true
}

// next returns the next receive completion, skipping our send completions.
// ok is false if the connection ended instead.
func (p *peer) next() (transport.Completion, bool) {
	p.T.Helper()
	return p.Next(10 * time.Second)
}

// wantResponse expects a STATUS_RESPONSE send and reposts its receive.
func (p *peer) wantResponse(why string) protocol.StatusResponse {
	p.T.Helper()
	wc, ok := p.next()
	if !ok {
		p.T.Fatalf("%s: connection ended (%v)", why, wc.Status)
	}
	return p.StatusResponse(why, wc)
}

func (p *peer) authParams(key [16]byte, credits int) protocol.AuthParams {
	return protocol.AuthParams{
		RevID: protocol.RevID, Endian: protocol.AuthEndian, PageSize: 4096, BaseSequence: 7,
		MaxRdmaWindowSize: 1 << 20, MaxSendBufferSize: 1 << 20, MaxRecvBufferSize: peerRecvSize,
		HeaderSize: protocol.HeaderSize, Credits: uint16(credits), HasKey: true, Key: key,
	}
}

// auth authenticates and returns the server's parameters.
func (p *peer) auth(key [16]byte, signing []byte, credits int) protocol.AuthParams {
	p.T.Helper()
	r := p.tryAuth(key, signing, credits, 42)
	if r.Cookie != 42 || r.Ios.Status != protocol.StatusSuccess {
		p.T.Fatalf("AUTH response %+v", r)
	}
	sp, n, err := protocol.DecodeAuthParamsPrefix(p.Data.Bytes())
	if err != nil {
		p.T.Fatal(err)
	}
	if int(r.Ios.Information) != n+protocol.AuthInformationExtra {
		p.T.Fatalf("AUTH Information %d, params %d bytes", r.Ios.Information, n)
	}
	return sp
}

// tryAuth sends an AUTH for key signed with signing, asking for the
// server's parameters in the data region, and returns the answer.
func (p *peer) tryAuth(key [16]byte, signing []byte, credits int, cookie uint64) protocol.StatusResponse {
	p.T.Helper()
	ap := p.authParams(key, credits)
	ap.Sign(signing)
	req := protocol.NewAuthRequest(ap, p.Data.Addr(), p.Data.Handle(), cookie)
	p.sendMsg(req.Append(nil))
	return p.wantResponse("AUTH")
}

// open authenticates a new connection of session id (key, signing) with 8
// credits and registers rk on it without flags.
func (e *env) open(key [16]byte, signing []byte, id uint64, rk protocol.ResumeKey) (*peer, uint16) {
	e.t.Helper()
	p := e.dial()
	p.auth(key, signing, 8)
	return p, uint16(p.register(rk, id, 0).Ios.Information)
}

// read sends an interrupt-mode READ of n bytes at off into the data region,
// with c as both cookies.
func (p *peer) read(fid uint16, off uint64, n uint32, credits uint8, c uint64) {
	p.sendHeader(protocol.NewReadRequest(fid, off, n, p.Data.Addr(), p.Data.Handle(), credits, protocol.InterruptMode(uint32(c), c)))
}

func (p *peer) register(key protocol.ResumeKey, session uint64, flags uint32) protocol.StatusResponse {
	p.T.Helper()
	req := protocol.NewRegisterRequest(protocol.FidParams{ResumeKey: key, SessionID: session, FlagsAndAttributes: flags}, 1, 77)
	p.sendMsg(req.Append(nil))
	return p.wantResponse("REGISTER")
}
