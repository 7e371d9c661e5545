package smbauth

import (
	"strings"
)

// NegotiateFlags is the NegotiateFlags field shared by the three NTLMSSP
// messages (MS-NLMP §2.2.2.5).
type NegotiateFlags uint32

// Flags of MS-NLMP §2.2.2.5, in bit order.
const (
	FlagUnicode                 NegotiateFlags = 0x00000001 // A: NTLMSSP_NEGOTIATE_UNICODE
	FlagOEM                     NegotiateFlags = 0x00000002 // B: NTLM_NEGOTIATE_OEM
	FlagRequestTarget           NegotiateFlags = 0x00000004 // C: NTLMSSP_REQUEST_TARGET
	FlagSign                    NegotiateFlags = 0x00000010 // D: NTLMSSP_NEGOTIATE_SIGN
	FlagSeal                    NegotiateFlags = 0x00000020 // E: NTLMSSP_NEGOTIATE_SEAL
	FlagDatagram                NegotiateFlags = 0x00000040 // F: NTLMSSP_NEGOTIATE_DATAGRAM
	FlagLMKey                   NegotiateFlags = 0x00000080 // G: NTLMSSP_NEGOTIATE_LM_KEY
	FlagNTLM                    NegotiateFlags = 0x00000200 // H: NTLMSSP_NEGOTIATE_NTLM
	FlagAnonymous               NegotiateFlags = 0x00000800 // J: anonymous connection
	FlagOEMDomainSupplied       NegotiateFlags = 0x00001000 // K: NTLMSSP_NEGOTIATE_OEM_DOMAIN_SUPPLIED
	FlagOEMWorkstationSupplied  NegotiateFlags = 0x00002000 // L: NTLMSSP_NEGOTIATE_OEM_WORKSTATION_SUPPLIED
	FlagAlwaysSign              NegotiateFlags = 0x00008000 // M: NTLMSSP_NEGOTIATE_ALWAYS_SIGN
	FlagTargetTypeDomain        NegotiateFlags = 0x00010000 // N: NTLMSSP_TARGET_TYPE_DOMAIN
	FlagTargetTypeServer        NegotiateFlags = 0x00020000 // O: NTLMSSP_TARGET_TYPE_SERVER
	FlagExtendedSessionSecurity NegotiateFlags = 0x00080000 // P: NTLMSSP_NEGOTIATE_EXTENDED_SESSIONSECURITY
	FlagIdentify                NegotiateFlags = 0x00100000 // Q: NTLMSSP_NEGOTIATE_IDENTIFY
	FlagRequestNonNTSessionKey  NegotiateFlags = 0x00400000 // R: NTLMSSP_REQUEST_NON_NT_SESSION_KEY
	FlagTargetInfo              NegotiateFlags = 0x00800000 // S: NTLMSSP_NEGOTIATE_TARGET_INFO
	FlagVersion                 NegotiateFlags = 0x02000000 // T: NTLMSSP_NEGOTIATE_VERSION
	Flag128                     NegotiateFlags = 0x20000000 // U: NTLMSSP_NEGOTIATE_128
	FlagKeyExch                 NegotiateFlags = 0x40000000 // V: NTLMSSP_NEGOTIATE_KEY_EXCH
	Flag56                      NegotiateFlags = 0x80000000 // W: NTLMSSP_NEGOTIATE_56
)

var flagNames = []struct {
	f    NegotiateFlags
	name string
}{
	{FlagUnicode, "UNICODE"},
	{FlagOEM, "OEM"},
	{FlagRequestTarget, "REQUEST_TARGET"},
	{FlagSign, "SIGN"},
	{FlagSeal, "SEAL"},
	{FlagDatagram, "DATAGRAM"},
	{FlagLMKey, "LM_KEY"},
	{FlagNTLM, "NTLM"},
	{FlagAnonymous, "ANONYMOUS"},
	{FlagOEMDomainSupplied, "OEM_DOMAIN_SUPPLIED"},
	{FlagOEMWorkstationSupplied, "OEM_WORKSTATION_SUPPLIED"},
	{FlagAlwaysSign, "ALWAYS_SIGN"},
	{FlagTargetTypeDomain, "TARGET_TYPE_DOMAIN"},
	{FlagTargetTypeServer, "TARGET_TYPE_SERVER"},
	{FlagExtendedSessionSecurity, "EXTENDED_SESSIONSECURITY"},
	{FlagIdentify, "IDENTIFY"},
	{FlagRequestNonNTSessionKey, "REQUEST_NON_NT_SESSION_KEY"},
	{FlagTargetInfo, "TARGET_INFO"},
	{FlagVersion, "VERSION"},
	{Flag128, "128"},
	{FlagKeyExch, "KEY_EXCH"},
	{Flag56, "56"},
}

// String lists the set flags by their MS-NLMP names, e.g. "UNICODE|NTLM".
func (f NegotiateFlags) String() string {
	var parts []string
	rest := f
	for _, n := range flagNames {
		if f&n.f != 0 {
			parts = append(parts, n.name)
			rest &^= n.f
		}
	}
	if rest != 0 {
		parts = append(parts, "0x"+hexUint32(uint32(rest)))
	}
	if len(parts) == 0 {
		return "0"
	}
	return strings.Join(parts, "|")
}

func hexUint32(v uint32) string {
	const digits = "0123456789abcdef"
	var b [8]byte
	for i := 7; i >= 0; i-- {
		b[i] = digits[v&0xf]
		v >>= 4
	}
	return string(b[:])
}
