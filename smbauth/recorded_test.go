package smbauth

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// A transcript recorded from TestImpacketClient (keyexch=true/good): impacket's
// NEGOTIATE, this server's CHALLENGE, impacket's AUTHENTICATE (NTLMv2 with
// KEY_EXCH, no MsvAvFlags, no MIC) and the exported session key impacket chose.
// It keeps the interoperability check alive where impacket is not installed.
const (
	impacketNegotiate    = "4e544c4d5353500001000000358288e000000000000000000000000000000000"
	impacketChallenge    = "4e544c4d53535000020000000e000e0038000000158289e2ac9dda8c6edceb40000000000000000068006800460000000a007c4f0000000f4c00570049004f0044004f004d0002000e004c00570049004f0044004f004d0001000a00460049004c0045005200040012006c00770069006f002e00740065007300740003001e00660069006c00650072002e006c00770069006f002e0074006500730074000700080039f7e0447d7bdd0100000000"
	impacketAuthenticate = "4e544c4d5353500003000000180018006e000000b000b000860000000e000e00400000000a000a004e00000016001600580000001000100036010000158288e04c00570049004f0044004f004d0061006c0069006300650057004f0052004b00530054004100540049004f004e00acbdce6f619f083f1c1402191ec2f89e4e34466d556d6479483de17c8199b918088b1f5ee1d16c13010100000000000039f7e0447d7bdd014e34466d556d64790000000002000e004c00570049004f0044004f004d0001000a00460049004c0045005200040012006c00770069006f002e00740065007300740003001e00660069006c00650072002e006c00770069006f002e0074006500730074000700080039f7e0447d7bdd010900140063006900660073002f00460049004c00450052000000000000000000e920ea3fa34a8b660032875f33f3f7f4"
	impacketSessionKey   = "446d38426e326a6d774351576b466779"
)

func recordedServer(requireMIC bool) *Server {
	s := testServer()
	s.cfg.MaxClockSkew = -1
	s.cfg.RequireMIC = requireMIC
	return s
}

func TestRecordedImpacket(t *testing.T) {
	st := stateFor(t, recordedServer(false), unhex(t, impacketNegotiate), unhex(t, impacketChallenge))
	res, err := st.Authenticate(unhex(t, impacketAuthenticate))
	if err != nil {
		t.Fatalf("Authenticate: %v", err)
	}
	if res.User != "alice" || res.Domain != "LWIODOM" || res.Workstation != "WORKSTATION" {
		t.Errorf("result = %+v", res)
	}
	if !bytes.Equal(res.SessionKey, unhex(t, impacketSessionKey)) {
		t.Errorf("session key %x, impacket's %s", res.SessionKey, impacketSessionKey)
	}
}

func TestRequireMIC(t *testing.T) {
	st := stateFor(t, recordedServer(true), unhex(t, impacketNegotiate), unhex(t, impacketChallenge))
	if _, err := st.Authenticate(unhex(t, impacketAuthenticate)); err != ErrLogonFailure {
		t.Fatalf("MIC-less AUTHENTICATE with RequireMIC: %v, want ErrLogonFailure", err)
	}
	// Chromium sends a MIC, so RequireMIC lets it in.
	s := specServer()
	s.cfg.RequireMIC = true
	if _, err := stateFor(t, s, unhex(t, chromiumNegotiate), unhex(t, specChallenge)).Authenticate(unhex(t, chromiumAuthenticate)); err != nil {
		t.Fatalf("Chromium with RequireMIC: %v", err)
	}
}

// The impacket AUTHENTICATE's encrypted key opens to the key impacket chose.
func TestRecordedKeyExchange(t *testing.T) {
	m, err := ParseAuthenticate(unhex(t, impacketAuthenticate))
	if err != nil {
		t.Fatal(err)
	}
	v2, err := parseNTLMv2Response(m.NtChallengeResponse)
	if err != nil {
		t.Fatal(err)
	}
	key := NTOWFv2(NTHash("correct horse"), "alice", "LWIODOM")
	base := sessionBaseKey(key, v2.proof)
	if got := hex.EncodeToString(rc4K(base[:], m.EncryptedRandomSessionKey)); got != impacketSessionKey {
		t.Errorf("decrypted key %s, want %s", got, impacketSessionKey)
	}
}
