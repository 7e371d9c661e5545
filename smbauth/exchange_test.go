package smbauth

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
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
			h, ok := testUsers[strings.ToLower(user)]
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
	st, auth := handshake(t, s, ClientConfig{User: "alice", Password: "correct horse"})
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

// stateFor builds the server state that issued a recorded CHALLENGE in answer
// to a recorded NEGOTIATE, so third-party AUTHENTICATE messages can be checked.
func stateFor(t *testing.T, s *Server, negotiate, challenge []byte) *ServerState {
	t.Helper()
	m, err := ParseChallenge(challenge)
	if err != nil {
		t.Fatal(err)
	}
	return &ServerState{s: s, negotiate: negotiate, challenge: challenge, msg: *m}
}

func specServer() *Server {
	return NewServer(ServerConfig{
		MaxClockSkew: -1, // recorded messages carry their recording's time
		Lookup: func(user, domain string) ([16]byte, bool) {
			if user == specUser {
				return NTHash(specPassword), true
			}
			return [16]byte{}, false
		},
	})
}

// The server accepts the AUTHENTICATE a standard client (Chromium) built for
// the §4.2.4 CHALLENGE, MIC included, and derives the key the MIC proves.
func TestServerAcceptsChromium(t *testing.T) {
	st := stateFor(t, specServer(), unhex(t, chromiumNegotiate), unhex(t, specChallenge))
	res, err := st.Authenticate(unhex(t, chromiumAuthenticate))
	if err != nil {
		t.Fatalf("Authenticate: %v", err)
	}
	if res.User != "User" || res.Domain != "Domain" || res.Workstation != "COMPUTER" {
		t.Errorf("result = %+v", res)
	}
	// No KEY_EXCH in Chromium's flags: the exported key is the session base key.
	// (It differs from §4.2.4.1.2's because the AV pairs, hence NTProofStr, differ.)
	if len(res.SessionKey) != 16 {
		t.Errorf("session key %x", res.SessionKey)
	}
}

func TestServerRefusesTamperedChromium(t *testing.T) {
	good := unhex(t, chromiumAuthenticate)
	for _, tc := range []struct {
		name string
		at   int
	}{
		{"MIC", 72},
		{"NTProofStr", int(le.Uint32(good[24:]))},
		{"client challenge in the blob", int(le.Uint32(good[24:])) + 16 + 16},
		{"flags", 60},
		{"user name", int(le.Uint32(good[40:]))},
	} {
		bad := append([]byte(nil), good...)
		bad[tc.at] ^= 0x01
		st := stateFor(t, specServer(), unhex(t, chromiumNegotiate), unhex(t, specChallenge))
		if _, err := st.Authenticate(bad); err != ErrLogonFailure {
			t.Errorf("tampered %s: %v, want ErrLogonFailure", tc.name, err)
		}
	}
	// The MIC also covers the NEGOTIATE and CHALLENGE the server saw.
	neg := unhex(t, chromiumNegotiate)
	neg[12] ^= 0x04
	if _, err := stateFor(t, specServer(), neg, unhex(t, specChallenge)).Authenticate(good); err != ErrLogonFailure {
		t.Errorf("MIC over a different NEGOTIATE: %v, want ErrLogonFailure", err)
	}
}

// The client reproduces the §4.2.4 NTLMv2 response for the spec's CHALLENGE
// (which has no MsvAvTimestamp: time is the client's, here 0).
func TestClientSpecResponse(t *testing.T) {
	rnd := bytes.NewReader(unhex(t, specClientChallenge+specRandomKey))
	c := NewClient(ClientConfig{
		User: specUser, Domain: specDomain, Workstation: "COMPUTER", Password: specPassword,
		Now:  func() time.Time { return FiletimeTime(0) },
		Rand: rnd,
	})
	if _, err := c.Negotiate(); err != nil {
		t.Fatal(err)
	}
	auth, key, err := c.Authenticate(unhex(t, specChallenge))
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseAuthenticate(auth)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(m.NtChallengeResponse[:16]); got != specNTProofStr {
		t.Errorf("NTProofStr = %s, want %s", got, specNTProofStr)
	}
	if got := hex.EncodeToString(m.LmChallengeResponse); got != specLMv2Response {
		t.Errorf("LmChallengeResponse = %s, want %s", got, specLMv2Response)
	}
	if got := hex.EncodeToString(m.EncryptedRandomSessionKey); got != specEncryptedKey {
		t.Errorf("EncryptedRandomSessionKey = %s, want %s", got, specEncryptedKey)
	}
	if got := hex.EncodeToString(key); got != specRandomKey {
		t.Errorf("exported session key = %s, want the random key %s", got, specRandomKey)
	}
	if m.MIC != nil {
		t.Errorf("MIC %x sent although the CHALLENGE had no MsvAvTimestamp", m.MIC)
	}
	if m.UserName != specUser || m.DomainName != specDomain || m.Workstation != "COMPUTER" {
		t.Errorf("names = %q %q %q", m.UserName, m.DomainName, m.Workstation)
	}
}

// Our client asks for SEAL only when told to, and learns whether the server
// granted it; the server reports the agreement in Result.Flags.
func TestExchangeSealFlag(t *testing.T) {
	for _, tc := range []struct {
		request, disable, granted bool
	}{
		{false, false, false},
		{true, false, true},
		{true, true, false},
	} {
		s := testServer()
		s.cfg.DisableSeal = tc.disable
		c := NewClient(ClientConfig{User: "alice", Password: "correct horse", RequestSeal: tc.request})
		st, auth := handshakeWith(t, s, c)
		res, err := st.Authenticate(auth)
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		if got := c.Negotiated()&FlagSeal != 0; got != tc.granted {
			t.Errorf("%+v: client Negotiated %v", tc, c.Negotiated())
		}
		if got := res.Flags&FlagSeal != 0; got != tc.granted {
			t.Errorf("%+v: server Result.Flags %v", tc, res.Flags)
		}
	}
}
