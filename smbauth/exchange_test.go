package smbauth

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

var testUsers = map[string][16]byte{
	"alice": NTHash("correct horse"),
	"bob":   NTHash("battery staple"),
}

func testServer() *Server {
	return NewServer(ServerConfig{
		TargetName:      "LWIODOM",
		NetbiosComputer: "FILER",
		DNSDomain:       "lwio.test",
		DNSComputer:     "filer.lwio.test",
		Lookup: func(user, domain string) ([16]byte, bool) {
			h, ok := testUsers[user]
			return h, ok
		},
	})
}

// exchange runs NEGOTIATE → CHALLENGE → AUTHENTICATE between a client and
// the server, returning both sides' results.
func exchange(t *testing.T, s *Server, cfg ClientConfig) (Result, []byte, error) {
	t.Helper()
	c := NewClient(cfg)
	neg, err := c.Negotiate()
	if err != nil {
		t.Fatalf("Negotiate: %v", err)
	}
	ch, st, err := s.Challenge(neg)
	if err != nil {
		t.Fatalf("Challenge: %v", err)
	}
	auth, ckey, err := c.Authenticate(ch)
	if err != nil {
		t.Fatalf("client Authenticate: %v", err)
	}
	res, err := st.Authenticate(auth)
	return res, ckey, err
}

func TestExchange(t *testing.T) {
	for _, tc := range []struct {
		name    string
		noKeyEx bool
	}{{"key-exch", false}, {"no-key-exch", true}} {
		t.Run(tc.name, func(t *testing.T) {
			res, ckey, err := exchange(t, testServer(), ClientConfig{
				User: "alice", Domain: "LWIODOM", Workstation: "WS1",
				Password: "correct horse", DisableKeyExchange: tc.noKeyEx,
			})
			if err != nil {
				t.Fatalf("server Authenticate: %v", err)
			}
			if res.User != "alice" || res.Domain != "LWIODOM" || res.Workstation != "WS1" {
				t.Errorf("result names = %q %q %q", res.User, res.Domain, res.Workstation)
			}
			if len(res.SessionKey) != 16 || !bytes.Equal(res.SessionKey, ckey) {
				t.Fatalf("session keys differ: server %x client %x", res.SessionKey, ckey)
			}
		})
	}
}

func TestExchangeWithNTHash(t *testing.T) {
	h := NTHash("battery staple")
	_, _, err := exchange(t, testServer(), ClientConfig{User: "bob", NTHash: &h})
	if err != nil {
		t.Fatalf("Authenticate with NT hash: %v", err)
	}
}

func TestLogonFailures(t *testing.T) {
	_, _, errWrong := exchange(t, testServer(), ClientConfig{User: "alice", Password: "wrong"})
	_, _, errUnknown := exchange(t, testServer(), ClientConfig{User: "mallory", Password: "correct horse"})
	if errWrong != ErrLogonFailure || errUnknown != ErrLogonFailure {
		t.Fatalf("wrong password: %v; unknown user: %v; want both ErrLogonFailure", errWrong, errUnknown)
	}
}

func TestChallengeUsedOnce(t *testing.T) {
	s := testServer()
	c := NewClient(ClientConfig{User: "alice", Password: "correct horse"})
	neg, _ := c.Negotiate()
	ch, st, err := s.Challenge(neg)
	if err != nil {
		t.Fatal(err)
	}
	auth, _, err := c.Authenticate(ch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Authenticate(auth); err != nil {
		t.Fatalf("first Authenticate: %v", err)
	}
	if _, err := st.Authenticate(auth); !errors.Is(err, ErrLogonFailure) {
		t.Fatalf("replayed Authenticate: %v, want ErrLogonFailure", err)
	}
}

func TestStaleTimestamp(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := testServer()
	s.cfg.Now = func() time.Time { return now }
	c := NewClient(ClientConfig{User: "alice", Password: "correct horse"})
	neg, _ := c.Negotiate()
	ch, st, _ := s.Challenge(neg)
	auth, _, _ := c.Authenticate(ch)
	now = now.Add(DefaultMaxClockSkew + time.Second)
	if _, err := st.Authenticate(auth); err != ErrLogonFailure {
		t.Fatalf("answer after the skew window: %v, want ErrLogonFailure", err)
	}
}
