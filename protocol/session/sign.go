package session

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"

	"github.com/lwiofs/lwiofs/smbauth"
)

// sign and verify are the frame signature: HMAC-SHA256 with the NTLM
// exported session key, truncated to 16 bytes, over the whole frame with
// the signature field zeroed (MS-SMB2 3.1.4.1, as SMB 2.1 signs).
func sign(key, raw []byte) [16]byte { return smbauth.Sign(key, raw) }

func verify(key, sig, raw []byte) bool { return smbauth.VerifySignature(key, sig, raw) }

// macs signs and verifies the frames of one session with keyed HMAC states
// that are reused: hmac.New derives the inner and outer pads from the key
// and allocates two SHA-256 states each time, which per frame cost more
// than hashing a small frame; a reused state's Reset restores the keyed
// state from a saved copy. Safe for concurrent use (a pool of states).
// The signature is the same as sign's.
type macs struct {
	key  []byte
	pool sync.Pool
}

func newMACs(key []byte) *macs {
	m := &macs{key: append([]byte(nil), key...)}
	m.pool.New = func() any { return hmac.New(sha256.New, m.key) }
	return m
}

// sum writes the truncated HMAC of raw into out.
func (m *macs) sum(raw []byte, out *[sigSize]byte) {
	h := m.pool.Get().(hash.Hash)
	h.Reset()
	h.Write(raw)
	var full [sha256.Size]byte
	copy(out[:], h.Sum(full[:0]))
	m.pool.Put(h)
}

// signFrame is the package's signFrame with m's key.
func (m *macs) signFrame(raw []byte) {
	flags := binary.LittleEndian.Uint16(raw[18:]) | FlagSigned
	binary.LittleEndian.PutUint16(raw[18:], flags)
	clear(raw[sigOffset : sigOffset+sigSize])
	var sig [sigSize]byte
	m.sum(raw, &sig)
	copy(raw[sigOffset:], sig[:])
}

// verifyFrame is the package's verifyFrame with m's key: constant time,
// raw restored afterwards.
func (m *macs) verifyFrame(raw []byte) bool {
	var got, want [sigSize]byte
	copy(got[:], raw[sigOffset:sigOffset+sigSize])
	clear(raw[sigOffset : sigOffset+sigSize])
	m.sum(raw, &want)
	copy(raw[sigOffset:], got[:])
	return hmac.Equal(got[:], want[:])
}
