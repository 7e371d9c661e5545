package protocol

import "encoding/binary"

// Fixed sizes of the parts every message shares.
const (
	// HeaderSize is the size of LWIO_COMMON_HEADER (seed, "I/O Phase") as
	// laid out by this implementation: little-endian, no padding
	// (docs/wire.md, "Common header").
	HeaderSize = 48
	// StatusResponseSize is the size of LWIO_MSG_STATUS_RESPONSE (FIG. 6C).
	StatusResponseSize = 16
	// IOStatusBlockSize is the size of LWIO_IO_STATUS_BLOCK (FIG. 6C).
	IOStatusBlockSize = 8
	// RDMARegionSize is the size of LWIO_RDMA_REGION (FIG. 16A).
	RDMARegionSize = 16
	// SectorSize is the backend sector size: the final region of a vectored
	// request must be a multiple of it (FIG. 16A).
	SectorSize = 512
)

// Header is LWIO_COMMON_HEADER, the 48-byte header of every client message
// (seed, "I/O Phase"; docs/wire.md, "Common header"). Byte offsets:
//
//	@0  Length u32
//	@4  Opcode u8, Flags u8, Credits u8, Marker u8   (union: Status u32)
//	@8  Fid u16, @10 Sequence u16, @12 Tid u32
//	@16 Offset u64
//	@24 DataVa u64
//	@32 DataMh u32                                   (union: NumPages u16, PageSize u16)
//	@36 IosMh u32                                    (union: ImmediateCookie u32)
//	@40 IosVa u64                                    (union: Cookie u64)
//
// The unions are stored once, in the first-named field; the accessors below
// give the other views.
type Header struct {
	Length   uint32
	Opcode   Opcode
	Flags    uint8
	Credits  uint8
	Marker   uint8
	Fid      uint16
	Sequence uint16
	Tid      uint32
	Offset   uint64
	DataVa   uint64
	DataMh   uint32
	IosMh    uint32
	IosVa    uint64
}

// NumPages is the Vec.NumPages view of DataMh (low 16 bits, the first on the
// wire), used by vectored requests (FIG. 16A, 17A).
func (h *Header) NumPages() uint16 { return uint16(h.DataMh) }

// PageSize is the Vec.PageSize view of DataMh (high 16 bits).
func (h *Header) PageSize() uint16 { return uint16(h.DataMh >> 16) }

// SetVec sets the Vec view of DataMh.
func (h *Header) SetVec(numPages, pageSize uint16) {
	h.DataMh = uint32(numPages) | uint32(pageSize)<<16
}

// ImmediateCookie is the ImmediateCookie view of IosMh: the 32-bit value the
// server puts in the immediate data of an interrupt-mode completion.
func (h *Header) ImmediateCookie() uint32 { return h.IosMh }

// Cookie is the Cookie view of IosVa: the client's value echoed in the
// status response.
func (h *Header) Cookie() uint64 { return h.IosVa }

// SetCookies sets the ImmediateCookie and Cookie views (IosMh and IosVa).
func (h *Header) SetCookies(imm uint32, cookie uint64) {
	h.IosMh = imm
	h.IosVa = cookie
}

// Status is the Status view of the word at offset 4 (Opcode, Flags, Credits,
// Marker read as one little-endian u32).
func (h *Header) Status() Status {
	return Status(uint32(h.Opcode) | uint32(h.Flags)<<8 | uint32(h.Credits)<<16 | uint32(h.Marker)<<24)
}

// SetStatus sets the word at offset 4 through its Status view.
func (h *Header) SetStatus(s Status) {
	h.Opcode = Opcode(s)
	h.Flags = uint8(s >> 8)
	h.Credits = uint8(s >> 16)
	h.Marker = uint8(s >> 24)
}

// Put writes the header's 48 bytes into b[:HeaderSize] without allocating,
// so an engine can encode straight into registered memory. It panics if
// len(b) < HeaderSize, like a slice index would.
func (h *Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	le := binary.LittleEndian
	le.PutUint32(b[0:], h.Length)
	b[4] = uint8(h.Opcode)
	b[5] = h.Flags
	b[6] = h.Credits
	b[7] = h.Marker
	le.PutUint16(b[8:], h.Fid)
	le.PutUint16(b[10:], h.Sequence)
	le.PutUint32(b[12:], h.Tid)
	le.PutUint64(b[16:], h.Offset)
	le.PutUint64(b[24:], h.DataVa)
	le.PutUint32(b[32:], h.DataMh)
	le.PutUint32(b[36:], h.IosMh)
	le.PutUint64(b[40:], h.IosVa)
}

// Append appends the header's 48 bytes to b.
func (h *Header) Append(b []byte) []byte { return appendPut(b, HeaderSize, h.Put) }

// DecodeHeader decodes the common header at the start of b. Bytes after the
// first HeaderSize are the message body and are not looked at; use
// DecodeRequest to decode and validate a whole client message.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, truncated("HEADER", "Header", HeaderSize, len(b))
	}
	le := binary.LittleEndian
	return Header{
		Length:   le.Uint32(b[0:]),
		Opcode:   Opcode(b[4]),
		Flags:    b[5],
		Credits:  b[6],
		Marker:   b[7],
		Fid:      le.Uint16(b[8:]),
		Sequence: le.Uint16(b[10:]),
		Tid:      le.Uint32(b[12:]),
		Offset:   le.Uint64(b[16:]),
		DataVa:   le.Uint64(b[24:]),
		DataMh:   le.Uint32(b[32:]),
		IosMh:    le.Uint32(b[36:]),
		IosVa:    le.Uint64(b[40:]),
	}, nil
}

// IOStatusBlock is LWIO_IO_STATUS_BLOCK (FIG. 6C): Information u32 @0,
// Status u32 @4. Information is a byte count, or a signed credit delta in a
// delta-credit message (FIG. 11A; see CreditDelta).
type IOStatusBlock struct {
	Information uint32
	Status      Status
}

// Put writes the block's 8 bytes into b[:IOStatusBlockSize]. It panics if b
// is shorter.
func (s *IOStatusBlock) Put(b []byte) {
	_ = b[IOStatusBlockSize-1]
	binary.LittleEndian.PutUint32(b[0:], s.Information)
	binary.LittleEndian.PutUint32(b[4:], uint32(s.Status))
}

// Append appends the block's 8 bytes to b.
func (s *IOStatusBlock) Append(b []byte) []byte { return appendPut(b, IOStatusBlockSize, s.Put) }

// DecodeIOStatusBlock decodes exactly IOStatusBlockSize bytes.
func DecodeIOStatusBlock(b []byte) (IOStatusBlock, error) {
	return decodeExact("IO_STATUS_BLOCK", IOStatusBlockSize, b, getIOStatusBlock)
}

func getIOStatusBlock(b []byte) IOStatusBlock {
	return IOStatusBlock{
		Information: binary.LittleEndian.Uint32(b[0:]),
		Status:      Status(binary.LittleEndian.Uint32(b[4:])),
	}
}

// StatusResponse is LWIO_MSG_STATUS_RESPONSE (FIG. 6C, 7B, 9B, 11A, 11C,
// 12B, 13B, 14B, 15B, 16B, 17D): Cookie u64 @0, Ios @8. The server sends it
// to complete a control request or an interrupt-mode I/O request (a
// polling one gets the IOStatusBlock RDMA-written instead, FIG. 8), and as
// a delta-credit message (FIG. 11A).
type StatusResponse struct {
	Cookie uint64
	Ios    IOStatusBlock
}

// Put writes the response's 16 bytes into b[:StatusResponseSize] without
// allocating. It panics if b is shorter.
func (r *StatusResponse) Put(b []byte) {
	_ = b[StatusResponseSize-1]
	binary.LittleEndian.PutUint64(b[0:], r.Cookie)
	r.Ios.Put(b[8:])
}

// Append appends the response's 16 bytes to b.
func (r *StatusResponse) Append(b []byte) []byte { return appendPut(b, StatusResponseSize, r.Put) }

// DecodeStatusResponse decodes exactly StatusResponseSize bytes.
func DecodeStatusResponse(b []byte) (StatusResponse, error) {
	return decodeExact("STATUS_RESPONSE", StatusResponseSize, b, getStatusResponse)
}

func getStatusResponse(b []byte) StatusResponse {
	return StatusResponse{
		Cookie: binary.LittleEndian.Uint64(b[0:]),
		Ios:    getIOStatusBlock(b[8:]),
	}
}

// RDMARegion is LWIO_RDMA_REGION (FIG. 16A): DataVa u64 @0, DataMh u32 @8,
// Length u32 @12. A vectored request's header is followed by NumPages of
// them.
type RDMARegion struct {
	DataVa uint64
	DataMh uint32
	Length uint32
}

// Put writes the region's 16 bytes into b[:RDMARegionSize]. It panics if b
// is shorter.
func (r *RDMARegion) Put(b []byte) {
	_ = b[RDMARegionSize-1]
	binary.LittleEndian.PutUint64(b[0:], r.DataVa)
	binary.LittleEndian.PutUint32(b[8:], r.DataMh)
	binary.LittleEndian.PutUint32(b[12:], r.Length)
}

// Append appends the region's 16 bytes to b.
func (r *RDMARegion) Append(b []byte) []byte { return appendPut(b, RDMARegionSize, r.Put) }

// DecodeRDMARegion decodes exactly RDMARegionSize bytes.
func DecodeRDMARegion(b []byte) (RDMARegion, error) {
	return decodeExact("RDMA_REGION", RDMARegionSize, b, getRegion)
}

func getRegion(b []byte) RDMARegion {
	return RDMARegion{
		DataVa: binary.LittleEndian.Uint64(b[0:]),
		DataMh: binary.LittleEndian.Uint32(b[8:]),
		Length: binary.LittleEndian.Uint32(b[12:]),
	}
}

// appendPut appends size bytes to b, filled by put (a fixed-size
// structure's Put), and returns the extended slice.
func appendPut(b []byte, size int, put func([]byte)) []byte {
	n := len(b)
	b = grow(b, size)
	put(b[n:])
	return b
}

// decodeExact decodes a fixed-size structure msg of exactly size bytes with
// get, refusing short input and trailing bytes.
func decodeExact[T any](msg string, size int, b []byte, get func([]byte) T) (T, error) {
	if err := exact(msg, size, len(b)); err != nil {
		var zero T
		return zero, err
	}
	return get(b), nil
}

// grow extends b by n bytes, reallocating only when cap is short.
func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, 2*cap(b)+n)
	copy(nb, b)
	return nb
}
