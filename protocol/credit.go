package protocol

// DeltaCreditCookie is the Cookie of a server delta-credit message (FIG.
// 11A). A client must not use it as the cookie of a request, so that a
// StatusResponse with Status NotifyCredit and this cookie is always a delta
// credit and never the completion of a CREDIT request (FIG. 11C).
const DeltaCreditCookie = 0

// NewCreditRequest builds the client's LWIO_OPCODE_CREDIT message (FIG.
// 11B): Opcode CREDIT, Flags INTERRUPT, Credits = pending requests, Cookie,
// and the upper 32 bits of Offset = count: after a positive delta the number
// of granted credits the client did not use (usually 0); after a delta of
// -N, one message each with -N, -(N-1), ..., -1. It is a header alone;
// Length is HeaderSize.
func NewCreditRequest(count int32, credits uint8, cookie uint64) Header {
	return Header{
		Length:  HeaderSize,
		Opcode:  OpCredit,
		Flags:   FlagInterrupt,
		Credits: credits,
		Offset:  uint64(uint32(count)) << 32,
		IosVa:   cookie,
	}
}

// CreditCount is the signed count in the upper 32 bits of Offset of a
// CREDIT request (FIG. 11B).
func (h *Header) CreditCount() int32 { return int32(h.Offset >> 32) }

// NewDeltaCredit builds the server's delta-credit message (FIG. 11A), a
// status response with Cookie 0, Information = delta as a two's-complement
// u32 (positive: credits granted; negative: credits to give up) and Status
// NotifyCredit. It is always sent, never RDMA-written.
func NewDeltaCredit(delta int32) StatusResponse {
	return StatusResponse{Cookie: DeltaCreditCookie, Ios: IOStatusBlock{Information: uint32(delta), Status: NotifyCredit}}
}

// IsDeltaCredit reports whether r is a server delta-credit message (FIG.
// 11A) rather than the completion of a request.
func (r *StatusResponse) IsDeltaCredit() bool {
	return r.Cookie == DeltaCreditCookie && r.Ios.Status == NotifyCredit
}

// CreditDelta is the signed Information of a delta-credit message.
func (r *StatusResponse) CreditDelta() int32 { return int32(r.Ios.Information) }

// NewCreditCompletion builds the server's answer to a CREDIT request (FIG.
// 11C): Cookie echoed, Information 0, Status success when the request's
// count was >= 0 and NotifyCredit when it was negative, which lets the client
// retire the credit.
func NewCreditCompletion(cookie uint64, count int32) StatusResponse {
	s := StatusSuccess
	if count < 0 {
		s = NotifyCredit
	}
	return StatusResponse{Cookie: cookie, Ios: IOStatusBlock{Status: s}}
}
