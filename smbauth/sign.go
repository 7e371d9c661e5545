package smbauth

import (
	"crypto/hmac"
	"crypto/sha256"
)

// SignatureSize is the length of a Sign signature.
const SignatureSize = 16

// Sign returns HMAC-SHA256(key, parts...) truncated to 16 bytes, the SMB2
// signature of the 2.1/3.0 dialect family (MS-SMB2 §3.1.4.1), keyed with the
// exported session key. The parts are hashed as one message.
func Sign(key []byte, parts ...[]byte) [16]byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	var sum [sha256.Size]byte
	var out [16]byte
	copy(out[:], m.Sum(sum[:0]))
	return out
}

// VerifySignature reports, in constant time, whether sig is Sign(key, parts...).
// A signature of any other length than 16 is refused.
func VerifySignature(key []byte, sig []byte, parts ...[]byte) bool {
	if len(sig) != SignatureSize {
		return false
	}
	want := Sign(key, parts...)
	return hmac.Equal(want[:], sig)
}
