package protocol

import "encoding/binary"

// FidParamsSize is the size of LWIO_FID_PARAMS as laid out here: ResumeKey
// [24]byte @0, SessionId u64 @24, FlagsAndAttributes u32 @32, no padding.
const FidParamsSize = ResumeKeySize + 8 + 4

// FileNoIntermediateBuffering is the Win32 create flag
// FILE_NO_INTERMEDIATE_BUFFERING (0x8). A collapsed vectored write (FIG.
// 17B) is allowed only on a file registered with it.
const FileNoIntermediateBuffering = 0x8

// FidParams is LWIO_FID_PARAMS (FIG. 7A). The seed names its fields but
// prints no layout; docs/wire.md, "LWIO_FID_PARAMS", fixes it.
type FidParams struct {
	// ResumeKey is the server's resume key from SRV_REQUEST_RESUME_KEY.
	ResumeKey ResumeKey
	// SessionID is the SessionId the server returned in AUTH (FIG. 6B).
	SessionID uint64
	// FlagsAndAttributes are the Win32 create flags the file was opened
	// with (e.g. FileNoIntermediateBuffering).
	FlagsAndAttributes uint32
}

// Put writes the 36 bytes into b[:FidParamsSize]. It panics if b is shorter.
func (p *FidParams) Put(b []byte) {
	_ = b[FidParamsSize-1]
	copy(b, p.ResumeKey[:])
	binary.LittleEndian.PutUint64(b[24:], p.SessionID)
	binary.LittleEndian.PutUint32(b[32:], p.FlagsAndAttributes)
}

// Append appends the 36 bytes to b.
func (p *FidParams) Append(b []byte) []byte { return appendPut(b, FidParamsSize, p.Put) }

// DecodeFidParams decodes exactly FidParamsSize bytes.
func DecodeFidParams(b []byte) (FidParams, error) {
	return decodeExact("FID_PARAMS", FidParamsSize, b, getFidParams)
}

func getFidParams(b []byte) FidParams {
	var p FidParams
	copy(p.ResumeKey[:], b)
	p.SessionID = binary.LittleEndian.Uint64(b[24:])
	p.FlagsAndAttributes = binary.LittleEndian.Uint32(b[32:])
	return p
}

// RegisterRequest is the register-file message (FIG. 7A): the common header
// followed by LWIO_FID_PARAMS.
type RegisterRequest struct {
	Header Header
	Params FidParams
}

// RegisterRequestSize is the size of a register-file message.
const RegisterRequestSize = HeaderSize + FidParamsSize

// NewRegisterRequest builds FIG. 7A: Opcode REGISTER, Flags INTERRUPT,
// Length = header plus LWIO_FID_PARAMS, Credits = the client's pending
// requests, Cookie = cookie.
func NewRegisterRequest(p FidParams, credits uint8, cookie uint64) RegisterRequest {
	return RegisterRequest{
		Header: Header{
			Length:  RegisterRequestSize,
			Opcode:  OpRegister,
			Flags:   FlagInterrupt,
			Credits: credits,
			IosVa:   cookie,
		},
		Params: p,
	}
}

// Append appends the encoded message to b.
func (r *RegisterRequest) Append(b []byte) []byte {
	b = r.Header.Append(b)
	return r.Params.Append(b)
}

// NewRegisterResponse builds FIG. 7B: Information = the Fid to use in I/O
// requests, Status, Cookie echoed.
func NewRegisterResponse(cookie uint64, fid uint16, status Status) StatusResponse {
	return StatusResponse{Cookie: cookie, Ios: IOStatusBlock{Information: uint32(fid), Status: status}}
}
