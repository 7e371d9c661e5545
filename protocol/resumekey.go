package protocol

import "encoding/binary"

// ResumeKeySize is the size of SRV_RESUME_KEY (FIG. 3): ResumeKey, Timestamp
// and Pid, three u64s.
const ResumeKeySize = 24

// ResumeKeyResponseFixedSize is the fixed part of SRV_REQUEST_RESUME_KEY
// (FIG. 3): the 24-byte key and ContextLength u16.
const ResumeKeyResponseFixedSize = ResumeKeySize + 2

// MaxContextLength is the largest ContextLength (a u16 byte count).
const MaxContextLength = 0xFFFF

// ResumeKey is SRV_RESUME_KEY (FIG. 3) in its wire form: ResumeKey u64 @0,
// Timestamp u64 @8, Pid u64 @16, little-endian. It is opaque to the client,
// which hands it back in LWIO_FID_PARAMS (FIG. 7A) unchanged.
type ResumeKey [ResumeKeySize]byte

// MakeResumeKey builds the wire form of SRV_RESUME_KEY from its three parts.
func MakeResumeKey(resumeKey, timestamp, pid uint64) ResumeKey {
	var k ResumeKey
	binary.LittleEndian.PutUint64(k[0:], resumeKey)
	binary.LittleEndian.PutUint64(k[8:], timestamp)
	binary.LittleEndian.PutUint64(k[16:], pid)
	return k
}

// Parts returns the ResumeKey, Timestamp and Pid fields of k.
func (k ResumeKey) Parts() (resumeKey, timestamp, pid uint64) {
	le := binary.LittleEndian
	return le.Uint64(k[0:]), le.Uint64(k[8:]), le.Uint64(k[16:])
}

// ResumeKeyResponse is SRV_REQUEST_RESUME_KEY (FIG. 3), the answer to the
// session channel's resume-key request: the key, then ContextLength u16 @24
// and ContextLength bytes of Context @26. Context is the UNC name the client
// uses to reach the LWIO server, e.g. `\\server\share`, carried as UTF-16LE
// without a terminator; ContextLength counts bytes (docs/wire.md,
// "SRV_REQUEST_RESUME_KEY").
type ResumeKeyResponse struct {
	Key     ResumeKey
	Context string
}

// Size returns the encoded size, or -1 if Context cannot be encoded.
func (r *ResumeKeyResponse) Size() int {
	n := utf16Len(r.Context)
	if n < 0 || 2*n > MaxContextLength {
		return -1
	}
	return ResumeKeyResponseFixedSize + 2*n
}

// Append appends the encoded response to b. It fails if Context is not valid
// UTF-8, contains NUL or U+FFFD, or is longer than MaxContextLength bytes
// once in UTF-16.
func (r *ResumeKeyResponse) Append(b []byte) ([]byte, error) {
	size := r.Size()
	if size < 0 {
		return b, fieldErr("SRV_REQUEST_RESUME_KEY", "Context", "not encodable as at most %d bytes of UTF-16", MaxContextLength)
	}
	n := len(b)
	b = grow(b, size)
	w := b[n:]
	copy(w, r.Key[:])
	binary.LittleEndian.PutUint16(w[ResumeKeySize:], uint16(size-ResumeKeyResponseFixedSize))
	putUTF16(w[ResumeKeyResponseFixedSize:], r.Context)
	return b, nil
}

// DecodeResumeKeyResponse decodes exactly one SRV_REQUEST_RESUME_KEY.
func DecodeResumeKeyResponse(b []byte) (ResumeKeyResponse, error) {
	const msg = "SRV_REQUEST_RESUME_KEY"
	if len(b) < ResumeKeyResponseFixedSize {
		return ResumeKeyResponse{}, truncated(msg, "ContextLength", ResumeKeyResponseFixedSize, len(b))
	}
	var r ResumeKeyResponse
	copy(r.Key[:], b)
	cl := int(binary.LittleEndian.Uint16(b[ResumeKeySize:]))
	rest := b[ResumeKeyResponseFixedSize:]
	if cl > len(rest) {
		return ResumeKeyResponse{}, fieldErr(msg, "ContextLength", "%d bytes run past the %d that follow", cl, len(rest))
	}
	if cl < len(rest) {
		return ResumeKeyResponse{}, fieldErr(msg, "Context", "%d unexpected trailing bytes", len(rest)-cl)
	}
	ctx, ok := getUTF16(rest)
	if !ok {
		return ResumeKeyResponse{}, fieldErr(msg, "Context", "not valid UTF-16LE (odd length, unpaired surrogate, NUL or U+FFFD)")
	}
	r.Context = ctx
	return r, nil
}
