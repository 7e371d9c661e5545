package smbauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
)

// KDF is the key derivation function of SMB 3.x (MS-SMB2 §3.1.4.2): NIST
// SP800-108 in counter mode with HMAC-SHA256 as the PRF, a 32-bit counter
// before the fixed input, and the fixed input Label ‖ 0x00 ‖ Context ‖ L
// (L, the output length in bits, as a 32-bit big-endian number). SMB's
// labels carry their own terminating NUL, which comes before the 0x00
// separator: KDF(key, []byte("SMBC2SCipherKey\x00"), preauthHash, 128) is
// SMB 3.1.1's client-to-server cipher key. bits must be a positive
// multiple of 8.
//
// Hand-written rather than imported: it is a dozen lines over crypto/hmac,
// and no Go module of the standard library's standing provides it.
func KDF(key, label, context []byte, bits int) []byte {
	fixed := make([]byte, 0, len(label)+1+len(context)+4)
	fixed = append(fixed, label...)
	fixed = append(fixed, 0)
	fixed = append(fixed, context...)
	fixed = binary.BigEndian.AppendUint32(fixed, uint32(bits))
	return kdfCounter(key, fixed, bits/8)
}

// kdfCounter is SP800-108 §5.1 with r = 32: K(i) = HMAC-SHA256(key,
// [i]₂ ‖ fixed) for i = 1, 2, …, concatenated and cut to n bytes. fixed is
// the whole fixed input data, as NIST's CAVP vectors give it.
func kdfCounter(key, fixed []byte, n int) []byte {
	out := make([]byte, 0, (n+sha256.Size-1)/sha256.Size*sha256.Size)
	m := hmac.New(sha256.New, key)
	var ctr [4]byte
	for i := uint32(1); len(out) < n; i++ {
		m.Reset()
		binary.BigEndian.PutUint32(ctr[:], i)
		m.Write(ctr[:])
		m.Write(fixed)
		out = m.Sum(out)
	}
	return out[:n]
}
