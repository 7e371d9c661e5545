package smbauth

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"fmt"
	"slices"
)

// Cipher is an AEAD a sealed channel encrypts with, numbered as SMB 3.1.1
// numbers its ciphers in SMB2_ENCRYPTION_CAPABILITIES (MS-SMB2 §2.2.3.1.2).
type Cipher uint16

// The ciphers lwiofs seals with: AES in Galois/Counter mode, with a 12-byte
// nonce and a 16-byte tag (NIST SP800-38D). crypto/aes uses the CPU's AES
// and carry-less multiply instructions (AES-NI, PCLMULQDQ) where present.
const (
	CipherNone      Cipher = 0x0000 // not sealed
	CipherAES128GCM Cipher = 0x0002 // AES-128-GCM
	CipherAES256GCM Cipher = 0x0004 // AES-256-GCM
)

// DefaultCiphers is the preference order a server chooses by when its
// configuration names none, and what a client offers: AES-128-GCM first,
// as Windows and Samba order them. The NTLM session key the keys derive
// from has 128 bits, so AES-256 adds margin against attacks on AES itself,
// not against a guessed session key.
var DefaultCiphers = []Cipher{CipherAES128GCM, CipherAES256GCM}

// KeySize is the cipher's key length in bytes; 0 for an unknown cipher.
func (c Cipher) KeySize() int {
	switch c {
	case CipherAES128GCM:
		return 16
	case CipherAES256GCM:
		return 32
	}
	return 0
}

// String is the cipher's name, e.g. "AES-128-GCM".
func (c Cipher) String() string {
	switch c {
	case CipherNone:
		return "none"
	case CipherAES128GCM:
		return "AES-128-GCM"
	case CipherAES256GCM:
		return "AES-256-GCM"
	}
	return fmt.Sprintf("Cipher(0x%04x)", uint16(c))
}

// NewAEAD returns the cipher keyed with key, which must be KeySize bytes.
// Its nonces are 12 bytes and its tags 16.
func (c Cipher) NewAEAD(key []byte) (cipher.AEAD, error) {
	if c.KeySize() == 0 {
		return nil, fmt.Errorf("smbauth: unknown cipher %v", c)
	}
	if len(key) != c.KeySize() {
		return nil, fmt.Errorf("smbauth: %v needs a %d-byte key, got %d", c, c.KeySize(), len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// ChooseCipher returns the first cipher of prefer (the server's order) that
// offered (the client's) also lists, or CipherNone.
func ChooseCipher(prefer, offered []Cipher) Cipher {
	for _, c := range prefer {
		if c.KeySize() != 0 && slices.Contains(offered, c) {
			return c
		}
	}
	return CipherNone
}

// Labels of the per-direction keys. Like SMB 3.1.1's ("SMBC2SCipherKey\0")
// they end in NUL; KDF adds the 0x00 separator after them. They are
// distinct from every SMB label, so no lwiofs key is ever an SMB key of the
// same session key.
var (
	labelSessionC2S = []byte("LWIOSessionC2S\x00")
	labelSessionS2C = []byte("LWIOSessionS2C\x00")
	labelDataC2S    = []byte("LWIODataC2S\x00")
	labelDataS2C    = []byte("LWIODataS2C\x00")
)

// SessionSealKeys derives the keys a sealed session channel encrypts with,
// one per direction, from the NTLM exported session key:
//
//	c2s = KDF(sessionKey, "LWIOSessionC2S\0", Context, 8·KeySize)
//	s2c = KDF(sessionKey, "LWIOSessionS2C\0", Context, 8·KeySize)
//	Context = SessionID (u64 little-endian) ‖ Cipher (u16 little-endian)
//
// Two directions never share a key, so the same nonce counter value in
// each direction never meets the same key.
func SessionSealKeys(sessionKey []byte, sessionID uint64, c Cipher) (c2s, s2c []byte) {
	ctx := binary.LittleEndian.AppendUint64(nil, sessionID)
	ctx = binary.LittleEndian.AppendUint16(ctx, uint16(c))
	return sealKeys(sessionKey, c, labelSessionC2S, labelSessionS2C, ctx)
}

// DataSealKeys derives the keys one LWIO data connection (softrdma) of a
// sealed session encrypts with. The session key alone would give every
// connection of the session the same keys, and their nonce counters would
// collide; the context binds them to the connection's own authentication:
//
//	Context = Key (the 16-byte \PIPE\LWIO negotiate Key GUID)
//	        ‖ ClientNonce (16 bytes, random, in the client's AUTH parameters)
//	        ‖ ServerNonce (16 bytes, random, in the server's AUTH parameters)
//	        ‖ Cipher (u16 little-endian)
//
// with labels "LWIODataC2S\0" and "LWIODataS2C\0". Both nonces are covered
// by the AUTH signatures, so neither end can be made to reuse a key.
func DataSealKeys(sessionKey []byte, key [16]byte, clientNonce, serverNonce [16]byte, c Cipher) (c2s, s2c []byte) {
	ctx := make([]byte, 0, 16*3+2)
	ctx = append(ctx, key[:]...)
	ctx = append(ctx, clientNonce[:]...)
	ctx = append(ctx, serverNonce[:]...)
	ctx = binary.LittleEndian.AppendUint16(ctx, uint16(c))
	return sealKeys(sessionKey, c, labelDataC2S, labelDataS2C, ctx)
}

// DataSealAEADs is DataSealKeys with each key made into c's AEAD, ready
// for the transport (transport.SealConfig): c2s seals what the client
// sends, s2c what the server sends.
func DataSealAEADs(sessionKey []byte, key [16]byte, clientNonce, serverNonce [16]byte, c Cipher) (c2s, s2c cipher.AEAD, err error) {
	k1, k2 := DataSealKeys(sessionKey, key, clientNonce, serverNonce, c)
	if c2s, err = c.NewAEAD(k1); err != nil {
		return nil, nil, err
	}
	if s2c, err = c.NewAEAD(k2); err != nil {
		return nil, nil, err
	}
	return c2s, s2c, nil
}

func sealKeys(sessionKey []byte, c Cipher, c2sLabel, s2cLabel, ctx []byte) (c2s, s2c []byte) {
	bits := 8 * c.KeySize()
	return KDF(sessionKey, c2sLabel, ctx, bits), KDF(sessionKey, s2cLabel, ctx, bits)
}
