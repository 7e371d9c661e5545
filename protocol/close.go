package protocol

// NewCloseRequest builds the close message (FIG. 12A): Opcode CLOSE, Flags
// INTERRUPT, Credits, Fid, Cookie. It is a header alone; Length is
// HeaderSize. The server answers with NewStatusResponse(cookie, 0,
// StatusSuccess) (FIG. 12B).
func NewCloseRequest(fid uint16, credits uint8, cookie uint64) Header {
	return Header{Length: HeaderSize, Opcode: OpClose, Flags: FlagInterrupt, Credits: credits, Fid: fid, IosVa: cookie}
}
