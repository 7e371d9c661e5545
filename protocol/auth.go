package protocol

import (
	"encoding/binary"
	"fmt"

	"github.com/lwiofs/lwiofs/smbauth"
)

// LWIO_AUTH_OPTIONS codes and lengths (FIG. 6A).
const (
	AuthOptionEnd       = 0 // LWIO_AUTH_OPTION_END: the code alone ends the list
	AuthOptionKey       = 1 // LWIO_AUTH_OPTION_KEY
	AuthOptionSessionID = 2 // LWIO_AUTH_OPTION_SESSION_ID
	AuthOptionSignature = 3 // LWIO_AUTH_OPTION_SIGNATURE
	// AuthOptionNonce is lwiofs's: 16 random bytes each end sends when the
	// session is sealed; with the Key they make the connection's sealing
	// keys (smbauth.DataSealKeys) differ from every other connection's.
	AuthOptionNonce = 4

	AuthOptionKeyLength       = 16
	AuthOptionSessionIDLength = 8
	AuthOptionSignatureLength = 16
	AuthOptionNonceLength     = 16

	// AuthParamsFixedSize is LWIO_AUTH_PARAMS before its option list.
	AuthParamsFixedSize = 30
	// AuthParamsMaxSize is LWIO_AUTH_PARAMS with all four options and END.
	AuthParamsMaxSize = AuthParamsFixedSize + 2 + AuthOptionKeyLength + 2 + AuthOptionSessionIDLength +
		2 + AuthOptionNonceLength + 2 + AuthOptionSignatureLength + 1

	// AuthEndian is the Endian value: sizeof(ULONG_PTR) on a 64-bit host.
	AuthEndian = 8

	// AuthInformationExtra is what the server adds to the size of its
	// LWIO_AUTH_PARAMS to form the Information of the status response that
	// completes authentication (FIG. 6C: "the number of bytes of
	// LWIO_AUTH_PARAMS plus eight bytes").
	AuthInformationExtra = 8
)

// AuthParams is LWIO_AUTH_PARAMS (FIG. 6A client, FIG. 6B server). Fixed
// part: Magic [4]byte @0 ('LWIO', checked, not stored), RevId u16 @4,
// Endian u16 @6, PageSize u16 @8, BaseSequence u16 @10, MaxRdmaWindowSize
// u32 @12, MaxSendBufferSize u32 @16, MaxRecvBufferSize u32 @20, HeaderSize
// u16 @24, Credits u16 @26, RdmaReadSupported u16 @28; options follow @30,
// each {OptionCode u8, OptionLen u8, data}, ended by the single byte
// OptionCode 0 (END). Options are encoded in the order KEY, SESSION_ID,
// NONCE, SIGNATURE; any order is accepted, a repeated or unknown option is
// not.
//
// The Signature is HMAC-SHA256 keyed with the session key, over
// SigningInput, truncated to 16 bytes; the seed's unkeyed MD5 would prove
// nothing (docs/wire.md, "Signature").
type AuthParams struct {
	RevID             uint16
	Endian            uint16
	PageSize          uint16
	BaseSequence      uint16
	MaxRdmaWindowSize uint32
	MaxSendBufferSize uint32
	MaxRecvBufferSize uint32
	HeaderSize        uint16
	Credits           uint16
	RdmaReadSupported uint16

	HasKey       bool
	Key          [AuthOptionKeyLength]byte
	HasSessionID bool
	SessionID    uint64
	HasNonce     bool
	Nonce        [AuthOptionNonceLength]byte
	HasSignature bool
	Signature    [AuthOptionSignatureLength]byte
}

// Size returns the encoded size.
func (p *AuthParams) Size() int { return p.size(true) }

func (p *AuthParams) size(withSig bool) int {
	n := AuthParamsFixedSize + 1
	if p.HasKey {
		n += 2 + AuthOptionKeyLength
	}
	if p.HasSessionID {
		n += 2 + AuthOptionSessionIDLength
	}
	if p.HasNonce {
		n += 2 + AuthOptionNonceLength
	}
	if p.HasSignature && withSig {
		n += 2 + AuthOptionSignatureLength
	}
	return n
}

// Append appends the encoded parameters to b.
func (p *AuthParams) Append(b []byte) []byte { return p.append(b, true) }

// SigningInput returns the bytes the Signature covers: the parameters
// encoded without the SIGNATURE option (but with END).
func (p *AuthParams) SigningInput() []byte { return p.append(nil, false) }

func (p *AuthParams) append(b []byte, withSig bool) []byte {
	n := len(b)
	b = grow(b, p.size(withSig))
	w := b[n:]
	le := binary.LittleEndian
	copy(w, ProtocolID)
	le.PutUint16(w[4:], p.RevID)
	le.PutUint16(w[6:], p.Endian)
	le.PutUint16(w[8:], p.PageSize)
	le.PutUint16(w[10:], p.BaseSequence)
	le.PutUint32(w[12:], p.MaxRdmaWindowSize)
	le.PutUint32(w[16:], p.MaxSendBufferSize)
	le.PutUint32(w[20:], p.MaxRecvBufferSize)
	le.PutUint16(w[24:], p.HeaderSize)
	le.PutUint16(w[26:], p.Credits)
	le.PutUint16(w[28:], p.RdmaReadSupported)
	w = w[AuthParamsFixedSize:]
	if p.HasKey {
		w[0], w[1] = AuthOptionKey, AuthOptionKeyLength
		w = w[2+copy(w[2:], p.Key[:]):]
	}
	if p.HasSessionID {
		w[0], w[1] = AuthOptionSessionID, AuthOptionSessionIDLength
		le.PutUint64(w[2:], p.SessionID)
		w = w[2+AuthOptionSessionIDLength:]
	}
	if p.HasNonce {
		w[0], w[1] = AuthOptionNonce, AuthOptionNonceLength
		w = w[2+copy(w[2:], p.Nonce[:]):]
	}
	if p.HasSignature && withSig {
		w[0], w[1] = AuthOptionSignature, AuthOptionSignatureLength
		w = w[2+copy(w[2:], p.Signature[:]):]
	}
	w[0] = AuthOptionEnd
	return b
}

// ComputeSignature returns HMAC-SHA256(key, SigningInput) truncated to 16
// bytes (smbauth.Sign, the SMB2 signature the session channel uses too).
func (p *AuthParams) ComputeSignature(key []byte) [AuthOptionSignatureLength]byte {
	return smbauth.Sign(key, p.SigningInput())
}

// Sign sets the SIGNATURE option to ComputeSignature(key).
func (p *AuthParams) Sign(key []byte) {
	p.Signature = p.ComputeSignature(key)
	p.HasSignature = true
}

// Verify reports whether p carries a SIGNATURE option equal, in constant
// time, to ComputeSignature(key). An empty key never verifies.
func (p *AuthParams) Verify(key []byte) bool {
	if !p.HasSignature || len(key) == 0 {
		return false
	}
	return smbauth.VerifySignature(key, p.Signature[:], p.SigningInput())
}

// DecodeAuthParams decodes exactly one LWIO_AUTH_PARAMS: the END option must
// be the last byte of b.
func DecodeAuthParams(b []byte) (AuthParams, error) {
	p, n, err := DecodeAuthParamsPrefix(b)
	if err != nil {
		return AuthParams{}, err
	}
	if n != len(b) {
		return AuthParams{}, fieldErr("AUTH_PARAMS", "Options", "%d unexpected bytes after END", len(b)-n)
	}
	return p, nil
}

// DecodeAuthParamsPrefix decodes the LWIO_AUTH_PARAMS at the start of b and
// returns how many bytes it took (through END). A client reads the
// server's parameters (FIG. 6B) this way out of the buffer it named in
// DataVa/DataMh, which is larger than the parameters.
func DecodeAuthParamsPrefix(b []byte) (AuthParams, int, error) {
	const msg = "AUTH_PARAMS"
	if len(b) < AuthParamsFixedSize {
		return AuthParams{}, 0, truncated(msg, "fixed part", AuthParamsFixedSize, len(b))
	}
	if string(b[:4]) != ProtocolID {
		return AuthParams{}, 0, fieldErr(msg, "Magic", "%q, want %q", b[:4], ProtocolID)
	}
	le := binary.LittleEndian
	p := AuthParams{
		RevID:             le.Uint16(b[4:]),
		Endian:            le.Uint16(b[6:]),
		PageSize:          le.Uint16(b[8:]),
		BaseSequence:      le.Uint16(b[10:]),
		MaxRdmaWindowSize: le.Uint32(b[12:]),
		MaxSendBufferSize: le.Uint32(b[16:]),
		MaxRecvBufferSize: le.Uint32(b[20:]),
		HeaderSize:        le.Uint16(b[24:]),
		Credits:           le.Uint16(b[26:]),
		RdmaReadSupported: le.Uint16(b[28:]),
	}
	off := AuthParamsFixedSize
	for i := 0; ; i++ {
		field := fmt.Sprintf("Options[%d]", i)
		if off >= len(b) {
			return AuthParams{}, 0, fieldErr(msg, field, "option list has no END")
		}
		code := b[off]
		if code == AuthOptionEnd {
			return p, off + 1, nil
		}
		if off+2 > len(b) {
			return AuthParams{}, 0, truncated(msg, field+".OptionLen", off+2, len(b))
		}
		olen := int(b[off+1])
		data := b[off+2:]
		var want int
		var seen *bool
		switch code {
		case AuthOptionKey:
			want, seen = AuthOptionKeyLength, &p.HasKey
		case AuthOptionSessionID:
			want, seen = AuthOptionSessionIDLength, &p.HasSessionID
		case AuthOptionSignature:
			want, seen = AuthOptionSignatureLength, &p.HasSignature
		case AuthOptionNonce:
			want, seen = AuthOptionNonceLength, &p.HasNonce
		default:
			return AuthParams{}, 0, fieldErr(msg, field+".OptionCode", "unknown option %d", code)
		}
		if olen != want {
			return AuthParams{}, 0, fieldErr(msg, field+".OptionLen", "%d for option %d, want %d", olen, code, want)
		}
		if *seen {
			return AuthParams{}, 0, fieldErr(msg, field+".OptionCode", "option %d repeated", code)
		}
		if len(data) < olen {
			return AuthParams{}, 0, truncated(msg, field+".OptionData", off+2+olen, len(b))
		}
		*seen = true
		switch code {
		case AuthOptionKey:
			copy(p.Key[:], data)
		case AuthOptionSessionID:
			p.SessionID = le.Uint64(data)
		case AuthOptionSignature:
			copy(p.Signature[:], data)
		case AuthOptionNonce:
			copy(p.Nonce[:], data)
		}
		off += 2 + olen
	}
}

// AuthRequest is the client's authenticate message (FIG. 6A): the common
// header followed by LWIO_AUTH_PARAMS.
type AuthRequest struct {
	Header Header
	Params AuthParams
}

// NewAuthRequest builds FIG. 6A: Opcode AUTH, Flags INTERRUPT, Length = the
// header plus the parameters, DataVa/DataMh = where the server RDMA-writes
// its own LWIO_AUTH_PARAMS (FIG. 6B), Cookie = cookie. Sign p before
// calling: Length counts the signature option.
func NewAuthRequest(p AuthParams, dataVa uint64, dataMh uint32, cookie uint64) AuthRequest {
	h := Header{
		Length: uint32(HeaderSize + p.Size()),
		Opcode: OpAuth,
		Flags:  FlagInterrupt,
		DataVa: dataVa,
		DataMh: dataMh,
		IosVa:  cookie,
	}
	return AuthRequest{Header: h, Params: p}
}

// Size returns the encoded size.
func (r *AuthRequest) Size() int { return HeaderSize + r.Params.Size() }

// Append appends the encoded message to b.
func (r *AuthRequest) Append(b []byte) []byte {
	b = r.Header.Append(b)
	return r.Params.Append(b)
}

// NewAuthResponse builds the status response that completes authentication
// (FIG. 6C): Cookie echoed, Information = the size of the server's
// LWIO_AUTH_PARAMS plus AuthInformationExtra, Status success or
// StatusAccessDenied.
func NewAuthResponse(cookie uint64, serverParams *AuthParams, status Status) StatusResponse {
	return StatusResponse{Cookie: cookie, Ios: IOStatusBlock{
		Information: uint32(serverParams.Size() + AuthInformationExtra),
		Status:      status,
	}}
}
