package session

import (
	"encoding/binary"

	"github.com/lwiofs/lwiofs/smbauth"
)

// sign and verify are the frame signature: HMAC-SHA256 with the NTLM
// exported session key, truncated to 16 bytes, over the whole frame with
// the signature field zeroed (MS-SMB2 3.1.4.1, as SMB 2.1 signs).
func sign(key, raw []byte) [16]byte { return smbauth.Sign(key, raw) }

func verify(key, sig, raw []byte) bool { return smbauth.VerifySignature(key, sig, raw) }

// macs signs and verifies the frames of one session: smbauth.Signer, which
// reuses keyed HMAC states. The signature is the same as sign's.
type macs struct {
	s *smbauth.Signer
}

func newMACs(key []byte) *macs { return &macs{s: smbauth.NewSigner(key)} }

// sum writes the truncated HMAC of raw into out.
func (m *macs) sum(raw []byte, out *[sigSize]byte) { *out = m.s.Sign(raw) }

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
	var got [sigSize]byte
	copy(got[:], raw[sigOffset:sigOffset+sigSize])
	clear(raw[sigOffset : sigOffset+sigSize])
	ok := m.s.Verify(got[:], raw)
	copy(raw[sigOffset:], got[:])
	return ok
}
