package session

import "github.com/lwiofs/lwiofs/smbauth"

// sign and verify are the frame signature: HMAC-SHA256 with the NTLM
// exported session key, truncated to 16 bytes, over the whole frame with
// the signature field zeroed (MS-SMB2 3.1.4.1, as SMB 2.1 signs).
func sign(key, raw []byte) [16]byte { return smbauth.Sign(key, raw) }

func verify(key, sig, raw []byte) bool { return smbauth.VerifySignature(key, sig, raw) }
