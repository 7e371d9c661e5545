package smbauth

import (
	"encoding/hex"
	"testing"
)

// RFC 4231 test case 2 (key "Jefe"), truncated to 16 bytes as SMB2 does.
func TestSignVector(t *testing.T) {
	sig := Sign([]byte("Jefe"), []byte("what do ya want "), []byte("for nothing?"))
	if got, want := hex.EncodeToString(sig[:]), "5bdcc146bf60754e6a042426089575c7"; got != want {
		t.Errorf("Sign = %s, want %s", got, want)
	}
}

func TestSignRoundTripAndTamper(t *testing.T) {
	key := unhex(t, specRandomKey)
	hdr, body := []byte("header-with-zeroed-signature"), []byte("body")
	sig := Sign(key, hdr, body)
	if !VerifySignature(key, sig[:], hdr, body) {
		t.Fatal("signature does not verify")
	}
	// Parts are one message: how it is split does not matter.
	if !VerifySignature(key, sig[:], append(append([]byte(nil), hdr...), body...)) {
		t.Error("signature depends on how the message is split")
	}
	for i := range sig {
		bad := sig
		bad[i] ^= 0x80
		if VerifySignature(key, bad[:], hdr, body) {
			t.Errorf("signature with byte %d flipped verifies", i)
		}
	}
	for i := range body {
		b := append([]byte(nil), body...)
		b[i] ^= 1
		if VerifySignature(key, sig[:], hdr, b) {
			t.Errorf("message with byte %d flipped verifies", i)
		}
	}
	otherKey := append([]byte(nil), key...)
	otherKey[0] ^= 1
	if VerifySignature(otherKey, sig[:], hdr, body) {
		t.Error("verifies under another key")
	}
	for _, n := range []int{0, 15, 17, 32} {
		long := make([]byte, n)
		copy(long, sig[:])
		if n == 32 {
			full := Sign(key, hdr, body)
			copy(long, full[:])
		}
		if VerifySignature(key, long, hdr, body) {
			t.Errorf("a %d-byte signature verifies", n)
		}
	}
}

// A Signer gives Sign's signature, reused and concurrently.
func TestSignerMatchesSign(t *testing.T) {
	key := unhex(t, specRandomKey)
	s := NewSigner(key)
	msgs := [][]byte{nil, []byte("a"), make([]byte, 4096)}
	done := make(chan bool)
	for g := 0; g < 4; g++ {
		go func() {
			ok := true
			for i := 0; i < 200; i++ {
				m := msgs[i%len(msgs)]
				want := Sign(key, m)
				got := s.Sign(m)
				ok = ok && got == want && s.Verify(want[:], m)
				bad := want
				bad[0] ^= 1
				ok = ok && !s.Verify(bad[:], m) && !s.Verify(want[:15], m)
			}
			done <- ok
		}()
	}
	for g := 0; g < 4; g++ {
		if !<-done {
			t.Fatal("Signer disagrees with Sign")
		}
	}
	key[0] ^= 1 // NewSigner copied the key
	if got, want := s.Sign(msgs[1]), Sign(unhex(t, specRandomKey), msgs[1]); got != want {
		t.Fatal("Signer follows a change to the caller's key slice")
	}
}
