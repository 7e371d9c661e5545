package smbauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"sync"
)

// SignatureSize is the length of a Sign signature.
const SignatureSize = 16

// Sign returns HMAC-SHA256(key, parts...) truncated to 16 bytes, the SMB2
// signature of the 2.1/3.0 dialect family (MS-SMB2 §3.1.4.1), keyed with the
// exported session key. The parts are hashed as one message. It is the one
// signature of the project: the session channel's frames and the LWIO AUTH
// parameters (docs/wire.md) use it.
func Sign(key []byte, parts ...[]byte) [16]byte {
	return sum(hmac.New(sha256.New, key), parts)
}

// VerifySignature reports, in constant time, whether sig is Sign(key, parts...).
// A signature of any other length than 16 is refused.
func VerifySignature(key []byte, sig []byte, parts ...[]byte) bool {
	want := Sign(key, parts...)
	return equal(want, sig)
}

// Signer is Sign with one key, for a session that signs many messages:
// hmac.New derives the inner and outer pads from the key and allocates two
// SHA-256 states each time, which costs more than hashing a small message,
// so a Signer keeps keyed states in a pool and resets them. Safe for
// concurrent use.
type Signer struct {
	pool sync.Pool
}

// NewSigner returns a Signer for key (copied).
func NewSigner(key []byte) *Signer {
	k := append([]byte(nil), key...)
	s := &Signer{}
	s.pool.New = func() any { return hmac.New(sha256.New, k) }
	return s
}

// Sign is Sign(key, parts...).
func (s *Signer) Sign(parts ...[]byte) [16]byte {
	h := s.pool.Get().(hash.Hash)
	h.Reset()
	out := sum(h, parts)
	s.pool.Put(h)
	return out
}

// Verify is VerifySignature(key, sig, parts...).
func (s *Signer) Verify(sig []byte, parts ...[]byte) bool {
	return equal(s.Sign(parts...), sig)
}

func sum(h hash.Hash, parts [][]byte) [16]byte {
	for _, p := range parts {
		h.Write(p)
	}
	var full [sha256.Size]byte
	var out [16]byte
	copy(out[:], h.Sum(full[:0]))
	return out
}

func equal(want [16]byte, sig []byte) bool {
	return len(sig) == SignatureSize && hmac.Equal(want[:], sig)
}
