package session

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/transport"
)

func TestResumeKey(t *testing.T) {
	e := newEnv(t)
	e.writeFile("f", "hello, resume key")
	tr := e.tree("data")
	ctx := ctxT(t)
	sid := tr.c.SessionID()
	h, _, err := tr.Open(ctx, "f", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	rk, err := tr.RequestResumeKey(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	if rk.Context != `\\srv\data` {
		t.Errorf("Context = %q, want \\\\srv\\data", rk.Context)
	}
	if rk.Key == (protocol.ResumeKey{}) {
		t.Error("zero resume key")
	}
	f, err := e.srv.OpenByResumeKey(sid, rk.Key)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if n, err := f.ReadAt(buf, 0); err != nil || string(buf[:n]) != "hello" {
		t.Errorf("ReadAt through resume key: %q %v", buf[:n], err)
	}
	if _, err := f.WriteAt([]byte("HELLO"), 0); err != nil {
		t.Errorf("WriteAt through resume key: %v", err)
	}
	// Another open gets another key; asking again gives the same.
	h2, _, _ := tr.Open(ctx, "f", os.O_RDONLY, 0)
	rk2, _ := tr.RequestResumeKey(ctx, h2)
	again, _ := tr.RequestResumeKey(ctx, h)
	if rk2.Key == rk.Key || again.Key != rk.Key {
		t.Error("resume keys not per open")
	}
	if f2, err := e.srv.OpenByResumeKey(sid, rk2.Key); err != nil {
		t.Errorf("O_RDONLY open by key: %v", err)
	} else if _, err := f2.WriteAt([]byte("x"), 0); err != protocol.StatusAccessDenied {
		t.Errorf("write through the key of an O_RDONLY open: %v, want ACCESS_DENIED", err)
	}
	// Bound to the session.
	other := e.client()
	if _, err := e.srv.OpenByResumeKey(other.SessionID(), rk.Key); err == nil {
		t.Error("resume key accepted on another session")
	}
	var guess protocol.ResumeKey
	guess[0] = 1
	if _, err := e.srv.OpenByResumeKey(sid, guess); err == nil {
		t.Error("guessed key accepted")
	}
	// Dead after close.
	if err := tr.CloseHandle(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := e.srv.OpenByResumeKey(sid, rk.Key); err == nil {
		t.Error("resume key accepted after its handle closed")
	}
	if _, err := f.ReadAt(buf, 0); err == nil {
		t.Error("File still readable after close")
	}
	// Dead after the session ends.
	if _, err := e.srv.OpenByResumeKey(sid, rk2.Key); err != nil {
		t.Fatal(err)
	}
	tr.c.Close()
	eventually(t, "session teardown", func() bool {
		_, err := e.srv.OpenByResumeKey(sid, rk2.Key)
		return err != nil
	})
	if b, _ := os.ReadFile(e.share + "/f"); !bytes.HasPrefix(b, []byte("HELLO")) {
		t.Errorf("write through resume key not on disk: %q", b)
	}
}

func TestResumeKeyOnlyForOwnHandles(t *testing.T) {
	e := newEnv(t)
	e.writeFile("f", "x")
	a, b := e.tree("data"), e.tree("data")
	ctx := ctxT(t)
	h, _, err := a.Open(ctx, "f", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.RequestResumeKey(ctx, h); err != protocol.StatusInvalidHandle {
		t.Errorf("resume key for another session's handle: %v", err)
	}
	if err := b.CloseHandle(ctx, h); err != protocol.StatusInvalidHandle {
		t.Errorf("close of another session's handle: %v", err)
	}
}

func prov(name, addr string) transport.ProviderInfo {
	return transport.ProviderInfo{Name: name, Instances: []transport.Instance{{HostAddress: []byte(addr), Discriminator: []byte("4791")}}}
}

func TestNegotiate(t *testing.T) {
	e := newEnv(t, func(c *ServerConfig) {
		c.Providers = []transport.ProviderInfo{prov("verbs", "10.0.0.1"), prov("softrdma", "127.0.0.1")}
	})
	tr := e.tree("data")
	ctx := ctxT(t)
	clientProv := []transport.ProviderInfo{
		prov("softrdma", "127.0.0.2"),
		prov("other", "1.2.3.4"),
	}
	req := protocol.NewNegotiateRequest("client", [16]byte{1, 2, 3}, clientProv)
	resp, err := tr.Negotiate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.SrvName != testServer {
		t.Errorf("SrvName = %q", resp.SrvName)
	}
	got := fmt.Sprint(resp.Providers)
	want := fmt.Sprint([]transport.ProviderInfo{prov("softrdma", "127.0.0.1")})
	if got != want {
		t.Errorf("common providers = %s, want %s", got, want)
	}
	id, key, ok := e.srv.SessionByKey(resp.Key)
	if !ok || id != tr.c.SessionID() || !bytes.Equal(key, tr.c.SessionKey()) {
		t.Errorf("SessionByKey = %d %x %v, want %d %x", id, key, ok, tr.c.SessionID(), tr.c.SessionKey())
	}
	// Each negotiate gets a fresh key.
	resp2, err := tr.Negotiate(ctx, req)
	if err != nil || resp2.Key == resp.Key {
		t.Errorf("second negotiate: %v, same key %v", err, resp2.Key == resp.Key)
	}
	if _, _, ok := e.srv.SessionByKey([16]byte{1, 2, 3}); ok {
		t.Error("the client's own key was accepted")
	}
	// No providers in common: an empty list, still a key.
	resp3, err := tr.Negotiate(ctx, protocol.NewNegotiateRequest("client", [16]byte{}, nil))
	if err != nil || len(resp3.Providers) != 0 {
		t.Errorf("negotiate with no providers: %v %v", err, resp3.Providers)
	}
	// A session keeps only its recent keys.
	var recent protocol.NegotiateResponse
	for range maxLWIOKeys {
		if recent, err = tr.Negotiate(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, ok := e.srv.SessionByKey(resp.Key); ok {
		t.Error("oldest key still valid after maxLWIOKeys newer ones")
	}
	if _, _, ok := e.srv.SessionByKey(recent.Key); !ok {
		t.Error("the newest key was forgotten")
	}
	resp = recent
	// Keys die with the session.
	tr.c.Close()
	eventually(t, "session teardown", func() bool {
		_, _, ok := e.srv.SessionByKey(resp.Key)
		return !ok
	})
}

func TestPipeErrors(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("data")
	ctx := ctxT(t)
	if err := tr.call(ctx, CmdPipeOpen, &nameMsg{Name: `\PIPE\other`}, &handleMsg{}); err != protocol.StatusObjectNameNotFound {
		t.Errorf("unknown pipe: %v", err)
	}
	var ph handleMsg
	if err := tr.call(ctx, CmdPipeOpen, &nameMsg{Name: `\pipe\lwio`}, &ph); err != nil {
		t.Fatal(err)
	}
	if err := tr.call(ctx, CmdPipeTransact, &pipeTransactReq{Handle: ph.Handle, Data: []byte("garbage")}, &dataMsg{}); err != protocol.StatusInvalidParameter {
		t.Errorf("garbage negotiate: %v", err)
	}
	e.writeFile("f", "")
	h, _, _ := tr.Open(ctx, "f", os.O_RDONLY, 0)
	if err := tr.call(ctx, CmdPipeTransact, &pipeTransactReq{Handle: h, Data: nil}, &dataMsg{}); err != protocol.StatusInvalidHandle {
		t.Errorf("transact on a file: %v", err)
	}
	if _, err := tr.ReadAt(ctx, ph.Handle, make([]byte, 1), 0); err != protocol.StatusInvalidHandle {
		t.Errorf("read on a pipe: %v", err)
	}
}
