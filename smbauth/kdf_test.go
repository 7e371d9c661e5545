package smbauth

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// NIST CAVP KBKDF vectors (KDFCTR_gen.rsp, CAVS 14.4): [PRF=HMAC_SHA256]
// [CTRLOCATION=BEFORE_FIXED] [RLEN=32_BITS]. COUNT=10 needs two PRF blocks.
func TestKDFCounterCAVP(t *testing.T) {
	for _, tc := range []struct {
		name, ki, fixed, ko string
	}{
		{"COUNT=0 L=128",
			"dd1d91b7d90b2bd3138533ce92b272fbf8a369316aefe242e659cc0ae238afe0",
			"01322b96b30acd197979444e468e1c5c6859bf1b1cf951b7e725303e237e46b864a145fab25e517b08f8683d0315bb2911d80a0e8aba17f3b413faac",
			"10621342bfb0fd40046c0e29f2cfdbf0"},
		{"COUNT=10 L=256",
			"e204d6d466aad507ffaf6d6dab0a5b26152c9e21e764370464e360c8fbc765c6",
			"7b03b98d9f94b899e591f3ef264b71b193fba7043c7e953cde23bc5384bc1a6293580115fae3495fd845dadbd02bd6455cf48d0f62b33e62364a3a80",
			"770dfab6a6a4a4bee0257ff335213f78d8287b4fd537d5c1fffa956910e7c779"},
	} {
		ko := unhex(t, tc.ko)
		if got := kdfCounter(unhex(t, tc.ki), unhex(t, tc.fixed), len(ko)); !bytes.Equal(got, ko) {
			t.Errorf("%s: KO = %x, want %x", tc.name, got, ko)
		}
	}
}

// The key derivation examples of Microsoft's "SMB 2 and SMB 3 security in
// Windows 10: the anatomy of signing and cryptographic keys" (the MS-SMB2
// team's blog, appendix), with MS-SMB2 §3.2.5.3.1's labels and contexts.
// The client's EncryptionKey is the client-to-server key.
func TestKDFSMB3Vectors(t *testing.T) {
	smb30 := unhex(t, "7CD451825D0450D235424E44BA6E78CC")
	smb311 := unhex(t, "270E1BA896585EEB7AF3472D3B4C75A7")
	preauth := unhex(t, "0DD13628CC3ED218EF9DF9772D436D0887AB9814BFAE63A80AA845F36909DB79"+
		"28622DDDAD522D9751640A459762C5A9D6BB084CBB3CE6BDADEF5D5BCE3C6C01")
	for _, tc := range []struct {
		name           string
		key            []byte
		label, context string
		want           string
	}{
		{"3.0 SigningKey", smb30, "SMB2AESCMAC\x00", "SmbSign\x00", "0B7E9C5CAC36C0F6EA9AB275298CEDCE"},
		{"3.0 EncryptionKey", smb30, "SMB2AESCCM\x00", "ServerIn \x00", "FAD27796665B313EBB578F388632B4F7"},
		{"3.0 DecryptionKey", smb30, "SMB2AESCCM\x00", "ServerOut\x00", "B0F0427F7CEB416D1D9DCC0CD4F99447"},
		{"3.0 ApplicationKey", smb30, "SMB2APP\x00", "SmbRpc\x00", "BB23A4575AA26C721AF525AF15A87B4F"},
		{"3.1.1 SigningKey", smb311, "SMBSigningKey\x00", string(preauth), "73FE7A9A77BEF0BDE49C650D8CCB5F76"},
		{"3.1.1 EncryptionKey", smb311, "SMBC2SCipherKey\x00", string(preauth), "629BCBC54422A0F572B97F45989B6073"},
		{"3.1.1 DecryptionKey", smb311, "SMBS2CCipherKey\x00", string(preauth), "E2AF0DCEFAC68DA71A0DFBD0D1350D74"},
		{"3.1.1 ApplicationKey", smb311, "SMBAppKey\x00", string(preauth), "6D7AD7954E9EC61E907B4D473DC178FF"},
	} {
		got := KDF(tc.key, []byte(tc.label), []byte(tc.context), 128)
		if !bytes.Equal(got, unhex(t, tc.want)) {
			t.Errorf("%s = %X, want %s", tc.name, got, tc.want)
		}
	}
}

// The lwiofs keys, golden: computed independently (Python's hmac over the
// layout in docs/session.md), so that the derivation cannot drift between
// versions of client and server.
func TestSealKeysGolden(t *testing.T) {
	sk := unhex(t, specRandomKey)
	for _, tc := range []struct {
		c        Cipher
		c2s, s2c string
	}{
		{CipherAES128GCM, "236b922e60cb642a4588441d48def8db", "08046752e586677e664fc5d63e0c7b3c"},
		{CipherAES256GCM, "cebd224115debbef2c0b43aa23e0927e33917e634b94a17715ee02d9be7fbb1f",
			"b5a66bcb454625505e645f7ad8b452e25096ccdd65bb334277cdd1064a1a50f9"},
	} {
		c2s, s2c := SessionSealKeys(sk, 0x0123456789abcdef, tc.c)
		if hex.EncodeToString(c2s) != tc.c2s || hex.EncodeToString(s2c) != tc.s2c {
			t.Errorf("%v: SessionSealKeys = %x, %x; want %s, %s", tc.c, c2s, s2c, tc.c2s, tc.s2c)
		}
	}
	var key, cn, sn [16]byte
	for i := range 16 {
		key[i], cn[i], sn[i] = byte(i), byte(16+i), byte(32+i)
	}
	c2s, s2c := DataSealKeys(sk, key, cn, sn, CipherAES128GCM)
	if hex.EncodeToString(c2s) != "76e093b2cf053a75be88fd229c469b00" || hex.EncodeToString(s2c) != "3a03de22686314104eca8c9b237626a8" {
		t.Errorf("DataSealKeys = %x, %x", c2s, s2c)
	}
}

func TestCipherAEAD(t *testing.T) {
	for _, c := range DefaultCiphers {
		c2s, s2c := SessionSealKeys(unhex(t, specRandomKey), 7, c)
		if len(c2s) != c.KeySize() || bytes.Equal(c2s, s2c) {
			t.Fatalf("%v: keys %x / %x", c, c2s, s2c)
		}
		a, err := c.NewAEAD(c2s)
		if err != nil {
			t.Fatal(err)
		}
		if a.NonceSize() != 12 || a.Overhead() != 16 {
			t.Errorf("%v: nonce %d, tag %d", c, a.NonceSize(), a.Overhead())
		}
		nonce, aad := make([]byte, 12), []byte("header")
		sealed := a.Seal(nil, nonce, []byte("marker"), aad)
		if bytes.Contains(sealed, []byte("marker")) {
			t.Errorf("%v: plaintext visible in %x", c, sealed)
		}
		if _, err := a.Open(nil, nonce, sealed, aad); err != nil {
			t.Errorf("%v: Open: %v", c, err)
		}
		if b, err := c.NewAEAD(s2c); err != nil {
			t.Fatal(err)
		} else if _, err := b.Open(nil, nonce, sealed, aad); err == nil {
			t.Errorf("%v: the other direction's key opens the frame", c)
		}
	}
	if _, err := CipherAES256GCM.NewAEAD(make([]byte, 16)); err == nil {
		t.Error("AES-256-GCM accepted a 16-byte key")
	}
	if _, err := Cipher(0x0001).NewAEAD(make([]byte, 16)); err == nil {
		t.Error("an unknown cipher (AES-128-CCM) made an AEAD")
	}
}

func TestChooseCipher(t *testing.T) {
	for _, tc := range []struct {
		prefer, offered []Cipher
		want            Cipher
	}{
		{DefaultCiphers, []Cipher{CipherAES256GCM, CipherAES128GCM}, CipherAES128GCM},
		{DefaultCiphers, []Cipher{CipherAES256GCM}, CipherAES256GCM},
		{[]Cipher{CipherAES256GCM}, DefaultCiphers, CipherAES256GCM},
		{DefaultCiphers, []Cipher{0x0001}, CipherNone},
		{DefaultCiphers, nil, CipherNone},
		{[]Cipher{0x0001}, []Cipher{0x0001}, CipherNone}, // unknown to us: never chosen
	} {
		if got := ChooseCipher(tc.prefer, tc.offered); got != tc.want {
			t.Errorf("ChooseCipher(%v, %v) = %v, want %v", tc.prefer, tc.offered, got, tc.want)
		}
	}
}
