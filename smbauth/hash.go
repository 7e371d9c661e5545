package smbauth

import (
	"crypto/hmac"
	"crypto/md5"
	"crypto/rc4"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf16"

	"golang.org/x/crypto/md4"
)

// NTHash is MD4(UTF-16LE(password)), the only form in which the server keeps
// passwords (MS-NLMP §3.3.2, the MD4(UNICODE(Passwd)) inside NTOWFv2).
func NTHash(password string) [16]byte {
	h := md4.New()
	h.Write(utf16le(password))
	var out [16]byte
	h.Sum(out[:0])
	return out
}

// ParseNTHash decodes the 32 hex digits FormatNTHash produces (either case),
// the form in which the server's TOML configuration stores users.
func ParseNTHash(s string) ([16]byte, error) {
	var out [16]byte
	s = strings.TrimSpace(s)
	if len(s) != 32 {
		return out, fmt.Errorf("smbauth: NT hash must be 32 hex digits, got %d characters", len(s))
	}
	if _, err := hex.Decode(out[:], []byte(s)); err != nil {
		return out, fmt.Errorf("smbauth: NT hash: %v", err)
	}
	return out, nil
}

// FormatNTHash returns the NT hash as 32 lower-case hex digits.
func FormatNTHash(h [16]byte) string {
	return hex.EncodeToString(h[:])
}

// NTOWFv2 is the NTLMv2 response key of MS-NLMP §3.3.2:
// HMAC_MD5(MD4(UNICODE(Passwd)), UNICODE(ConcatenationOf(Uppercase(User), UserDom))).
// The domain is not upper-cased; the user name is.
func NTOWFv2(ntHash [16]byte, user, domain string) [16]byte {
	m := hmac.New(md5.New, ntHash[:])
	m.Write(utf16le(strings.ToUpper(user) + domain))
	var out [16]byte
	m.Sum(out[:0])
	return out
}

// ntlmv2Temp builds the "temp" of MS-NLMP §3.3.2, which is also the
// NTLMv2_CLIENT_CHALLENGE structure of §2.2.2.7:
// Responserversion, HiResponserversion, Z(6), Time, ClientChallenge, Z(4),
// ServerName (the AV pairs), Z(4).
func ntlmv2Temp(timestamp uint64, clientChallenge [8]byte, avPairs []byte) []byte {
	b := make([]byte, 0, ntlmv2ClientChallengeSize+len(avPairs)+4)
	b = append(b, 1, 1, 0, 0, 0, 0, 0, 0)
	b = le.AppendUint64(b, timestamp)
	b = append(b, clientChallenge[:]...)
	b = append(b, 0, 0, 0, 0)
	b = append(b, avPairs...)
	b = append(b, 0, 0, 0, 0)
	return b
}

// ntProofStr is HMAC_MD5(ResponseKeyNT, ConcatenationOf(ServerChallenge, temp))
// (MS-NLMP §3.3.2).
func ntProofStr(responseKeyNT [16]byte, serverChallenge [8]byte, temp []byte) [16]byte {
	m := hmac.New(md5.New, responseKeyNT[:])
	m.Write(serverChallenge[:])
	m.Write(temp)
	var out [16]byte
	m.Sum(out[:0])
	return out
}

// lmv2Response is ConcatenationOf(HMAC_MD5(ResponseKeyLM,
// ConcatenationOf(ServerChallenge, ClientChallenge)), ClientChallenge)
// (MS-NLMP §3.3.2); for NTLMv2 ResponseKeyLM equals ResponseKeyNT.
func lmv2Response(responseKeyLM [16]byte, serverChallenge, clientChallenge [8]byte) []byte {
	m := hmac.New(md5.New, responseKeyLM[:])
	m.Write(serverChallenge[:])
	m.Write(clientChallenge[:])
	return append(m.Sum(nil), clientChallenge[:]...)
}

// sessionBaseKey is HMAC_MD5(ResponseKeyNT, NTProofStr) (MS-NLMP §3.3.2). For
// NTLMv2 the KeyExchangeKey equals it (§3.4.5.1).
func sessionBaseKey(responseKeyNT, proof [16]byte) [16]byte {
	m := hmac.New(md5.New, responseKeyNT[:])
	m.Write(proof[:])
	var out [16]byte
	m.Sum(out[:0])
	return out
}

// rc4K is RC4K(K, D) of MS-NLMP §6: one RC4 stream keyed by K over D. It is
// its own inverse, so it both produces and opens EncryptedRandomSessionKey.
func rc4K(key []byte, data []byte) []byte {
	c, err := rc4.NewCipher(key)
	if err != nil {
		panic("smbauth: rc4: " + err.Error()) // only for key sizes outside 1..256
	}
	out := make([]byte, len(data))
	c.XORKeyStream(out, data)
	return out
}

// computeMIC is HMAC_MD5(ExportedSessionKey, ConcatenationOf(NEGOTIATE_MESSAGE,
// CHALLENGE_MESSAGE, AUTHENTICATE_MESSAGE)) with the AUTHENTICATE MIC field
// zeroed (MS-NLMP §3.1.5.1.2, §3.2.5.1.2).
func computeMIC(exportedSessionKey, negotiate, challenge, authenticate []byte) [16]byte {
	auth := append([]byte(nil), authenticate...)
	clear(auth[authMICOffset : authMICOffset+16])
	m := hmac.New(md5.New, exportedSessionKey)
	m.Write(negotiate)
	m.Write(challenge)
	m.Write(auth)
	var out [16]byte
	m.Sum(out[:0])
	return out
}

func utf16le(s string) []byte {
	u := utf16.Encode([]rune(s))
	b := make([]byte, 2*len(u))
	for i, c := range u {
		le.PutUint16(b[2*i:], c)
	}
	return b
}

func fromUTF16LE(b []byte) (string, error) {
	if len(b)%2 != 0 {
		return "", malformed("odd-length UTF-16 string (%d bytes)", len(b))
	}
	u := make([]uint16, len(b)/2)
	for i := range u {
		u[i] = le.Uint16(b[2*i:])
	}
	return string(utf16.Decode(u)), nil
}
