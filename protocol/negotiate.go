package protocol

import (
	"encoding/binary"
	"fmt"

	"github.com/lwiofs/lwiofs/transport"
)

// Control-channel constants (FIG. 4A).
const (
	// ProtocolID is the control header's ProtocolId: the four ASCII bytes
	// 'L','W','I','O' in that order.
	ProtocolID = "LWIO"
	// RevID is LWIO_REV_ID, carried in the control header (u32) and in
	// LWIO_AUTH_PARAMS (u16).
	RevID = 0x1001
	// ControlOpNegotiate is LWIO_CONTROL_OPCODE_NEGOTIATE, the control
	// header opcode of both the negotiate request and response.
	ControlOpNegotiate = 0xfe

	// MaxHostName is LWIO_MAX_HOST_NAME, the length in WCHARs of the
	// ClientName and SrvName arrays. The seed leaves it open; 64 holds a
	// Linux host name (HOST_NAME_MAX) and is zero-padded when shorter.
	MaxHostName = 64
	// MaxProviderName is LWIO_MAX_PROVIDER_NAME, the length in WCHARs of a
	// provider's Name array (left open by the seed).
	MaxProviderName = 32

	// ControlHeaderSize is the size of LWIO_CONTROL_HEADER.
	ControlHeaderSize = 12
	// NegotiateRequestFixedSize is the negotiate request before its
	// provider list: control header, ClientName, Key, ResponseLength,
	// ProviderCount.
	NegotiateRequestFixedSize = ControlHeaderSize + 2*MaxHostName + 16 + 2 + 2
	// NegotiateResponseFixedSize is the negotiate response before its
	// provider list: control header, SrvName, Key, ProviderCount.
	NegotiateResponseFixedSize = ControlHeaderSize + 2*MaxHostName + 16 + 2
	// ProviderFixedSize is LwioAddressBlk_t before its instance table:
	// Name and InstanceCount.
	ProviderFixedSize = 2*MaxProviderName + 2
	// InstanceFixedSize is LWIO_NET_ADDRESS before its bytes:
	// HostAddressLen and DiscriminatorLen.
	InstanceFixedSize = 4
	// MaxControlMessage is the largest control message: Length is a u16.
	MaxControlMessage = 0xFFFF
)

// ControlHeader is LWIO_CONTROL_HEADER (FIG. 4A): ProtocolId [4]byte @0
// ('LWIO'), RevId u32 @4, Opcode u16 @8, Length u16 @10 (the whole message).
// ProtocolId is not stored: decoding rejects anything but 'LWIO'.
type ControlHeader struct {
	RevID  uint32
	Opcode uint16
	Length uint16
}

// Put writes the 12-byte control header into b. It panics if b is shorter.
func (h *ControlHeader) Put(b []byte) {
	_ = b[ControlHeaderSize-1]
	copy(b, ProtocolID)
	binary.LittleEndian.PutUint32(b[4:], h.RevID)
	binary.LittleEndian.PutUint16(b[8:], h.Opcode)
	binary.LittleEndian.PutUint16(b[10:], h.Length)
}

// PeekControlHeader reads the control header at the start of b, which may
// hold only part of the message, and checks its ProtocolId and opcode. A
// reader of the pipe uses it to learn Length, the size of the whole message.
func PeekControlHeader(b []byte) (ControlHeader, error) {
	return peekControlHeader("CONTROL_HEADER", b)
}

func peekControlHeader(msg string, b []byte) (ControlHeader, error) {
	if len(b) < ControlHeaderSize {
		return ControlHeader{}, truncated(msg, "ControlHeader", ControlHeaderSize, len(b))
	}
	if string(b[:4]) != ProtocolID {
		return ControlHeader{}, fieldErr(msg, "ProtocolId", "%q, want %q", b[:4], ProtocolID)
	}
	h := ControlHeader{
		RevID:  binary.LittleEndian.Uint32(b[4:]),
		Opcode: binary.LittleEndian.Uint16(b[8:]),
		Length: binary.LittleEndian.Uint16(b[10:]),
	}
	if h.Opcode != ControlOpNegotiate {
		return ControlHeader{}, fieldErr(msg, "Opcode", "0x%x, want 0x%x", h.Opcode, ControlOpNegotiate)
	}
	if h.Length < ControlHeaderSize {
		return ControlHeader{}, fieldErr(msg, "Length", "%d is shorter than the control header", h.Length)
	}
	return h, nil
}

// decodeControlHeader reads and checks the control header at the start of a
// whole control message b: 'LWIO', the negotiate opcode and a Length equal
// to len(b). RevID is returned for the caller to judge.
func decodeControlHeader(msg string, b []byte) (ControlHeader, error) {
	h, err := peekControlHeader(msg, b)
	if err != nil {
		return ControlHeader{}, err
	}
	if int(h.Length) != len(b) {
		return ControlHeader{}, fieldErr(msg, "Length", "%d, but the message is %d bytes", h.Length, len(b))
	}
	return h, nil
}

// The provider list of both negotiate messages (FIG. 4A, 4B) is
// []transport.ProviderInfo: an entry is LwioAddressBlk_t, Name
// WCHAR[MaxProviderName] @0, InstanceCount u16 @64, then the instance
// table; an instance (transport.Instance) is LWIO_NET_ADDRESS,
// HostAddressLen u16 @0, DiscriminatorLen u16 @2, then the host address
// bytes and the discriminator bytes, whose meaning is the provider's.

func providersSize(ps []transport.ProviderInfo) int {
	n := 0
	for i := range ps {
		n += ProviderFixedSize
		for _, in := range ps[i].Instances {
			n += InstanceFixedSize + len(in.HostAddress) + len(in.Discriminator)
		}
	}
	return n
}

// putProviders writes the provider list into w, which has exactly the
// room providersSize says.
func putProviders(msg string, w []byte, ps []transport.ProviderInfo) error {
	le := binary.LittleEndian
	for i := range ps {
		p := &ps[i]
		if !putFixedName(w[:2*MaxProviderName], p.Name) {
			return fieldErr(msg, fmt.Sprintf("Providers[%d].Name", i), "not encodable in %d WCHARs", MaxProviderName)
		}
		if len(p.Instances) > 0xFFFF {
			return fieldErr(msg, fmt.Sprintf("Providers[%d].InstanceCount", i), "%d instances", len(p.Instances))
		}
		le.PutUint16(w[2*MaxProviderName:], uint16(len(p.Instances)))
		w = w[ProviderFixedSize:]
		for j, in := range p.Instances {
			if len(in.HostAddress) > 0xFFFF || len(in.Discriminator) > 0xFFFF {
				return fieldErr(msg, fmt.Sprintf("Providers[%d].Instances[%d]", i, j), "address longer than 65535 bytes")
			}
			le.PutUint16(w[0:], uint16(len(in.HostAddress)))
			le.PutUint16(w[2:], uint16(len(in.Discriminator)))
			w = w[InstanceFixedSize:]
			w = w[copy(w, in.HostAddress):]
			w = w[copy(w, in.Discriminator):]
		}
	}
	return nil
}

// decodeProviders reads exactly count providers filling all of b. Counts
// are checked against the bytes left before anything is allocated for them.
func decodeProviders(msg string, b []byte, count int) ([]transport.ProviderInfo, error) {
	if count > len(b)/ProviderFixedSize {
		return nil, fieldErr(msg, "ProviderCount", "%d providers cannot fit in %d bytes", count, len(b))
	}
	le := binary.LittleEndian
	var ps []transport.ProviderInfo
	if count > 0 {
		ps = make([]transport.ProviderInfo, count)
	}
	for i := range ps {
		if len(b) < ProviderFixedSize {
			return nil, truncated(msg, fmt.Sprintf("Providers[%d]", i), ProviderFixedSize, len(b))
		}
		name, ok := getFixedName(b[:2*MaxProviderName])
		if !ok {
			return nil, fieldErr(msg, fmt.Sprintf("Providers[%d].Name", i), "not a zero-padded UTF-16LE name")
		}
		ps[i].Name = name
		ic := int(le.Uint16(b[2*MaxProviderName:]))
		b = b[ProviderFixedSize:]
		if ic > len(b)/InstanceFixedSize {
			return nil, fieldErr(msg, fmt.Sprintf("Providers[%d].InstanceCount", i), "%d instances cannot fit in %d bytes", ic, len(b))
		}
		if ic > 0 {
			ps[i].Instances = make([]transport.Instance, ic)
		}
		for j := range ps[i].Instances {
			f := fmt.Sprintf("Providers[%d].Instances[%d]", i, j)
			if len(b) < InstanceFixedSize {
				return nil, truncated(msg, f, InstanceFixedSize, len(b))
			}
			hl, dl := int(le.Uint16(b[0:])), int(le.Uint16(b[2:]))
			b = b[InstanceFixedSize:]
			if hl+dl > len(b) {
				return nil, fieldErr(msg, f+".HostAddressLen", "%d+%d address bytes run past the %d left", hl, dl, len(b))
			}
			ps[i].Instances[j] = transport.Instance{
				HostAddress:   append([]byte{}, b[:hl]...),
				Discriminator: append([]byte{}, b[hl:hl+dl]...),
			}
			b = b[hl+dl:]
		}
	}
	if len(b) != 0 {
		return nil, fieldErr(msg, "ProviderList", "%d unexpected trailing bytes", len(b))
	}
	return ps, nil
}

// NegotiateRequest is LwioNegotiateRequest_t (FIG. 4A), sent by the client
// over \PIPE\LWIO. Layout: control header @0, ClientName
// WCHAR[MaxHostName] @12, Key [16]byte @140, ResponseLength u16 @156,
// ProviderCount u16 @158, provider list @160.
type NegotiateRequest struct {
	// RevID is the control header's RevId; NewNegotiateRequest sets RevID.
	RevID      uint32
	ClientName string
	// Key is the client's UUID (FIG. 4A "Key 237"), carried as 16 opaque
	// bytes.
	Key [16]byte
	// ResponseLength is the size of the client's buffer for the response.
	ResponseLength uint16
	Providers      []transport.ProviderInfo
}

// NewNegotiateRequest returns a negotiate request (FIG. 4A) with RevId set
// to LWIO_REV_ID and ResponseLength to the largest control message.
func NewNegotiateRequest(clientName string, key [16]byte, providers []transport.ProviderInfo) NegotiateRequest {
	return NegotiateRequest{RevID: RevID, ClientName: clientName, Key: key, ResponseLength: MaxControlMessage, Providers: providers}
}

// Size returns the encoded size.
func (r *NegotiateRequest) Size() int { return NegotiateRequestFixedSize + providersSize(r.Providers) }

// Append appends the encoded request to b. It fails if a name does not fit
// its array, a count or length overflows its field, or the message exceeds
// MaxControlMessage.
func (r *NegotiateRequest) Append(b []byte) ([]byte, error) {
	n := len(b)
	b, err := requestShape.append(b, negotiateFields{r.RevID, r.ClientName, r.Key, r.Providers})
	if err == nil {
		binary.LittleEndian.PutUint16(b[n+156:], r.ResponseLength)
	}
	return b, err
}

// DecodeNegotiateRequest decodes exactly one negotiate request. The control
// header's Length must equal len(b). Host addresses and discriminators are
// copied out of b.
func DecodeNegotiateRequest(b []byte) (NegotiateRequest, error) {
	f, err := requestShape.decode(b)
	if err != nil {
		return NegotiateRequest{}, err
	}
	return NegotiateRequest{
		RevID: f.rev, ClientName: f.name, Key: f.key, Providers: f.providers,
		ResponseLength: binary.LittleEndian.Uint16(b[156:]),
	}, nil
}

// NegotiateResponse is the negotiate response (FIG. 4B). The seed gives it
// in prose only; this implementation lays it out like the request without
// ResponseLength: control header @0, SrvName WCHAR[MaxHostName] @12, Key
// [16]byte @140, ProviderCount u16 @156, provider list @158
// (docs/wire.md, "Negotiate response").
type NegotiateResponse struct {
	// RevID is the control header's RevId; NewNegotiateResponse sets RevID.
	RevID   uint32
	SrvName string
	// Key is the server-generated GUID the client presents in its AUTH
	// request (FIG. 6A), as 16 opaque bytes.
	Key [16]byte
	// Providers are the providers common to client and server.
	Providers []transport.ProviderInfo
}

// NewNegotiateResponse returns a negotiate response (FIG. 4B) with RevId
// set to LWIO_REV_ID.
func NewNegotiateResponse(srvName string, key [16]byte, providers []transport.ProviderInfo) NegotiateResponse {
	return NegotiateResponse{RevID: RevID, SrvName: srvName, Key: key, Providers: providers}
}

// Size returns the encoded size.
func (r *NegotiateResponse) Size() int {
	return NegotiateResponseFixedSize + providersSize(r.Providers)
}

// Append appends the encoded response to b, failing as
// NegotiateRequest.Append does.
func (r *NegotiateResponse) Append(b []byte) ([]byte, error) {
	return responseShape.append(b, negotiateFields{r.RevID, r.SrvName, r.Key, r.Providers})
}

// DecodeNegotiateResponse decodes exactly one negotiate response.
func DecodeNegotiateResponse(b []byte) (NegotiateResponse, error) {
	f, err := responseShape.decode(b)
	if err != nil {
		return NegotiateResponse{}, err
	}
	return NegotiateResponse{RevID: f.rev, SrvName: f.name, Key: f.key, Providers: f.providers}, nil
}

// negotiateShape is what the two negotiate messages share (FIG. 4A, 4B):
// the control header @0, a host name WCHAR[MaxHostName] @12 and the Key
// @140; the request has ResponseLength @156 before its ProviderCount, so
// the count sits at countOff and the provider list at fixed.
type negotiateShape struct {
	msg, nameField  string
	countOff, fixed int
}

var (
	requestShape  = negotiateShape{"NEGOTIATE_REQUEST", "ClientName", 158, NegotiateRequestFixedSize}
	responseShape = negotiateShape{"NEGOTIATE_RESPONSE", "SrvName", 156, NegotiateResponseFixedSize}
)

// negotiateFields are the values the two messages share.
type negotiateFields struct {
	rev       uint32
	name      string
	key       [16]byte
	providers []transport.ProviderInfo
}

// append appends the message with f to b, leaving the request's
// ResponseLength zero. It fails if the name does not fit its array, a
// count or length overflows its field, or the message exceeds
// MaxControlMessage; b is then returned as it was.
func (s negotiateShape) append(b []byte, f negotiateFields) ([]byte, error) {
	size := s.fixed + providersSize(f.providers)
	if size > MaxControlMessage {
		return b, fieldErr(s.msg, "Length", "message of %d bytes exceeds %d", size, MaxControlMessage)
	}
	if len(f.providers) > 0xFFFF {
		return b, fieldErr(s.msg, "ProviderCount", "%d providers", len(f.providers))
	}
	n := len(b)
	b = grow(b, size)
	w := b[n:]
	ch := ControlHeader{RevID: f.rev, Opcode: ControlOpNegotiate, Length: uint16(size)}
	ch.Put(w)
	if !putFixedName(w[12:12+2*MaxHostName], f.name) {
		return b[:n], fieldErr(s.msg, s.nameField, "not encodable in %d WCHARs", MaxHostName)
	}
	copy(w[140:], f.key[:])
	binary.LittleEndian.PutUint16(w[s.countOff:], uint16(len(f.providers)))
	if err := putProviders(s.msg, w[s.fixed:], f.providers); err != nil {
		return b[:n], err
	}
	return b, nil
}

// decode decodes exactly one message of this shape: the control header's
// Length must equal len(b); host addresses and discriminators are copied.
func (s negotiateShape) decode(b []byte) (negotiateFields, error) {
	ch, err := decodeControlHeader(s.msg, b)
	if err != nil {
		return negotiateFields{}, err
	}
	if len(b) < s.fixed {
		return negotiateFields{}, truncated(s.msg, "ProviderCount", s.fixed, len(b))
	}
	name, ok := getFixedName(b[12 : 12+2*MaxHostName])
	if !ok {
		return negotiateFields{}, fieldErr(s.msg, s.nameField, "not a zero-padded UTF-16LE name")
	}
	f := negotiateFields{rev: ch.RevID, name: name}
	copy(f.key[:], b[140:156])
	count := int(binary.LittleEndian.Uint16(b[s.countOff:]))
	if f.providers, err = decodeProviders(s.msg, b[s.fixed:], count); err != nil {
		return negotiateFields{}, err
	}
	return f, nil
}
