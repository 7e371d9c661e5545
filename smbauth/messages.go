package smbauth

import (
	"bytes"
	"encoding/binary"
)

var le = binary.LittleEndian

// signature opens every NTLMSSP message (MS-NLMP §2.2.1).
var signature = []byte("NTLMSSP\x00")

// MessageType values of MS-NLMP §2.2.1.
const (
	typeNegotiate    uint32 = 1
	typeChallenge    uint32 = 2
	typeAuthenticate uint32 = 3
)

// Fixed sizes and offsets from the layouts of MS-NLMP §2.2.1.1–§2.2.1.3.
const (
	negotiateHeaderSize    = 32 // Signature..WorkstationFields
	challengeHeaderSize    = 48 // Signature..TargetInfoFields
	authenticateHeaderSize = 64 // Signature..NegotiateFlags
	versionSize            = 8  // VERSION, §2.2.2.10
	authMICOffset          = 72 // after the Version field
	authMICSize            = 16
	fieldsSize             = 8 // Len (2), MaxLen (2), BufferOffset (4)

	// ntlmv2ClientChallengeSize is the fixed part of NTLMv2_CLIENT_CHALLENGE
	// (§2.2.2.7) before its AvPairs.
	ntlmv2ClientChallengeSize = 28
	// ntlmv2ResponseMin is NTProofStr (16) plus that fixed part.
	ntlmv2ResponseMin = 16 + ntlmv2ClientChallengeSize
)

// NTLMRevisionCurrent is the NTLMRevisionCurrent value of the VERSION
// structure (MS-NLMP §2.2.2.10).
const NTLMRevisionCurrent = 0x0F

// Version is the VERSION structure (MS-NLMP §2.2.2.10), carried for
// debugging only.
type Version struct {
	ProductMajor uint8
	ProductMinor uint8
	ProductBuild uint16
	NTLMRevision uint8
}

// defaultVersion is what this package announces: Windows 10.0, a build
// number of our own, NTLM revision 15.
var defaultVersion = Version{ProductMajor: 10, ProductMinor: 0, ProductBuild: 20348, NTLMRevision: NTLMRevisionCurrent}

func (v *Version) append(b []byte) []byte {
	if v == nil {
		return append(b, make([]byte, versionSize)...)
	}
	b = append(b, v.ProductMajor, v.ProductMinor)
	b = le.AppendUint16(b, v.ProductBuild)
	return append(b, 0, 0, 0, v.NTLMRevision)
}

func parseVersion(b []byte) *Version {
	return &Version{ProductMajor: b[0], ProductMinor: b[1], ProductBuild: le.Uint16(b[2:]), NTLMRevision: b[7]}
}

// payload collects the variable-length fields of a message and writes their
// Len/MaxLen/BufferOffset descriptors. Len is 16 bits on the wire: a field
// longer than 65535 bytes cannot be represented, and no field this package
// builds comes near that.
type payload struct {
	header []byte // fixed part, descriptors patched in place
	data   []byte
}

// newPayload starts a message of msgType: a fixed part of headerSize bytes
// opening with the signature and MessageType, with room for extra bytes
// (VERSION, MIC) appended to it before the first put.
func newPayload(msgType uint32, headerSize, extra int) *payload {
	h := make([]byte, headerSize, headerSize+extra)
	copy(h, signature)
	le.PutUint32(h[8:], msgType)
	return &payload{header: h}
}

func (p *payload) put(at int, v []byte) {
	le.PutUint16(p.header[at:], uint16(len(v)))
	le.PutUint16(p.header[at+2:], uint16(len(v)))
	le.PutUint32(p.header[at+4:], uint32(len(p.header)+len(p.data)))
	p.data = append(p.data, v...)
}

func (p *payload) bytes() []byte { return append(p.header, p.data...) }

// reader decodes one message, checking every descriptor against the buffer.
type reader struct {
	b []byte
	// minOffset is the lowest BufferOffset of a non-empty field: where the
	// fixed part, however long the sender made it, ends.
	minOffset int
}

func newReader(b []byte, msgType uint32, headerSize int) (*reader, error) {
	if len(b) < headerSize {
		return nil, malformed("message is %d bytes, shorter than its %d-byte header", len(b), headerSize)
	}
	if !bytes.Equal(b[:8], signature) {
		return nil, malformed("bad signature % x", b[:8])
	}
	if t := le.Uint32(b[8:]); t != msgType {
		return nil, malformed("MessageType %d, want %d", t, msgType)
	}
	return &reader{b: b, minOffset: len(b)}, nil
}

// field returns the bytes a Len/MaxLen/BufferOffset descriptor at `at` points
// to, nil when Len is zero (whatever the offset says, per §2.2.1).
func (r *reader) field(at int, name string) ([]byte, error) {
	n := int(le.Uint16(r.b[at:]))
	off := int64(le.Uint32(r.b[at+4:]))
	if n == 0 {
		return nil, nil
	}
	if off+int64(n) > int64(len(r.b)) {
		return nil, malformed("%s: %d bytes at offset %d past the %d-byte message", name, n, off, len(r.b))
	}
	if int(off) < r.minOffset {
		r.minOffset = int(off)
	}
	return clone(r.b[off : off+int64(n)]), nil
}

// version reads the VERSION that follows a fixed part of headerSize bytes
// when flags announce one and the payload leaves room for it (nil
// otherwise), and returns the header size including it.
func (r *reader) version(flags NegotiateFlags, headerSize int) (*Version, int) {
	if flags&FlagVersion != 0 && r.minOffset >= headerSize+versionSize {
		return parseVersion(r.b[headerSize:]), headerSize + versionSize
	}
	return nil, headerSize
}

// end reads the VERSION (as version does) and checks that the payload
// starts after the fixed part, VERSION included when read: the last step of
// every parse.
func (r *reader) end(flags NegotiateFlags, headerSize int) (*Version, error) {
	v, hdr := r.version(flags, headerSize)
	if r.minOffset < hdr {
		return nil, malformed("payload at offset %d overlaps the %d-byte header", r.minOffset, hdr)
	}
	return v, nil
}

func decodeString(b []byte, flags NegotiateFlags) (string, error) {
	if flags&FlagUnicode != 0 {
		return fromUTF16LE(b)
	}
	return string(b), nil
}

func encodeString(s string, flags NegotiateFlags) []byte {
	if flags&FlagUnicode != 0 {
		return utf16le(s)
	}
	return []byte(s)
}

// NegotiateMessage is NEGOTIATE_MESSAGE (MS-NLMP §2.2.1.1). DomainName and
// Workstation are OEM strings and usually empty.
type NegotiateMessage struct {
	Flags       NegotiateFlags
	DomainName  string
	Workstation string
	Version     *Version // written when non-nil; read when FlagVersion is set
}

// Marshal encodes the message.
func (m *NegotiateMessage) Marshal() []byte {
	p := newPayload(typeNegotiate, negotiateHeaderSize, versionSize)
	le.PutUint32(p.header[12:], uint32(m.Flags))
	if m.Version != nil {
		p.header = m.Version.append(p.header)
	}
	p.put(16, []byte(m.DomainName))
	p.put(24, []byte(m.Workstation))
	return p.bytes()
}

// ParseNegotiate decodes a NEGOTIATE_MESSAGE.
func ParseNegotiate(b []byte) (*NegotiateMessage, error) {
	r, err := newReader(b, typeNegotiate, negotiateHeaderSize)
	if err != nil {
		return nil, err
	}
	m := &NegotiateMessage{Flags: NegotiateFlags(le.Uint32(b[12:]))}
	dom, err := r.field(16, "DomainName")
	if err != nil {
		return nil, err
	}
	ws, err := r.field(24, "Workstation")
	if err != nil {
		return nil, err
	}
	m.DomainName, m.Workstation = string(dom), string(ws)
	if m.Version, err = r.end(m.Flags, negotiateHeaderSize); err != nil {
		return nil, err
	}
	return m, nil
}

// ChallengeMessage is CHALLENGE_MESSAGE (MS-NLMP §2.2.1.2).
type ChallengeMessage struct {
	Flags           NegotiateFlags
	TargetName      string // UTF-16LE on the wire when FlagUnicode is set
	ServerChallenge [8]byte
	TargetInfo      AVPairs  // written (with MsvAvEOL) when FlagTargetInfo is set
	Version         *Version // written when non-nil; read when FlagVersion is set
}

// Marshal encodes the message.
func (m *ChallengeMessage) Marshal() []byte {
	p := newPayload(typeChallenge, challengeHeaderSize, versionSize)
	le.PutUint32(p.header[20:], uint32(m.Flags))
	copy(p.header[24:], m.ServerChallenge[:])
	if m.Version != nil {
		p.header = m.Version.append(p.header)
	}
	p.put(12, encodeString(m.TargetName, m.Flags))
	var ti []byte
	if m.Flags&FlagTargetInfo != 0 {
		ti = m.TargetInfo.Marshal()
	}
	p.put(40, ti)
	return p.bytes()
}

// ParseChallenge decodes a CHALLENGE_MESSAGE.
func ParseChallenge(b []byte) (*ChallengeMessage, error) {
	r, err := newReader(b, typeChallenge, challengeHeaderSize)
	if err != nil {
		return nil, err
	}
	m := &ChallengeMessage{Flags: NegotiateFlags(le.Uint32(b[20:]))}
	copy(m.ServerChallenge[:], b[24:32])
	tn, err := r.field(12, "TargetName")
	if err != nil {
		return nil, err
	}
	if m.TargetName, err = decodeString(tn, m.Flags); err != nil {
		return nil, err
	}
	ti, err := r.field(40, "TargetInfo")
	if err != nil {
		return nil, err
	}
	if m.Flags&FlagTargetInfo != 0 {
		if m.TargetInfo, err = ParseAVPairs(ti); err != nil {
			return nil, err
		}
	}
	if m.Version, err = r.end(m.Flags, challengeHeaderSize); err != nil {
		return nil, err
	}
	return m, nil
}

// AuthenticateMessage is AUTHENTICATE_MESSAGE (MS-NLMP §2.2.1.3).
type AuthenticateMessage struct {
	Flags                     NegotiateFlags
	LmChallengeResponse       []byte
	NtChallengeResponse       []byte
	DomainName                string
	UserName                  string
	Workstation               string
	EncryptedRandomSessionKey []byte
	Version                   *Version // written when non-nil (or zeros when MIC is set); read when FlagVersion is set
	// MIC is the 16-byte message integrity code. It is present exactly when
	// the NTLMv2 response's AV pairs carry MsvAvFlags with AvFlagMICPresent
	// (§2.2.1.3: the MIC field is otherwise absent and the payload may start
	// where it would be).
	MIC []byte
}

// Marshal encodes the message. When MIC is non-nil it is written at offset
// 72 as given (callers computing it write zeros first, then patch).
func (m *AuthenticateMessage) Marshal() []byte {
	p := newPayload(typeAuthenticate, authenticateHeaderSize, versionSize+authMICSize)
	le.PutUint32(p.header[60:], uint32(m.Flags))
	if m.Version != nil || m.MIC != nil {
		p.header = m.Version.append(p.header)
	}
	if m.MIC != nil {
		var mic [authMICSize]byte
		copy(mic[:], m.MIC)
		p.header = append(p.header, mic[:]...)
	}
	// Payload order as Windows writes it: strings first, responses after.
	p.put(28, encodeString(m.DomainName, m.Flags))
	p.put(36, encodeString(m.UserName, m.Flags))
	p.put(44, encodeString(m.Workstation, m.Flags))
	p.put(12, m.LmChallengeResponse)
	p.put(20, m.NtChallengeResponse)
	p.put(52, m.EncryptedRandomSessionKey)
	return p.bytes()
}

// ParseAuthenticate decodes an AUTHENTICATE_MESSAGE. An NTLMv2 response
// (longer than the 24 bytes of NTLMv1) must hold a well-formed
// NTLMv2_CLIENT_CHALLENGE, whose AV pairs say whether a MIC is present.
func ParseAuthenticate(b []byte) (*AuthenticateMessage, error) {
	r, err := newReader(b, typeAuthenticate, authenticateHeaderSize)
	if err != nil {
		return nil, err
	}
	m := &AuthenticateMessage{Flags: NegotiateFlags(le.Uint32(b[60:]))}
	if m.LmChallengeResponse, err = r.field(12, "LmChallengeResponse"); err != nil {
		return nil, err
	}
	if m.NtChallengeResponse, err = r.field(20, "NtChallengeResponse"); err != nil {
		return nil, err
	}
	var raw [3][]byte
	for i, at := range []int{28, 36, 44} {
		if raw[i], err = r.field(at, "string"); err != nil {
			return nil, err
		}
	}
	if m.EncryptedRandomSessionKey, err = r.field(52, "EncryptedRandomSessionKey"); err != nil {
		return nil, err
	}
	if m.DomainName, err = decodeString(raw[0], m.Flags); err != nil {
		return nil, err
	}
	if m.UserName, err = decodeString(raw[1], m.Flags); err != nil {
		return nil, err
	}
	if m.Workstation, err = decodeString(raw[2], m.Flags); err != nil {
		return nil, err
	}
	hasMIC := false
	if len(m.NtChallengeResponse) > 24 {
		v2, err := parseNTLMv2Response(m.NtChallengeResponse)
		if err != nil {
			return nil, err
		}
		hasMIC = v2.avPairs.Flags()&AvFlagMICPresent != 0
	}
	if hasMIC {
		if r.minOffset < authMICOffset+authMICSize {
			return nil, malformed("MsvAvFlags announce a MIC but the payload starts at %d", r.minOffset)
		}
		m.MIC = clone(b[authMICOffset : authMICOffset+authMICSize])
	}
	// With a MIC the payload starts past it, so past any VERSION too.
	if m.Version, err = r.end(m.Flags, authenticateHeaderSize); err != nil {
		return nil, err
	}
	return m, nil
}

// ntlmv2Response is an NTLMv2_RESPONSE (MS-NLMP §2.2.2.8) taken apart.
type ntlmv2Response struct {
	proof           [16]byte
	temp            []byte // NTLMv2_CLIENT_CHALLENGE as sent: the "temp" NTProofStr covers
	timestamp       uint64
	clientChallenge [8]byte
	avPairs         AVPairs
}

func parseNTLMv2Response(nt []byte) (*ntlmv2Response, error) {
	if len(nt) < ntlmv2ResponseMin {
		return nil, malformed("NTLMv2 response is %d bytes, shorter than %d", len(nt), ntlmv2ResponseMin)
	}
	r := &ntlmv2Response{temp: nt[16:]}
	copy(r.proof[:], nt[:16])
	if r.temp[0] != 1 || r.temp[1] != 1 {
		return nil, malformed("NTLMv2_CLIENT_CHALLENGE RespType %d HiRespType %d, want 1 1", r.temp[0], r.temp[1])
	}
	r.timestamp = le.Uint64(r.temp[8:])
	copy(r.clientChallenge[:], r.temp[16:24])
	var err error
	if r.avPairs, err = ParseAVPairs(r.temp[ntlmv2ClientChallengeSize:]); err != nil {
		return nil, err
	}
	return r, nil
}
