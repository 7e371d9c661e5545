package session

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/smbauth"
)

func TestSessionSetup(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	if c.SessionID() == 0 {
		t.Error("SessionID is 0")
	}
	if len(c.SessionKey()) != 16 {
		t.Errorf("SessionKey is %d bytes, want 16", len(c.SessionKey()))
	}
	if c.ServerName() != testServer {
		t.Errorf("ServerName = %q, want %q", c.ServerName(), testServer)
	}
	// A second session gets another id and another key.
	c2 := e.client()
	if c2.SessionID() == c.SessionID() || string(c2.SessionKey()) == string(c.SessionKey()) {
		t.Error("two sessions share an id or a key")
	}
	if !e.logged("session established") {
		t.Error("no log line for the session")
	}
}

func TestSessionSetupWithNTHash(t *testing.T) {
	e := newEnv(t)
	h := smbauth.NTHash(testPassword)
	c, err := Dial(ctxT(t), e.addr, ClientConfig{User: testUser, NTHash: &h})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func TestLogonFailure(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct{ name, user, password string }{
		{"wrong password", testUser, "wrong"},
		{"unknown user", "mallory", testPassword},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.hook.Reset()
			_, err := e.dial(tc.user, tc.password)
			if !errors.Is(err, ErrLogonFailure) || !errors.Is(err, protocol.StatusLogonFailure) {
				t.Fatalf("Dial = %v, want ErrLogonFailure", err)
			}
			if !strings.Contains(err.Error(), "logon failure: wrong user name or password") {
				t.Errorf("error text %q does not say what went wrong", err)
			}
			if !e.waitLogged("logon failure") {
				t.Error("no log line for the failure")
			}
		})
	}
}

// rawClient is a client that has not done session setup, for driving the
// exchange by hand.
func rawClient(t *testing.T, addr string) *Client {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(nc, ClientConfig{})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestChallengeUsedOnce(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := rawClient(t, e.addr)
	nl := smbauth.NewClient(smbauth.ClientConfig{User: testUser, Password: testPassword})
	neg, _ := nl.Negotiate()
	var chal tokenMsg
	h, err := c.roundTrip(ctx, CmdSessionSetup, 0, &setupReq{Token: neg}, &chal)
	if err != nil || h.Status != protocol.StatusMoreProcessingReq {
		t.Fatalf("NEGOTIATE: %v %v", h.Status, err)
	}
	// A wrong answer to the challenge...
	bad := smbauth.NewClient(smbauth.ClientConfig{User: testUser, Password: "wrong"})
	bad.Negotiate()
	badAuth, _, _ := bad.Authenticate(chal.Token)
	h, err = c.roundTrip(ctx, CmdSessionSetup, 0, &setupReq{Token: badAuth}, nil)
	if err != nil || h.Status != protocol.StatusLogonFailure {
		t.Fatalf("wrong AUTHENTICATE: %v %v", h.Status, err)
	}
	// ...uses the challenge up: the right answer to it is refused too.
	auth, _, err := nl.Authenticate(chal.Token)
	if err != nil {
		t.Fatal(err)
	}
	h, err = c.roundTrip(ctx, CmdSessionSetup, 0, &setupReq{Token: auth}, nil)
	if err == nil && h.Status == protocol.StatusSuccess {
		t.Fatal("AUTHENTICATE accepted against a used challenge")
	}
	// And an AUTHENTICATE replayed on a fresh connection (new challenge)
	// fails as well.
	c2 := rawClient(t, e.addr)
	neg2, _ := smbauth.NewClient(smbauth.ClientConfig{User: testUser, Password: testPassword}).Negotiate()
	h, err = c2.roundTrip(ctx, CmdSessionSetup, 0, &setupReq{Token: neg2}, &tokenMsg{})
	if err != nil || h.Status != protocol.StatusMoreProcessingReq {
		t.Fatalf("NEGOTIATE: %v %v", h.Status, err)
	}
	h, err = c2.roundTrip(ctx, CmdSessionSetup, 0, &setupReq{Token: auth}, nil)
	if err == nil && h.Status == protocol.StatusSuccess {
		t.Fatal("replayed AUTHENTICATE accepted")
	}
}

func TestNoRequestsBeforeSetup(t *testing.T) {
	e := newEnv(t)
	c := rawClient(t, e.addr)
	err := c.call(ctxT(t), CmdTreeConnect, 0, &nameMsg{Name: "data"}, &treeConnectResp{})
	if err != protocol.StatusAccessDenied {
		t.Fatalf("TREE_CONNECT before setup = %v, want ACCESS_DENIED", err)
	}
}

// sendRaw writes an encoded request on an established client's connection,
// signed with key (nil: unsigned), bypassing the id counter.
func sendRaw(t *testing.T, c *Client, h Header, body []byte, key []byte) {
	t.Helper()
	raw := AppendFrame(nil, h, body)
	if key != nil {
		signFrame(key, raw)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if _, err := c.nc.Write(raw); err != nil {
		t.Fatal(err)
	}
}

// takeID takes the client's next message id, for a frame sent by hand.
func takeID(c *Client) uint64 {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.nextID++
	return c.nextID
}

func waitDone(t *testing.T, c *Client) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("connection not dropped")
	}
}

func TestTamperedSignatureDropsConnection(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	key := c.SessionKey()
	key[0] ^= 1
	sendRaw(t, c, Header{MessageID: takeID(c), Command: CmdEcho, SessionID: c.SessionID()}, nil, key)
	waitDone(t, c)
	if !e.waitLogged("bad signature") {
		t.Error("no log line for the bad signature")
	}
	if _, err := c.TreeConnect(ctxT(t), "data"); !errors.Is(err, ErrClosed) {
		t.Errorf("call after drop = %v, want ErrClosed", err)
	}
}

func TestUnsignedFrameDropsConnection(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	sendRaw(t, c, Header{MessageID: takeID(c), Command: CmdEcho, SessionID: c.SessionID()}, nil, nil)
	waitDone(t, c)
}

func TestReplayedMessageIDDropsConnection(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	ctx := ctxT(t)
	if err := c.call(ctx, CmdEcho, 0, &empty{}, &empty{}); err != nil {
		t.Fatal(err)
	}
	// A correctly signed frame with an id already used.
	sendRaw(t, c, Header{MessageID: 1, Command: CmdEcho, SessionID: c.SessionID()}, nil, c.SessionKey())
	waitDone(t, c)
	if !e.waitLogged("replayed message id") {
		t.Error("no log line for the replay")
	}
}

// TestClientRefusesUnsolicitedResponse: a response to no request in flight
// (a replay or forgery) ends the connection on the client side too.
func TestClientRefusesUnsolicitedResponse(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := newClient(a, ClientConfig{})
	defer c.Close()
	go b.Write(AppendFrame(nil, Header{MessageID: 99, Command: CmdEcho, Flags: FlagResponse}, nil))
	waitDone(t, c)
	if !errors.Is(c.Err(), ErrReplay) {
		t.Errorf("Err = %v, want ErrReplay", c.Err())
	}
}

func TestTreeConnect(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	ctx := ctxT(t)
	if _, err := c.TreeConnect(ctx, "nosuch"); err != protocol.StatusBadNetworkName {
		t.Errorf("unknown share: %v, want BAD_NETWORK_NAME", err)
	}
	if _, err := c.TreeConnect(ctx, "bobs"); err != protocol.StatusAccessDenied {
		t.Errorf("share of another user: %v, want ACCESS_DENIED", err)
	}
	tr, err := c.TreeConnect(ctx, `\\srv\DATA`)
	if err != nil || tr.ReadOnly() {
		t.Errorf(`\\srv\DATA: %v, read-only %v`, err, tr != nil && tr.ReadOnly())
	}
	ro, err := c.TreeConnect(ctx, "ro")
	if err != nil || !ro.ReadOnly() {
		t.Errorf("ro: %v, read-only %v", err, ro != nil && ro.ReadOnly())
	}
	bob, err := Dial(ctx, e.addr, ClientConfig{User: "BOB", Password: "bob's"})
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	if _, err := bob.TreeConnect(ctx, "bobs"); err != nil {
		t.Errorf("bob on bobs: %v", err)
	}
	// A tree id the session does not have.
	bad := &Tree{c: c, id: 777}
	if _, err := bad.GetAttr(ctx, ""); err != StatusNetworkNameDeleted {
		t.Errorf("unknown tree: %v", err)
	}
}

func TestDeadServerFailsCallsPromptly(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("data")
	c := tr.c
	e.srv.Close()
	waitDone(t, c)
	start := time.Now()
	_, err := tr.GetAttr(context.Background(), "")
	if !errors.Is(err, ErrClosed) || !protocol.IsConnectionLost(err) || ToErrno(err) != syscall.ENOTCONN {
		t.Errorf("GetAttr after server close = %v, want a ConnectionError wrapping ErrClosed (ENOTCONN)", err)
	}
	if time.Since(start) > time.Second {
		t.Error("call on a dead connection was slow")
	}
}

func TestSilentServerDialTimesOut(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		nc, err := l.Accept()
		if err == nil {
			defer nc.Close()
			time.Sleep(3 * time.Second)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Dial(ctx, l.Addr().String(), ClientConfig{User: "u", Password: "p"}); err == nil {
		t.Fatal("Dial to a silent server succeeded")
	}
	if time.Since(start) > 2*time.Second {
		t.Error("Dial ignored its context")
	}
}

func TestContextCancelLeavesConnectionUsable(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("data")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tr.GetAttr(ctx, ""); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call = %v", err)
	}
	if _, err := tr.GetAttr(ctxT(t), ""); err != nil {
		t.Errorf("call after a cancelled one: %v", err)
	}
}

// TestPendingCallsFailWhenConnectionDies: calls waiting for an answer fail
// with ErrClosed as soon as the connection breaks.
func TestPendingCallsFailWhenConnectionDies(t *testing.T) {
	a, b := net.Pipe()
	c := newClient(a, ClientConfig{})
	defer c.Close()
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() { errs <- c.call(context.Background(), CmdEcho, 0, &empty{}, &empty{}) }()
	}
	// Read the requests, answer none, then hang up.
	for range n {
		if _, _, err := ReadFrame(b); err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	for range n {
		select {
		case err := <-errs:
			var ce *protocol.ConnectionError
			if !errors.Is(err, ErrClosed) || !errors.As(err, &ce) || !strings.HasPrefix(ce.Conn, "session ") {
				t.Errorf("pending call = %v, want a session ConnectionError wrapping ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("pending call hangs after the connection died")
		}
	}
	if err := c.call(context.Background(), CmdEcho, 0, &empty{}, &empty{}); !errors.Is(err, ErrClosed) {
		t.Errorf("later call = %v", err)
	}
}

// TestGracefulClose: requests the server has read are answered before
// Close returns; the client then sees the connection end.
func TestGracefulClose(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("data")
	ctx := ctxT(t)
	const n = 32
	type result struct {
		name string
		err  error
	}
	errs := each(n, func(i int) result {
		name := fmt.Sprintf("d%d", i)
		_, err := tr.Mkdir(ctx, name, 0o755)
		return result{name, err}
	})
	// Wait for the directories to start appearing, then close.
	eventually(t, "first mkdir", func() bool {
		ents, _ := os.ReadDir(e.share)
		return len(ents) > 0
	})
	e.srv.Close()
	ok := 0
	for range n {
		r := <-errs
		switch {
		case r.err == nil:
			ok++
			if _, err := os.Stat(e.share + "/" + r.name); err != nil {
				t.Errorf("Mkdir %s reported success but: %v", r.name, err)
			}
		case !errors.Is(r.err, ErrClosed):
			t.Errorf("Mkdir during Close: %v", r.err)
		}
	}
	waitDone(t, tr.c)
	if ok == 0 {
		t.Error("no request was answered")
	}
}

// TestKeepAliveDetectsSilentServer: a server that stops answering (but
// keeps the TCP connection) is noticed by the ECHO keepalive.
func TestKeepAliveDetectsSilentServer(t *testing.T) {
	a, b := net.Pipe()
	c := newClient(a, ClientConfig{})
	defer c.Close()
	go c.keepAlive(50 * time.Millisecond)
	go func() { // read everything, answer nothing
		for {
			if _, _, err := ReadFrame(b); err != nil {
				return
			}
		}
	}()
	waitDone(t, c)
	if !strings.Contains(c.Err().Error(), "keepalive") {
		t.Errorf("Err = %v", c.Err())
	}
}

func TestKeepAliveKeepsLiveSession(t *testing.T) {
	e := newEnv(t)
	c, err := Dial(ctxT(t), e.addr, ClientConfig{User: testUser, Password: testPassword, KeepAlive: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(200 * time.Millisecond)
	select {
	case <-c.Done():
		t.Fatalf("live session dropped: %v", c.Err())
	default:
	}
}

func TestOversizedSetupFrameDropped(t *testing.T) {
	e := newEnv(t)
	nc := dialFrom(t, "127.0.0.1", e.addr)
	big := AppendFrame(nil, Header{MessageID: 1, Command: CmdSessionSetup}, marshal(&tokenMsg{Token: make([]byte, 100<<10)}))
	nc.Write(big)
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := ReadFrame(nc); err == nil {
		t.Fatal("server answered an oversized setup frame")
	}
	if !e.waitLogged("dropping connection") {
		t.Error("no log line")
	}
}

func TestTooManyLogonFailuresDropConnection(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := rawClient(t, e.addr)
	for i := range maxLogonFailures {
		nl := smbauth.NewClient(smbauth.ClientConfig{User: testUser, Password: "wrong"})
		neg, _ := nl.Negotiate()
		var chal tokenMsg
		if _, err := c.roundTrip(ctx, CmdSessionSetup, 0, &setupReq{Token: neg}, &chal); err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		auth, _, _ := nl.Authenticate(chal.Token)
		h, err := c.roundTrip(ctx, CmdSessionSetup, 0, &setupReq{Token: auth}, nil)
		if err != nil || h.Status != protocol.StatusLogonFailure {
			t.Fatalf("attempt %d: %v %v", i, h.Status, err)
		}
	}
	waitDone(t, c)
}

func TestLogoff(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	sid := c.SessionID()
	tr, _ := c.TreeConnect(ctxT(t), "data")
	e.writeFile("f", "x")
	h, _, _ := tr.Open(ctxT(t), "f", os.O_RDONLY, 0)
	rk, _ := tr.RequestResumeKey(ctxT(t), h)
	if err := c.call(ctxT(t), CmdLogoff, 0, &empty{}, &empty{}); err != nil {
		t.Fatal(err)
	}
	waitDone(t, c)
	eventually(t, "session end", func() bool {
		_, err := e.srv.OpenByResumeKey(sid, rk.Key)
		return err != nil
	})
}

// TestAbandonedOpenIsClosed: when the caller of Open gives up before the
// answer, the handle the server opened anyway is closed.
func TestAbandonedOpenIsClosed(t *testing.T) {
	e := newEnv(t)
	e.writeFile("f", "")
	tr := e.tree("data")
	c := tr.c
	ctx := ctxT(t)
	// Send an OPEN by hand and mark it abandoned before the answer can be
	// delivered: hold c.mu so the reader cannot look it up yet.
	c.mu.Lock()
	c.writeMu.Lock()
	c.nextID++
	id := c.nextID
	c.pending[id] = nil
	raw := AppendFrame(nil, Header{MessageID: id, Command: CmdOpen, SessionID: c.SessionID(), TreeID: tr.id}, marshal(&openReq{Path: "f"}))
	signFrame(c.SessionKey(), raw)
	c.nc.Write(raw)
	c.writeMu.Unlock()
	c.mu.Unlock()
	var ss *serverSession
	e.srv.mu.Lock()
	ss = e.srv.sessions[c.SessionID()]
	e.srv.mu.Unlock()
	openedAndClosed := func() bool {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		return ss.nextH == 1 && len(ss.handles) == 0
	}
	eventually(t, "the abandoned handle to be opened and closed", openedAndClosed)
	// And the session still works.
	if _, err := tr.GetAttr(ctx, "f"); err != nil {
		t.Fatal(err)
	}
}

// TestOpenAnsweredAsCallerGivesUpIsClosed: when the caller of Open gives
// up just as its answer is delivered — accept has taken the answer off
// pending, so it will not be dropped as an abandoned one, but the caller
// no longer looks at its channel — the handle is closed all the same.
// exchange's giveUp stands for that window (in accept, between taking the
// answer off pending and sending it): the caller's context has ended, and
// the answer is delivered to its channel before the caller is done giving
// up. Before the fix the handle stayed open until the session ended.
func TestOpenAnsweredAsCallerGivesUpIsClosed(t *testing.T) {
	e := newEnv(t)
	e.writeFile("f", "")
	tr := e.tree("data")
	c := tr.c
	e.srv.mu.Lock()
	ss := e.srv.sessions[c.SessionID()]
	e.srv.mu.Unlock()
	// The server cannot answer the OPEN until the caller has given up.
	ss.mu.Lock()
	ctx, cancel := context.WithCancel(ctxT(t))
	delivered := make(chan bool, 1)
	giveUp := func(id uint64, ch chan Frame) (Frame, bool) {
		ss.mu.Unlock()
		deadline := time.Now().Add(10 * time.Second)
		for len(ch) == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		delivered <- len(ch) == 1
		return Frame{}, false
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.exchange(ctx, CmdOpen, tr.id, &openReq{Path: "f"}, &openResp{}, giveUp)
		done <- err
	}()
	eventually(t, "the OPEN to be sent", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.pending) == 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("exchange: %v, want the caller's context's end", err)
	}
	if !<-delivered {
		t.Fatal("the answer was not delivered to the caller's channel")
	}
	eventually(t, "the handle opened as the caller gave up to be closed", func() bool {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		return ss.nextH == 1 && len(ss.handles) == 0
	})
	if _, err := tr.GetAttr(ctxT(t), "f"); err != nil {
		t.Fatal(err)
	}
}

func TestMalformedBodyDropsConnection(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("data")
	c := tr.c
	// A GETATTR whose path length runs past the body.
	sendRaw(t, c, Header{MessageID: takeID(c), Command: CmdGetAttr, SessionID: c.SessionID(), TreeID: tr.id}, []byte{0xff, 0x00, 'a'}, c.SessionKey())
	waitDone(t, c)
	if !e.waitLogged("malformed request") {
		t.Error("no log line")
	}
	// The server still serves others.
	if _, err := e.tree("data").GetAttr(ctxT(t), ""); err != nil {
		t.Error(err)
	}
}

func TestUnknownCommand(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	if err := c.call(ctxT(t), Command(999), 0, &empty{}, &empty{}); err != protocol.StatusNotImplemented {
		t.Errorf("unknown command: %v", err)
	}
}
