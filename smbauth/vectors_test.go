package smbauth

import (
	"bytes"
	"encoding/hex"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// The MS-NLMP §4.2.4 NTLMv2 example.
const (
	specUser            = "User"
	specDomain          = "Domain"
	specPassword        = "Password"
	specServerChallenge = "0123456789abcdef"
	specClientChallenge = "aaaaaaaaaaaaaaaa"
	specRandomKey       = "55555555555555555555555555555555"
	// §4.2.4.1.3: MsvAvNbDomainName "Domain", MsvAvNbComputerName "Server", MsvAvEOL.
	specAVPairs = "02000c0044006f006d00610069006e0001000c0053006500720076006500720000000000"

	specNTOWFv2        = "0c868a403bfd7a93a3001ef22ef02e3f"                 // §4.2.4.1.1
	specSessionBaseKey = "8de40ccadbc14a82f15cb0ad0de95ca3"                 // §4.2.4.1.2
	specNTProofStr     = "68cd0ab851e51c96aabc927bebef6a1c"                 // §4.2.4.2.2
	specLMv2Response   = "86c35097ac9cec102554764a57cccc19aaaaaaaaaaaaaaaa" // §4.2.4.2.1
	specEncryptedKey   = "c5dad2544fc9799094ce1ce90bc9d03e"                 // §4.2.4.2.3
	specNTHash         = "a4f49c406510bdcab6824ee7c30fd852"                 // §4.2.2.1.2 NTOWFv1("Password")
)

func TestSpecVectors(t *testing.T) {
	var sc, cc [8]byte
	copy(sc[:], unhex(t, specServerChallenge))
	copy(cc[:], unhex(t, specClientChallenge))

	nt := NTHash(specPassword)
	if got := FormatNTHash(nt); got != specNTHash {
		t.Errorf("NTHash(%q) = %s, want %s", specPassword, got, specNTHash)
	}
	key := NTOWFv2(nt, specUser, specDomain)
	if got := hex.EncodeToString(key[:]); got != specNTOWFv2 {
		t.Errorf("NTOWFv2 = %s, want %s", got, specNTOWFv2)
	}
	temp := ntlmv2Temp(0, cc, unhex(t, specAVPairs))
	proof := ntProofStr(key, sc, temp)
	if got := hex.EncodeToString(proof[:]); got != specNTProofStr {
		t.Errorf("NTProofStr = %s, want %s", got, specNTProofStr)
	}
	base := sessionBaseKey(key, proof)
	if got := hex.EncodeToString(base[:]); got != specSessionBaseKey {
		t.Errorf("session base key = %s, want %s", got, specSessionBaseKey)
	}
	if got := hex.EncodeToString(lmv2Response(key, sc, cc)); got != specLMv2Response {
		t.Errorf("LMv2 response = %s, want %s", got, specLMv2Response)
	}
	enc := rc4K(base[:], unhex(t, specRandomKey))
	if got := hex.EncodeToString(enc); got != specEncryptedKey {
		t.Errorf("EncryptedRandomSessionKey = %s, want %s", got, specEncryptedKey)
	}
	if dec := rc4K(base[:], enc); !bytes.Equal(dec, unhex(t, specRandomKey)) {
		t.Errorf("RC4K does not invert itself: %x", dec)
	}
}
