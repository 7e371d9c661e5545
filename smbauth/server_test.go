package smbauth

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// handshake returns a fresh server state and the honest client's answer.
func handshake(t testing.TB, s *Server, cfg ClientConfig) (*ServerState, []byte) {
	t.Helper()
	return handshakeWith(t, s, NewClient(cfg))
}

// handshakeWith is handshake with a client the caller keeps.
func handshakeWith(t testing.TB, s *Server, c *Client) (*ServerState, []byte) {
	t.Helper()
	neg, err := c.Negotiate()
	if err != nil {
		t.Fatal(err)
	}
	return answer(t, s, c, neg)
}

// answer has s challenge the NEGOTIATE neg and c answer it; it returns
// the server state and c's AUTHENTICATE.
func answer(t testing.TB, s *Server, c *Client, neg []byte) (*ServerState, []byte) {
	t.Helper()
	ch, st, err := s.Challenge(neg)
	if err != nil {
		t.Fatal(err)
	}
	auth, _, err := c.Authenticate(ch)
	if err != nil {
		t.Fatal(err)
	}
	return st, auth
}

var alice = ClientConfig{User: "alice", Domain: "LWIODOM", Workstation: "WS1", Password: "correct horse"}

// Each mutation of an honest AUTHENTICATE is refused with ErrLogonFailure.
func TestServerRefusesTampering(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte
	}{
		{"NTProofStr", func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte {
			m.NtChallengeResponse[0] ^= 1
			return m.Marshal()
		}},
		{"MIC", func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte {
			raw[authMICOffset+5] ^= 1
			return raw
		}},
		{"MIC zeroed", func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte {
			clear(raw[authMICOffset : authMICOffset+authMICSize])
			return raw
		}},
		{"MsvAvFlags removed (MIC stripped)", func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte {
			v2, err := parseNTLMv2Response(m.NtChallengeResponse)
			if err != nil {
				t.Fatal(err)
			}
			var pairs AVPairs
			for _, p := range v2.avPairs {
				if p.ID != AvFlags {
					pairs = append(pairs, p)
				}
			}
			temp := ntlmv2Temp(v2.timestamp, v2.clientChallenge, pairs.Marshal())
			m.NtChallengeResponse = append(v2.proof[:], temp...)
			m.MIC = nil
			return m.Marshal()
		}},
		{"encrypted session key", func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte {
			m.EncryptedRandomSessionKey[3] ^= 1
			return m.Marshal()
		}},
		{"KEY_EXCH dropped", func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte {
			m.Flags &^= FlagKeyExch
			m.EncryptedRandomSessionKey = nil
			return m.Marshal()
		}},
		{"KEY_EXCH without a key", func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte {
			m.EncryptedRandomSessionKey = nil
			return m.Marshal()
		}},
		{"user name", func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte {
			m.UserName = "ALICE" // NTOWFv2 upper-cases it and Lookup ignores case: only the MIC catches this
			return m.Marshal()
		}},
		{"domain", func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte {
			m.DomainName = "OTHER"
			return m.Marshal()
		}},
		{"NTLMv1-sized response", func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte {
			m.NtChallengeResponse = m.NtChallengeResponse[:24]
			m.MIC = nil
			return m.Marshal()
		}},
		{"anonymous", func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte {
			return (&AuthenticateMessage{Flags: m.Flags | FlagAnonymous, LmChallengeResponse: []byte{0}}).Marshal()
		}},
		{"empty user", func(t *testing.T, m *AuthenticateMessage, raw []byte) []byte {
			m.UserName = ""
			return m.Marshal()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, raw := handshake(t, testServer(), alice)
			m, err := ParseAuthenticate(raw)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Authenticate(tc.mutate(t, m, raw)); err != ErrLogonFailure {
				t.Fatalf("Authenticate: %v, want ErrLogonFailure", err)
			}
		})
	}
}

// An honest AUTHENTICATE for one challenge is useless against another.
func TestAuthenticateForOtherChallenge(t *testing.T) {
	s := testServer()
	_, auth := handshake(t, s, alice)
	st2, _ := handshake(t, s, alice)
	if _, err := st2.Authenticate(auth); err != ErrLogonFailure {
		t.Fatalf("AUTHENTICATE replayed on another exchange: %v, want ErrLogonFailure", err)
	}
}

// A malformed AUTHENTICATE is a protocol error, not a logon failure, and it
// spends the state all the same.
func TestMalformedSpendsState(t *testing.T) {
	st, auth := handshake(t, testServer(), alice)
	if _, err := st.Authenticate(auth[:40]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated AUTHENTICATE: %v, want ErrMalformed", err)
	}
	if _, err := st.Authenticate(auth); err != ErrLogonFailure {
		t.Fatalf("honest AUTHENTICATE after a malformed one: %v, want ErrLogonFailure", err)
	}
}

// Racing the same AUTHENTICATE on one state: exactly one wins.
func TestConcurrentReplay(t *testing.T) {
	st, auth := handshake(t, testServer(), alice)
	var wins, fails atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := st.Authenticate(auth); err == nil {
				wins.Add(1)
			} else if err == ErrLogonFailure {
				fails.Add(1)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 || fails.Load() != 7 {
		t.Fatalf("%d successes and %d logon failures, want 1 and 7", wins.Load(), fails.Load())
	}
}

// An unknown user costs the server what a wrong password does: same lookups,
// same allocations (hence the same hashing of the same sizes).
func TestUnknownUserSameWork(t *testing.T) {
	var lookups atomic.Int32
	s := NewServer(ServerConfig{Lookup: func(user, domain string) ([16]byte, bool) {
		lookups.Add(1)
		h, ok := testUsers[user]
		return h, ok
	}})
	const runs = 20
	prepare := func(cfg ClientConfig) (sts []*ServerState, auths [][]byte) {
		for range runs + 1 {
			st, a := handshake(t, s, cfg)
			sts, auths = append(sts, st), append(auths, a)
		}
		return
	}
	// Same name lengths, so the messages have the same size.
	wrong := ClientConfig{User: "alice", Password: "wrong horse"}
	unknown := ClientConfig{User: "erin_", Password: "correct horse"}
	measure := func(cfg ClientConfig) (allocs float64, n int32) {
		sts, auths := prepare(cfg)
		lookups.Store(0)
		i := 0
		allocs = testing.AllocsPerRun(runs, func() {
			if _, err := sts[i].Authenticate(auths[i]); err != ErrLogonFailure {
				t.Fatalf("%+v: %v, want ErrLogonFailure", cfg, err)
			}
			i++
		})
		return allocs, lookups.Load()
	}
	aw, lw := measure(wrong)
	au, lu := measure(unknown)
	if aw != au || lw != lu {
		t.Errorf("wrong password: %v allocs, %d lookups; unknown user: %v allocs, %d lookups", aw, lw, au, lu)
	}
}

func TestChallengeMessage(t *testing.T) {
	s := testServer()
	neg, _ := NewClient(alice).Negotiate()
	chB, _, err := s.Challenge(neg)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := ParseChallenge(chB)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []NegotiateFlags{FlagUnicode, FlagRequestTarget, FlagSign, FlagNTLM, FlagAlwaysSign,
		FlagExtendedSessionSecurity, FlagTargetInfo, Flag128, FlagKeyExch, Flag56, FlagVersion, FlagTargetTypeDomain} {
		if ch.Flags&f == 0 {
			t.Errorf("CHALLENGE flags %v lack %v", ch.Flags, f)
		}
	}
	if ch.Flags&(FlagSeal|FlagLMKey|FlagOEM|FlagTargetTypeServer) != 0 {
		t.Errorf("CHALLENGE flags %v", ch.Flags)
	}
	if ch.TargetName != "LWIODOM" {
		t.Errorf("TargetName %q", ch.TargetName)
	}
	want := map[AvID]string{AvNbDomainName: "LWIODOM", AvNbComputerName: "FILER",
		AvDNSDomainName: "lwio.test", AvDNSComputerName: "filer.lwio.test"}
	for id, v := range want {
		if got := ch.TargetInfo.StringValue(id); got != v {
			t.Errorf("%v = %q, want %q", id, got, v)
		}
	}
	if _, ok := ch.TargetInfo.Timestamp(); !ok {
		t.Error("no MsvAvTimestamp")
	}
	if ch.Version == nil || *ch.Version != defaultVersion {
		t.Errorf("Version %+v", ch.Version)
	}
	// Two challenges never repeat.
	ch2B, _, _ := s.Challenge(neg)
	ch2, _ := ParseChallenge(ch2B)
	if bytes.Equal(ch.ServerChallenge[:], ch2.ServerChallenge[:]) {
		t.Error("server challenge repeated")
	}
}

func TestChallengeRefusals(t *testing.T) {
	s := testServer()
	for _, tc := range []struct {
		name  string
		flags NegotiateFlags
	}{
		{"no NTLM", FlagUnicode},
		{"no Unicode", FlagNTLM | FlagOEM},
	} {
		if _, _, err := s.Challenge((&NegotiateMessage{Flags: tc.flags}).Marshal()); err == nil {
			t.Errorf("%s: Challenge accepted", tc.name)
		}
	}
	if _, _, err := s.Challenge([]byte("NTLMSSP\x00")); !errors.Is(err, ErrMalformed) {
		t.Errorf("short NEGOTIATE: %v", err)
	}
	if _, _, err := NewServer(ServerConfig{}).Challenge((&NegotiateMessage{Flags: clientFlags}).Marshal()); err == nil {
		t.Error("server without Lookup issued a challenge")
	}
}

func TestNTHashText(t *testing.T) {
	h := NTHash(specPassword)
	back, err := ParseNTHash("  " + "A4F49C406510BDCAB6824EE7C30FD852" + "\n")
	if err != nil || back != h {
		t.Errorf("ParseNTHash(upper case) = %x, %v", back, err)
	}
	for _, bad := range []string{"", "a4f49c406510bdcab6824ee7c30fd85", "a4f49c406510bdcab6824ee7c30fd852aa", "g4f49c406510bdcab6824ee7c30fd852"} {
		if _, err := ParseNTHash(bad); err == nil {
			t.Errorf("ParseNTHash(%q) accepted", bad)
		}
	}
	if NTHash("") == NTHash(" ") {
		t.Error("hash ignores the password")
	}
}

func TestClientMisuse(t *testing.T) {
	if _, err := NewClient(ClientConfig{Password: "x"}).Negotiate(); err == nil {
		t.Error("Negotiate without a user")
	}
	if _, err := NewClient(ClientConfig{User: "u"}).Negotiate(); err == nil {
		t.Error("Negotiate without a password or hash")
	}
	c := NewClient(alice)
	if _, _, err := c.Authenticate(unhex(t, specChallenge)); err == nil {
		t.Error("Authenticate before Negotiate")
	}
	neg, _ := c.Negotiate()
	ch, _, _ := testServer().Challenge(neg)
	if _, _, err := c.Authenticate(ch); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Authenticate(ch); err == nil {
		t.Error("second Authenticate on one Client")
	}
}

// A client that could compute a valid response for an empty user name (a
// Lookup that answers for "") is still refused: no anonymous logons.
func TestEmptyUserRefused(t *testing.T) {
	h := NTHash("pw")
	s := NewServer(ServerConfig{Lookup: func(string, string) ([16]byte, bool) { return h, true }})
	c := NewClient(ClientConfig{Password: "pw"})
	c.negotiate = (&NegotiateMessage{Flags: clientFlags, Version: &defaultVersion}).Marshal()
	st, auth := answer(t, s, c, c.negotiate)
	if _, err := st.Authenticate(auth); err != ErrLogonFailure {
		t.Fatalf("empty user: %v, want ErrLogonFailure", err)
	}
}

// An unknown user is refused even if its response happens to match the
// dummy hash it is checked against.
func TestUnknownUserMatchingDummy(t *testing.T) {
	s := testServer()
	s.dummy = NTHash("dummy")
	st, auth := handshake(t, s, ClientConfig{User: "erin", Password: "dummy"})
	if _, err := st.Authenticate(auth); err != ErrLogonFailure {
		t.Fatalf("unknown user answering for the dummy hash: %v, want ErrLogonFailure", err)
	}
}
