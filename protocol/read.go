package protocol

import "encoding/binary"

// NewReadRequest builds the read message (FIG. 14A interrupt mode, FIG. 14C
// polling mode): Length = bytes to read, Opcode READ, Offset, Marker 0xFF,
// Flags INTERRUPT or 0 per c, Credits, Fid, DataVa/DataMh = where the server
// RDMA-writes the data, and c's cookies or status block address. It is a
// header alone. The server answers with the data and then a StatusResponse
// or IOStatusBlock whose Information is the bytes read (FIG. 14B, 14D).
func NewReadRequest(fid uint16, offset uint64, length uint32, dataVa uint64, dataMh uint32, credits uint8, c Completion) Header {
	h := Header{
		Length:  length,
		Opcode:  OpRead,
		Credits: credits,
		Marker:  MarkerIO,
		Fid:     fid,
		Offset:  offset,
		DataVa:  dataVa,
		DataMh:  dataMh,
	}
	c.apply(&h)
	return h
}

// PagesSpanned returns how many pages of pageSize bytes length bytes span:
// the NumPages of a vectored request (FIG. 16A, 17B). It is 0 when pageSize
// is 0.
func PagesSpanned(length uint32, pageSize uint16) uint32 {
	if pageSize == 0 {
		return 0
	}
	return uint32((uint64(length) + uint64(pageSize) - 1) / uint64(pageSize))
}

// VecReadRequest is the vectored read message (FIG. 16A, 16C): the common
// header followed by NumPages LWIO_RDMA_REGIONs, the i-th receiving bytes
// [i*PageSize, (i+1)*PageSize) of the read.
type VecReadRequest struct {
	Header  Header
	Regions []RDMARegion
}

// NewVecReadRequest builds FIG. 16A/16C: Length = bytes to read, Opcode
// VEC_READ, Offset, Flags per c, Marker 0xFF, Credits, Fid, NumPages =
// len(regions), PageSize = the client's page size, and c's cookies or status
// block address. The regions must cover Length: every one but the last
// PageSize bytes long, the last a multiple of SectorSize (DecodeRequest
// checks it; the constructor does not).
func NewVecReadRequest(fid uint16, offset uint64, length uint32, pageSize uint16, regions []RDMARegion, credits uint8, c Completion) VecReadRequest {
	h := Header{
		Length:  length,
		Opcode:  OpVecRead,
		Credits: credits,
		Marker:  MarkerIO,
		Fid:     fid,
		Offset:  offset,
	}
	h.SetVec(uint16(len(regions)), pageSize)
	c.apply(&h)
	return VecReadRequest{Header: h, Regions: regions}
}

// Size returns the encoded size.
func (r *VecReadRequest) Size() int { return HeaderSize + RDMARegionSize*len(r.Regions) }

// Put writes the message into b[:Size()] without allocating. It panics if b
// is shorter.
func (r *VecReadRequest) Put(b []byte) {
	_ = b[r.Size()-1]
	r.Header.Put(b)
	off := HeaderSize
	for i := range r.Regions {
		r.Regions[i].Put(b[off:])
		off += RDMARegionSize
	}
}

// Append appends the encoded message to b.
func (r *VecReadRequest) Append(b []byte) []byte { return appendPut(b, r.Size(), r.Put) }

// RegionList is a decoded vectored read's LWIO_RDMA_REGION array in wire
// form. It aliases the buffer it was decoded from: read it before that
// buffer is reused. Decoding it this way costs no allocation.
type RegionList []byte

// Len returns the number of regions.
func (l RegionList) Len() int { return len(l) / RDMARegionSize }

// At returns region i. It panics if i is out of range.
func (l RegionList) At(i int) RDMARegion { return getRegion(l[i*RDMARegionSize:]) }

// AppendTo appends every region to dst.
func (l RegionList) AppendTo(dst []RDMARegion) []RDMARegion {
	for i := 0; i < l.Len(); i++ {
		dst = append(dst, l.At(i))
	}
	return dst
}

// checkVecRead validates a VEC_READ's region list against its header
// (FIG. 16A: "a sufficient number of LWIO_RDMA_REGION segments to cover the
// length of the request. All intermediate segments must be one page in
// size. The final segment may be smaller than a page, but it must be a
// multiple of the backend disk sector size.") NumPages must be the least
// that covers Length, so a list cannot name pages the read never fills.
func checkVecRead(h *Header, regions []byte) error {
	const msg = "VEC_READ"
	n, ps := int(h.NumPages()), uint32(h.PageSize())
	if len(regions) != n*RDMARegionSize {
		return fieldErr(msg, "NumPages", "%d regions need %d bytes after the header, have %d", n, n*RDMARegionSize, len(regions))
	}
	if n == 0 && h.Length == 0 {
		return nil
	}
	if ps == 0 || ps%SectorSize != 0 {
		return fieldErr(msg, "PageSize", "%d is not a non-zero multiple of %d", ps, SectorSize)
	}
	if want := PagesSpanned(h.Length, uint16(ps)); uint32(n) != want {
		return fieldErr(msg, "NumPages", "%d regions for Length %d with PageSize %d, want %d", n, h.Length, ps, want)
	}
	for i := 0; i < n-1; i++ {
		if l := binary.LittleEndian.Uint32(regions[i*RDMARegionSize+12:]); l != ps {
			return fieldErr(msg, regionField(i), "%d, a non-final region must be PageSize %d", l, ps)
		}
	}
	last := binary.LittleEndian.Uint32(regions[(n-1)*RDMARegionSize+12:])
	switch {
	case last == 0 || last%SectorSize != 0:
		return fieldErr(msg, regionField(n-1), "%d, the final region must be a non-zero multiple of %d", last, SectorSize)
	case last > ps:
		return fieldErr(msg, regionField(n-1), "%d exceeds PageSize %d", last, ps)
	case uint64(n-1)*uint64(ps)+uint64(last) < uint64(h.Length):
		return fieldErr(msg, regionField(n-1), "%d, regions do not cover Length %d", last, h.Length)
	}
	return nil
}

func regionField(i int) string {
	return "Regions[" + itoa(i) + "].Length"
}

// itoa formats a small non-negative int without fmt.
func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var buf [20]byte
	p := len(buf)
	for i > 0 {
		p--
		buf[p] = byte('0' + i%10)
		i /= 10
	}
	return string(buf[p:])
}
