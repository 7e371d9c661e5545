package server

import (
	"context"
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
	l, err := srv.Listen(soft.New(soft.Options{}), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.srv, e.addr = srv, l.Addr()
	go srv.Serve(l)
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

// peer is a hand-driven client: the test writes each message and checks
// each answer, transcript style.
type peer struct {
	t      *testing.T
	tc     transport.Conn
	send   transport.Region
	recv   transport.Region
	data   transport.Region // remote-writable: AUTH params, read data, status blocks
	queue  []transport.Completion
	nrecv  int
	closed bool
}

const (
	peerRecvs    = 16
	peerRecvSize = 64
	peerDataSize = 4 << 20
)

func (e *env) dial() *peer {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tc, err := soft.New(soft.Options{}).Dial(ctx, e.addr, transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	p := &peer{t: t, tc: tc}
	dom := tc.Domain()
	p.send = mustAlloc(t, dom, 3<<20, transport.AccessLocal)
	p.recv = mustAlloc(t, dom, peerRecvs*peerRecvSize, transport.AccessLocal)
	p.data = mustAlloc(t, dom, peerDataSize, transport.AccessLocal|transport.AccessRemoteWrite)
	for i := 0; i < peerRecvs; i++ {
		p.postRecv(i)
	}
	return p
}

func mustAlloc(t *testing.T, dom transport.Domain, n int, a transport.Access) transport.Region {
	r, err := dom.Alloc(n, a)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (p *peer) postRecv(i int) {
	if err := p.tc.PostRecv(transport.RecvWR{ID: uint64(i), Buf: transport.Segment{Region: p.recv, Offset: i * peerRecvSize, Length: peerRecvSize}}); err != nil && !errors.Is(err, transport.ErrClosed) {
		p.t.Fatal(err)
	}
}

// sendMsg sends msg (copied into registered memory) as one SEND.
func (p *peer) sendMsg(msg []byte) {
	p.t.Helper()
	n := copy(p.send.Bytes(), msg)
	if err := p.tc.Post(transport.SendWR{ID: 1, Op: transport.OpSend, SGL: []transport.Segment{{Region: p.send, Length: n}}}); err != nil {
		p.t.Fatal(err)
	}
}

func (p *peer) sendHeader(h protocol.Header) { p.sendMsg(h.Append(nil)) }

// trySend sends msg, reporting false if the connection is gone.
func (p *peer) trySend(msg []byte) bool {
	n := copy(p.send.Bytes(), msg)
	err := p.tc.Post(transport.SendWR{ID: 1, Op: transport.OpSend, SGL: []transport.Segment{{Region: p.send, Length: n}}})
	if errors.Is(err, transport.ErrClosed) {
		p.closed = true
		return false
	}
	if err != nil {
		p.t.Fatal(err)
	}
	return true
}

// next returns the next receive completion, skipping our send completions.
// ok is false if the connection ended instead.
func (p *peer) next() (transport.Completion, bool) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		for len(p.queue) > 0 {
			wc := p.queue[0]
			p.queue = p.queue[1:]
			if wc.Status != transport.StatusSuccess {
				p.closed = true
				return wc, false
			}
			if wc.Op == transport.OpRecv {
				return wc, true
			}
		}
		var wcs [16]transport.Completion
		n, err := p.tc.CQ().Wait(ctx, wcs[:])
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				p.t.Fatal("no completion within 10s")
			}
			p.closed = true
			return transport.Completion{}, false
		}
		p.queue = append(p.queue, wcs[:n]...)
	}
}

// wantResponse expects a STATUS_RESPONSE send and reposts its receive.
func (p *peer) wantResponse(why string) protocol.StatusResponse {
	p.t.Helper()
	wc, ok := p.next()
	if !ok {
		p.t.Fatalf("%s: connection ended (%v)", why, wc.Status)
	}
	if wc.HasImm {
		p.t.Fatalf("%s: got immediate data %#x, want a STATUS_RESPONSE", why, wc.Imm)
	}
	r, err := protocol.DecodeStatusResponse(p.recv.Bytes()[int(wc.ID)*peerRecvSize : int(wc.ID)*peerRecvSize+wc.Len])
	if err != nil {
		p.t.Fatalf("%s: %v", why, err)
	}
	p.postRecv(int(wc.ID))
	return r
}

// wantImm expects an RDMA WRITE WITH IMMEDIATE.
func (p *peer) wantImm(why string) uint32 {
	p.t.Helper()
	wc, ok := p.next()
	if !ok {
		p.t.Fatalf("%s: connection ended (%v)", why, wc.Status)
	}
	if !wc.HasImm {
		p.t.Fatalf("%s: got a %d-byte SEND, want immediate data", why, wc.Len)
	}
	p.postRecv(int(wc.ID))
	return wc.Imm
}

// wantClosed expects the server to end the connection.
func (p *peer) wantClosed(why string) {
	p.t.Helper()
	for {
		if wc, ok := p.next(); !ok {
			return
		} else if wc.Op == transport.OpRecv {
			p.t.Fatalf("%s: got a message, want the connection to end", why)
		}
	}
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
	p.t.Helper()
	r := p.tryAuth(key, signing, credits, 42)
	if r.Cookie != 42 || r.Ios.Status != protocol.StatusSuccess {
		p.t.Fatalf("AUTH response %+v", r)
	}
	sp, n, err := protocol.DecodeAuthParamsPrefix(p.data.Bytes())
	if err != nil {
		p.t.Fatal(err)
	}
	if int(r.Ios.Information) != n+protocol.AuthInformationExtra {
		p.t.Fatalf("AUTH Information %d, params %d bytes", r.Ios.Information, n)
	}
	return sp
}

// tryAuth sends an AUTH for key signed with signing, asking for the
// server's parameters in the data region, and returns the answer.
func (p *peer) tryAuth(key [16]byte, signing []byte, credits int, cookie uint64) protocol.StatusResponse {
	p.t.Helper()
	ap := p.authParams(key, credits)
	ap.Sign(signing)
	req := protocol.NewAuthRequest(ap, p.data.Addr(), p.data.Handle(), cookie)
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
	p.sendHeader(protocol.NewReadRequest(fid, off, n, p.data.Addr(), p.data.Handle(), credits, protocol.InterruptMode(uint32(c), c)))
}

func (p *peer) register(key protocol.ResumeKey, session uint64, flags uint32) protocol.StatusResponse {
	p.t.Helper()
	req := protocol.NewRegisterRequest(protocol.FidParams{ResumeKey: key, SessionID: session, FlagsAndAttributes: flags}, 1, 77)
	p.sendMsg(req.Append(nil))
	return p.wantResponse("REGISTER")
}
