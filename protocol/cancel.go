package protocol

// NewCancelRequest builds the cancel message (FIG. 13A): Opcode CANCEL,
// Flags INTERRUPT, Credits, Fid, Cookie. It is a header alone; Length is
// HeaderSize. The server answers with NewStatusResponse(cookie, 0,
// StatusSuccess) (FIG. 13B).
func NewCancelRequest(fid uint16, credits uint8, cookie uint64) Header {
	return Header{Length: HeaderSize, Opcode: OpCancel, Flags: FlagInterrupt, Credits: credits, Fid: fid, IosVa: cookie}
}
