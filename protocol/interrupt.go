package protocol

// NewInterruptRequest builds the interrupt request (FIG. 9A): Opcode
// INTERRUPT (0x9; the seed's "LWIO_OPCODE_REGISTER (0x9)" is a typo),
// Flags INTERRUPT|CONTROL (0xC0), Credits, Cookie. It is a header alone;
// Length is HeaderSize. The server answers after another request completes,
// with NewStatusResponse(cookie, 0, status) (FIG. 9B).
func NewInterruptRequest(credits uint8, cookie uint64) Header {
	return Header{Length: HeaderSize, Opcode: OpInterrupt, Flags: FlagInterrupt | FlagControl, Credits: credits, IosVa: cookie}
}
