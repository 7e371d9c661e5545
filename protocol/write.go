package protocol

// WriteRequest is a write message: the common header immediately followed by
// the data (WRITE, FIG. 15A/15C; VEC_WRITE, FIG. 17A-17C). An engine that
// wants scatter/gather puts Header into one buffer (Header.Put) and sends
// Data from another as a second segment of the same SEND.
type WriteRequest struct {
	Header Header
	// Data is the bytes that follow the header: Length bytes, or for a
	// collapsed vectored write the one page that stands for every page.
	Data []byte
}

// WriteToEndOfFile as a WRITE's Offset asks the server to write the data
// at the end of the file as it is at the moment of the write, atomically
// with every other writer — an O_APPEND write. It is MS-FSA's
// FILE_WRITE_TO_END_OF_FILE (ByteOffset 0xFFFFFFFFFFFFFFFF, [MS-FSA]
// 2.1.5.4), this project's choice for LWIO, which the seed leaves open; the
// session channel's WRITE takes it too. Only WRITE may carry it.
const WriteToEndOfFile uint64 = 0xFFFFFFFFFFFFFFFF

// NewWriteRequest builds the write message (FIG. 15A interrupt mode, FIG.
// 15C polling mode): Length = len(data), Opcode WRITE, Offset, Flags per c,
// Marker 0xFF, Credits, Fid, c's cookies or status block address, and data
// after the header. Data is not copied.
func NewWriteRequest(fid uint16, offset uint64, data []byte, credits uint8, c Completion) WriteRequest {
	h := Header{
		Length:  uint32(len(data)),
		Opcode:  OpWrite,
		Credits: credits,
		Marker:  MarkerIO,
		Fid:     fid,
		Offset:  offset,
	}
	c.apply(&h)
	return WriteRequest{Header: h, Data: data}
}

// NewVecWriteRequest builds the non-collapsed vectored write (FIG. 17A, or
// its polling form): as NewWriteRequest with Opcode VEC_WRITE (0x3; the
// seed's "LWIO_OPCODE_WRITE (0x3)" is a typo), plus NumPages = the pages
// data spans and PageSize = the client's page size. The data was gathered
// from those pages; on the wire it is contiguous.
func NewVecWriteRequest(fid uint16, offset uint64, data []byte, pageSize uint16, credits uint8, c Completion) WriteRequest {
	r := NewWriteRequest(fid, offset, data, credits, c)
	r.Header.Opcode = OpVecWrite
	r.Header.SetVec(uint16(PagesSpanned(uint32(len(data)), pageSize)), pageSize)
	return r
}

// NewCollapsedVecWriteRequest builds the collapsed vectored write (FIG. 17B
// interrupt mode, FIG. 17C polling mode): every page of the length-byte range
// holds the same data, so only page is sent. Flags has FlagCollapse,
// PageSize = len(page), NumPages = the pages length spans (the last may be
// partial), and the data after the header is page[:min(length, len(page))].
// The file must have been registered with FileNoIntermediateBuffering, and
// len(page) must fit PageSize's u16 (at most 65535 bytes).
func NewCollapsedVecWriteRequest(fid uint16, offset uint64, length uint32, page []byte, credits uint8, c Completion) WriteRequest {
	ps := uint16(len(page))
	h := Header{
		Length:  length,
		Opcode:  OpVecWrite,
		Flags:   FlagCollapse,
		Credits: credits,
		Marker:  MarkerIO,
		Fid:     fid,
		Offset:  offset,
	}
	h.SetVec(uint16(PagesSpanned(length, ps)), ps)
	c.apply(&h)
	if uint32(len(page)) > length {
		page = page[:length]
	}
	return WriteRequest{Header: h, Data: page}
}

// Fragment makes the first fragment of r, a WRITE or non-collapsed
// VEC_WRITE too long for one of the receiver's buffers: the header with
// FlagFragmented (Length still the whole write) and the first first bytes
// of the data; the rest goes in FRAGMENT messages (NewFragmentHeader).
func (r *WriteRequest) Fragment(first int) WriteRequest {
	f := *r
	f.Header.Flags |= FlagFragmented
	f.Data = r.Data[:first]
	return f
}

// Fragmented reports whether r is the first fragment of a write.
func (r *WriteRequest) Fragmented() bool { return r.Header.Flags&FlagFragmented != 0 }

// NewFragmentHeader is the header of a FRAGMENT that carries n more bytes
// of the fragmented write whose first header is first, at file offset
// offset (docs/wire.md, "Fragmented writes"): Opcode FRAGMENT, Length n,
// Marker 0xFF, the write's Fid, its INTERRUPT flag and the same completion
// fields (ImmediateCookie and Cookie, or IosMh and IosVa), so that the
// receiver can tell it belongs to that write. The data follows the header.
func NewFragmentHeader(first *Header, offset uint64, n uint32, credits uint8) Header {
	return Header{
		Length:  n,
		Opcode:  OpFragment,
		Flags:   first.Flags & FlagInterrupt,
		Credits: credits,
		Marker:  MarkerIO,
		Fid:     first.Fid,
		Offset:  offset,
		IosMh:   first.IosMh,
		IosVa:   first.IosVa,
	}
}

// Continues reports whether h, a FRAGMENT, continues the write whose first
// header is first and of which done bytes have arrived: same Fid, mode and
// completion fields, and the Offset where the data so far ends.
func (h *Header) Continues(first *Header, done uint32) bool {
	return h.Opcode == OpFragment && h.Fid == first.Fid && h.Flags == first.Flags&FlagInterrupt &&
		h.IosMh == first.IosMh && h.IosVa == first.IosVa && h.Offset == first.Offset+uint64(done)
}

// Collapsed reports whether r is a collapsed vectored write.
func (r *WriteRequest) Collapsed() bool { return r.Header.Flags&FlagCollapse != 0 }

// Size returns the encoded size.
func (r *WriteRequest) Size() int { return HeaderSize + len(r.Data) }

// Append appends the header and the data to b.
func (r *WriteRequest) Append(b []byte) []byte {
	b = r.Header.Append(b)
	return append(b, r.Data...)
}

// collapsedDataLen is the number of data bytes a collapsed write carries.
func collapsedDataLen(h *Header) uint32 {
	return min(h.Length, uint32(h.PageSize()))
}

// checkCollapsed validates a collapsed VEC_WRITE (FIG. 17B): a page size,
// NumPages spanning Length, and one page (or Length, if less) of data.
func checkCollapsed(h *Header, data int) error {
	const msg = "VEC_WRITE"
	ps := h.PageSize()
	if ps == 0 {
		return fieldErr(msg, "PageSize", "0 in a collapsed write")
	}
	if want := PagesSpanned(h.Length, ps); uint32(h.NumPages()) != want {
		return fieldErr(msg, "NumPages", "%d for Length %d with PageSize %d, want %d", h.NumPages(), h.Length, ps, want)
	}
	if want := collapsedDataLen(h); uint32(data) != want {
		return fieldErr(msg, "Length", "collapsed write of %d bytes with PageSize %d carries %d data bytes, want %d", h.Length, ps, data, want)
	}
	return nil
}
