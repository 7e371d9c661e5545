package protocol

// Completion says how the server completes an I/O request (FIG. 8): in
// interrupt (non-polling) mode the header carries FlagInterrupt and the
// client's ImmediateCookie and Cookie, and the server answers with a SEND of
// a StatusResponse or an RDMA WRITE WITH IMMEDIATE; in polling mode Flags
// has no FlagInterrupt and IosVa/IosMh name the client memory the server
// RDMA-writes an IOStatusBlock into. Both views share the header's last 12
// bytes, so a Completion is one of the two.
type Completion struct {
	// Polling selects polling mode (FIG. 14C, 15C, 16C, 17C).
	Polling bool
	// ImmediateCookie and Cookie are the interrupt-mode values.
	ImmediateCookie uint32
	Cookie          uint64
	// IosVa and IosMh are the polling-mode status block address and handle.
	IosVa uint64
	IosMh uint32
}

// InterruptMode returns the non-polling completion (FIG. 14A, 15A, 16A,
// 17A/17B).
func InterruptMode(immediateCookie uint32, cookie uint64) Completion {
	return Completion{ImmediateCookie: immediateCookie, Cookie: cookie}
}

// PollingMode returns the polling completion (FIG. 14C, 15C, 16C, 17C).
func PollingMode(iosVa uint64, iosMh uint32) Completion {
	return Completion{Polling: true, IosVa: iosVa, IosMh: iosMh}
}

// apply sets the Flags bit and the IosMh/IosVa union of h.
func (c Completion) apply(h *Header) {
	if c.Polling {
		h.Flags &^= FlagInterrupt
		h.IosMh, h.IosVa = c.IosMh, c.IosVa
		return
	}
	h.Flags |= FlagInterrupt
	h.SetCookies(c.ImmediateCookie, c.Cookie)
}

// NewStatusResponse builds an LWIO_MSG_STATUS_RESPONSE (FIG. 6C, 7B, 9B,
// 12B, 13B, 14B, 15B, 16B, 17D): the request's Cookie, Information (bytes
// transferred, or the message's own meaning) and Status.
func NewStatusResponse(cookie uint64, information uint32, status Status) StatusResponse {
	return StatusResponse{Cookie: cookie, Ios: IOStatusBlock{Information: information, Status: status}}
}

// NewIOStatusBlock builds the LWIO_IO_STATUS_BLOCK the server RDMA-writes in
// polling mode (FIG. 14D, 15D, 16D, 17E).
func NewIOStatusBlock(information uint32, status Status) IOStatusBlock {
	return IOStatusBlock{Information: information, Status: status}
}
