package smbauth

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// Messages of MS-NLMP §4.2.4.3 and the AUTHENTICATE Chromium's NTLM client
// produces for them (net/ntlm/ntlm_test_data.h, kExpectedAuthenticateMsgSpecResponseV2:
// user "User", domain "Domain", workstation "COMPUTER", password "Password",
// client challenge aaaaaaaaaaaaaaaa, MsvAvChannelBindings and
// MsvAvTargetName "HTTP/Server", MIC keyed by the session base key).
const (
	chromiumNegotiate = "4e544c4d53535000010000000782080000000000200000000000000020000000"
	specChallenge     = "4e544c4d53535000020000000c000c003800000033828ae20123456789abcdef" +
		"00000000000000002400240044000000060070170000000f" +
		"53006500720076006500720002000c0044006f006d00610069006e0001000c0053006500720076006500720000000000"
	chromiumAuthenticate = "4e544c4d535350000300000018001800580000008a008a00700000000c000c00fa0000000800080006010000100010000e010000000000" +
		"0058000000038208000000000000000000f7361633f0ad9bdf4a7c421bc6b824a300000000000000000000000000000000000000000000" +
		"00008c0260dbef690662af9c42d50782d2ed0101000000000000800bc8fd00d4d201aaaaaaaaaaaaaaaa0000000002000c0044006f006d" +
		"00610069006e0001000c0053006500720076006500720006000400020000000a0010006586e99d81c2fc984e47172fd4dd031009001600" +
		"48005400540050002f00530065007200760065007200000000000000000044006f006d00610069006e00550073006500720043004f004d" +
		"0050005500540045005200"
)

func TestParseSpecChallenge(t *testing.T) {
	b := unhex(t, specChallenge)
	m, err := ParseChallenge(b)
	if err != nil {
		t.Fatal(err)
	}
	// §4.2.4: flags 0xe28a8233, TargetName "Server", Version 6.0.6000 rev 15.
	if m.Flags != 0xe28a8233 {
		t.Errorf("flags = %v (%#x)", m.Flags, uint32(m.Flags))
	}
	if m.TargetName != "Server" {
		t.Errorf("TargetName = %q", m.TargetName)
	}
	if hex.EncodeToString(m.ServerChallenge[:]) != specServerChallenge {
		t.Errorf("ServerChallenge = %x", m.ServerChallenge)
	}
	if want := (Version{6, 0, 6000, 15}); m.Version == nil || *m.Version != want {
		t.Errorf("Version = %+v, want %+v", m.Version, want)
	}
	if got := hex.EncodeToString(m.TargetInfo.Marshal()); got != specAVPairs {
		t.Errorf("TargetInfo = %s, want %s", got, specAVPairs)
	}
	if m.TargetInfo.StringValue(AvNbDomainName) != "Domain" || m.TargetInfo.StringValue(AvNbComputerName) != "Server" {
		t.Errorf("AV pairs = %+v", m.TargetInfo)
	}
	if got := m.Marshal(); !bytes.Equal(got, b) {
		t.Errorf("re-encoded spec CHALLENGE differs:\n got %x\nwant %x", got, b)
	}
}

func TestParseChromiumNegotiate(t *testing.T) {
	b := unhex(t, chromiumNegotiate)
	m, err := ParseNegotiate(b)
	if err != nil {
		t.Fatal(err)
	}
	want := FlagUnicode | FlagOEM | FlagRequestTarget | FlagNTLM | FlagAlwaysSign | FlagExtendedSessionSecurity
	if m.Flags != want || m.Version != nil || m.DomainName != "" || m.Workstation != "" {
		t.Errorf("got %+v (flags %v), want flags %v and nothing else", m, m.Flags, want)
	}
	if got := m.Marshal(); !bytes.Equal(got, b) {
		t.Errorf("re-encoded NEGOTIATE differs:\n got %x\nwant %x", got, b)
	}
}

func TestParseChromiumAuthenticate(t *testing.T) {
	m, err := ParseAuthenticate(unhex(t, chromiumAuthenticate))
	if err != nil {
		t.Fatal(err)
	}
	if m.UserName != "User" || m.DomainName != "Domain" || m.Workstation != "COMPUTER" {
		t.Errorf("names = %q %q %q", m.UserName, m.DomainName, m.Workstation)
	}
	if got := hex.EncodeToString(m.MIC); got != "f7361633f0ad9bdf4a7c421bc6b824a3" {
		t.Errorf("MIC = %s", got)
	}
	if !bytes.Equal(m.LmChallengeResponse, make([]byte, 24)) {
		t.Errorf("LmChallengeResponse = %x, want Z(24)", m.LmChallengeResponse)
	}
	v2, err := parseNTLMv2Response(m.NtChallengeResponse)
	if err != nil {
		t.Fatal(err)
	}
	if hex.EncodeToString(v2.clientChallenge[:]) != specClientChallenge {
		t.Errorf("client challenge = %x", v2.clientChallenge)
	}
	if v2.avPairs.Flags() != AvFlagMICPresent || v2.avPairs.StringValue(AvTargetName) != "HTTP/Server" {
		t.Errorf("AV pairs = %+v", v2.avPairs)
	}
}

// Golden bytes written by hand from the layouts of §2.2.1.
func TestGoldenNegotiate(t *testing.T) {
	const want = "4e544c4d53535000" + "01000000" + "158208e2" + // signature, type 1, flags
		"0000000028000000" + "0000000028000000" + // DomainNameFields, WorkstationFields: empty, at 40
		"0a007c4f0000000f" // Version 10.0.20348, NTLM revision 15
	c := NewClient(ClientConfig{User: "u", Password: "p"})
	got, err := c.Negotiate()
	if err != nil {
		t.Fatal(err)
	}
	if hex.EncodeToString(got) != want {
		t.Errorf("NEGOTIATE\n got %x\nwant %s", got, want)
	}
}

func TestGoldenAuthenticate(t *testing.T) {
	const want = "4e544c4d53535000" + "03000000" +
		"0200020046000000" + // LmChallengeResponseFields: 2 at 70
		"1800180048000000" + // NtChallengeResponseFields: 24 at 72
		"0200020040000000" + // DomainNameFields: 2 at 64
		"0200020042000000" + // UserNameFields: 2 at 66
		"0200020044000000" + // WorkstationFields: 2 at 68
		"0200020060000000" + // EncryptedRandomSessionKeyFields: 2 at 96
		"01020000" + // UNICODE | NTLM, so no Version, and no MIC
		"4400" + "5500" + "5700" + "0102" +
		"030303030303030303030303030303030303030303030303" +
		"0405"
	m := AuthenticateMessage{
		Flags:                     FlagUnicode | FlagNTLM,
		LmChallengeResponse:       []byte{1, 2},
		NtChallengeResponse:       bytes.Repeat([]byte{3}, 24),
		DomainName:                "D",
		UserName:                  "U",
		Workstation:               "W",
		EncryptedRandomSessionKey: []byte{4, 5},
	}
	got := m.Marshal()
	if hex.EncodeToString(got) != want {
		t.Errorf("AUTHENTICATE\n got %x\nwant %s", got, want)
	}
	back, err := ParseAuthenticate(got)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, &m) {
		t.Errorf("decoded %+v, want %+v", back, &m)
	}
}

// roundTripMessages has every field non-zero.
func roundTripMessages(t testing.TB) (neg *NegotiateMessage, ch *ChallengeMessage, auth *AuthenticateMessage) {
	v := &Version{ProductMajor: 6, ProductMinor: 1, ProductBuild: 7601, NTLMRevision: 15}
	neg = &NegotiateMessage{
		Flags:       FlagOEMDomainSupplied | FlagOEMWorkstationSupplied | FlagVersion | FlagNTLM,
		DomainName:  "WORKGROUP",
		Workstation: "PC01",
		Version:     v,
	}
	ch = &ChallengeMessage{
		Flags:           FlagUnicode | FlagNTLM | FlagTargetInfo | FlagVersion,
		TargetName:      "DOMÄIN",
		ServerChallenge: [8]byte{1, 2, 3, 4, 5, 6, 7, 8},
		TargetInfo: AVPairs{
			{AvNbDomainName, utf16le("DOMÄIN")},
			{AvTimestamp, []byte{1, 2, 3, 4, 5, 6, 7, 8}},
			{AvID(0x77), []byte{9}},
		},
		Version: v,
	}
	nt := ntProofStr([16]byte{1}, ch.ServerChallenge, ntlmv2Temp(42, [8]byte{9, 9}, AVPairs{
		{AvFlags, []byte{2, 0, 0, 0}},
	}.Marshal()))
	auth = &AuthenticateMessage{
		Flags:                     FlagUnicode | FlagNTLM | FlagVersion | FlagKeyExch,
		LmChallengeResponse:       bytes.Repeat([]byte{0xaa}, 24),
		NtChallengeResponse:       append(nt[:], ntlmv2Temp(42, [8]byte{9, 9}, AVPairs{{AvFlags, []byte{2, 0, 0, 0}}}.Marshal())...),
		DomainName:                "Dömain",
		UserName:                  "Üser",
		Workstation:               "WS",
		EncryptedRandomSessionKey: bytes.Repeat([]byte{0x55}, 16),
		Version:                   v,
		MIC:                       bytes.Repeat([]byte{0x77}, 16),
	}
	return neg, ch, auth
}

func TestRoundTrip(t *testing.T) {
	neg, ch, auth := roundTripMessages(t)
	if got, err := ParseNegotiate(neg.Marshal()); err != nil || !reflect.DeepEqual(got, neg) {
		t.Errorf("NEGOTIATE: %+v, %v; want %+v", got, err, neg)
	}
	if got, err := ParseChallenge(ch.Marshal()); err != nil || !reflect.DeepEqual(got, ch) {
		t.Errorf("CHALLENGE: %+v, %v; want %+v", got, err, ch)
	}
	if got, err := ParseAuthenticate(auth.Marshal()); err != nil || !reflect.DeepEqual(got, auth) {
		t.Errorf("AUTHENTICATE: %+v, %v; want %+v", got, err, auth)
	}
}

// Size pins: the fixed parts of §2.2.1.
func TestSizes(t *testing.T) {
	neg, ch, auth := roundTripMessages(t)
	for _, tc := range []struct {
		name  string
		b     []byte
		fixed int
	}{
		{"NEGOTIATE", (&NegotiateMessage{}).Marshal(), 32},
		{"NEGOTIATE+Version", (&NegotiateMessage{Version: neg.Version}).Marshal(), 40},
		{"CHALLENGE", (&ChallengeMessage{}).Marshal(), 48},
		{"CHALLENGE+Version", (&ChallengeMessage{Version: ch.Version}).Marshal(), 56},
		{"AUTHENTICATE", (&AuthenticateMessage{}).Marshal(), 64},
		{"AUTHENTICATE+Version", (&AuthenticateMessage{Version: auth.Version}).Marshal(), 72},
		{"AUTHENTICATE+MIC", (&AuthenticateMessage{MIC: auth.MIC}).Marshal(), 88},
	} {
		if len(tc.b) != tc.fixed {
			t.Errorf("%s: %d bytes, want %d", tc.name, len(tc.b), tc.fixed)
		}
	}
}

// Every strict prefix of a valid message, and every descriptor pointed past
// the end, must be refused with ErrMalformed.
func TestTruncatedAndOutOfBounds(t *testing.T) {
	neg, ch, auth := roundTripMessages(t)
	type parser func([]byte) error
	cases := []struct {
		name   string
		b      []byte
		parse  parser
		fields []int
	}{
		{"NEGOTIATE", neg.Marshal(), func(b []byte) error { _, err := ParseNegotiate(b); return err }, []int{16, 24}},
		{"CHALLENGE", ch.Marshal(), func(b []byte) error { _, err := ParseChallenge(b); return err }, []int{12, 40}},
		{"AUTHENTICATE", auth.Marshal(), func(b []byte) error { _, err := ParseAuthenticate(b); return err }, []int{12, 20, 28, 36, 44, 52}},
	}
	for _, tc := range cases {
		for n := 0; n < len(tc.b); n++ {
			if err := tc.parse(tc.b[:n]); !errors.Is(err, ErrMalformed) {
				t.Errorf("%s truncated to %d of %d bytes: %v, want ErrMalformed", tc.name, n, len(tc.b), err)
			}
		}
		for _, at := range tc.fields {
			for _, off := range []uint32{uint32(len(tc.b)), 0xffffffff, 0xfffffff0} {
				b := append([]byte(nil), tc.b...)
				le.PutUint32(b[at+4:], off)
				if err := tc.parse(b); !errors.Is(err, ErrMalformed) {
					t.Errorf("%s field at %d pointing to %#x: %v, want ErrMalformed", tc.name, at, off, err)
				}
			}
			b := append([]byte(nil), tc.b...)
			le.PutUint16(b[at:], 0xffff)
			if err := tc.parse(b); !errors.Is(err, ErrMalformed) {
				t.Errorf("%s field at %d with length 0xffff: %v, want ErrMalformed", tc.name, at, err)
			}
		}
		bad := append([]byte(nil), tc.b...)
		bad[0] = 'X'
		if err := tc.parse(bad); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "signature") {
			t.Errorf("%s with a bad signature: %v", tc.name, err)
		}
		bad = append([]byte(nil), tc.b...)
		bad[8] = 9
		if err := tc.parse(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s with MessageType 9: %v", tc.name, err)
		}
	}
}

func TestParseAVPairs(t *testing.T) {
	for _, tc := range []struct {
		name, hex string
		ok        bool
	}{
		{"empty", "", true},
		{"EOL only", "00000000", true},
		{"spec", specAVPairs, true},
		{"trailing bytes after EOL ignored", specAVPairs + "deadbeef", true},
		{"no EOL", "02000c0044006f006d00610069006e00", false},
		{"value past the end", "02000d0044006f006d00610069006e0000000000", false},
		{"short header", "0200", false},
	} {
		_, err := ParseAVPairs(unhex(t, tc.hex))
		if (err == nil) != tc.ok {
			t.Errorf("%s: err = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestFlagsString(t *testing.T) {
	if got := (FlagUnicode | FlagNTLM | 0x100).String(); got != "UNICODE|NTLM|0x00000100" {
		t.Errorf("String = %q", got)
	}
}
