// Package smbauth is the SMB-side security that LWIO reuses: NTLMv2
// authentication per MS-NLMP, its session keys, SMB2-style message signing
// with them, and SMB 3-style sealing keys derived from them.
//
// # Messages
//
// The three NTLMSSP messages are encoded exactly as MS-NLMP §2.2.1 lays them
// out, so that a standard NTLM client can authenticate to our server:
// NEGOTIATE_MESSAGE (§2.2.1.1), CHALLENGE_MESSAGE (§2.2.1.2) with its target
// information AV pairs (§2.2.2.1: MsvAvNbDomainName, MsvAvNbComputerName,
// MsvAvDnsDomainName, MsvAvDnsComputerName, MsvAvTimestamp, MsvAvEOL) and
// AUTHENTICATE_MESSAGE (§2.2.1.3), each with the VERSION structure
// (§2.2.2.10) and the negotiate flags of §2.2.2.5. ParseNegotiate,
// ParseChallenge and ParseAuthenticate refuse truncated messages and
// descriptors pointing outside the message with errors wrapping ErrMalformed.
//
// # Keys
//
// NTLMv2 only (§3.3.2): NTOWFv2 from the NT hash, NTProofStr over the server
// challenge and the client's NTLMv2_CLIENT_CHALLENGE, the session base key
// HMAC_MD5(ResponseKeyNT, NTProofStr), which for NTLMv2 is also the key
// exchange key (§3.4.5.1). With NTLMSSP_NEGOTIATE_KEY_EXCH the client picks a
// random exported session key and sends it RC4-encrypted under the key
// exchange key (§3.1.5.1.2); without it the exported session key is the key
// exchange key. Because the server always sends MsvAvTimestamp, our client
// (like Windows) answers with a MIC, HMAC_MD5(ExportedSessionKey, NEGOTIATE ‖
// CHALLENGE ‖ AUTHENTICATE), announced in MsvAvFlags; the server verifies it
// whenever it is announced and, with ServerConfig.RequireMIC, refuses
// messages without one.
//
// # Server
//
// The server never holds a password: ServerConfig.Lookup returns NT hashes
// (NTHash, stored as hex by FormatNTHash). Responses are compared in constant
// time; an unknown user is checked against a random hash so it costs the same
// work as a wrong password and both yield ErrLogonFailure; each ServerState
// accepts one Authenticate; anonymous and NTLMv1 logons are refused.
//
// # Signing
//
// Sign and VerifySignature are HMAC-SHA256 truncated to 16 bytes, the SMB2
// signing algorithm of the 2.1/3.0 dialect family (MS-SMB2 §3.1.4.1), keyed by
// the exported session key.
//
// # Sealing
//
// KDF is SMB 3's SP800-108 counter-mode KDF with HMAC-SHA256 (MS-SMB2
// §3.1.4.2), checked against NIST's CAVP vectors and the MS-SMB2 team's SMB
// 3.0 and 3.1.1 examples. SessionSealKeys and DataSealKeys derive one key
// per direction from the exported session key with lwiofs's own labels
// and contexts (docs/session.md, "Sealing"); Cipher names AES-128-GCM and
// AES-256-GCM by their SMB 3.1.1 ids and builds them from crypto/aes. A
// client that will seal sets NTLMSSP_NEGOTIATE_SEAL (ClientConfig.RequestSeal);
// the server grants it unless ServerConfig.DisableSeal, and both ends learn
// the outcome (Client.Negotiated, Result.Flags). NTLM's own RC4 sealing is
// never used.
package smbauth
