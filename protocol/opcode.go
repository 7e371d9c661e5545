package protocol

import "fmt"

// Opcode is the Opcode byte of the LWIO common header (seed, "I/O Phase":
// LWIO_OPCODE_*). Values are the seed's.
type Opcode uint8

// LWIO opcodes (seed, list preceding FIG. 6A). The seed prints the interrupt
// request's opcode as REGISTER and the vectored write's as VEC_READ in places;
// those are typos and the values below are the ones that are used
// (docs/wire.md, "Seed typos and contradictions").
const (
	OpRead      Opcode = 0x0 // LWIO_OPCODE_READ, FIG. 14A/14C
	OpWrite     Opcode = 0x1 // LWIO_OPCODE_WRITE, FIG. 15A/15C
	OpVecRead   Opcode = 0x2 // LWIO_OPCODE_VEC_READ, FIG. 16A/16C
	OpVecWrite  Opcode = 0x3 // LWIO_OPCODE_VEC_WRITE, FIG. 17A-17C
	OpClose     Opcode = 0x4 // LWIO_OPCODE_CLOSE, FIG. 12A
	OpCancel    Opcode = 0x5 // LWIO_OPCODE_CANCEL, FIG. 13A
	OpAuth      Opcode = 0x6 // LWIO_OPCODE_AUTH, FIG. 6A
	OpRegister  Opcode = 0x7 // LWIO_OPCODE_REGISTER, FIG. 7A
	OpCredit    Opcode = 0x8 // LWIO_OPCODE_CREDIT, FIG. 11B
	OpInterrupt Opcode = 0x9 // LWIO_OPCODE_INTERRUPT, FIG. 9A
	// OpFragment continues a fragmented WRITE or VEC_WRITE (not in the
	// seed: our equivalent of SMB Direct's data transfer message
	// sequences, seed 004; docs/wire.md, "Fragmented writes").
	OpFragment Opcode = 0xA

	// NumOpcodes is one more than the highest opcode.
	NumOpcodes = 11
)

var opcodeNames = [NumOpcodes]string{
	OpRead:      "READ",
	OpWrite:     "WRITE",
	OpVecRead:   "VEC_READ",
	OpVecWrite:  "VEC_WRITE",
	OpClose:     "CLOSE",
	OpCancel:    "CANCEL",
	OpAuth:      "AUTH",
	OpRegister:  "REGISTER",
	OpCredit:    "CREDIT",
	OpInterrupt: "INTERRUPT",
	OpFragment:  "FRAGMENT",
}

// String returns the opcode's seed name without the LWIO_OPCODE_ prefix,
// e.g. "VEC_READ", or "OPCODE(0x..)" for an unknown value.
func (o Opcode) String() string {
	if int(o) < len(opcodeNames) {
		return opcodeNames[o]
	}
	return fmt.Sprintf("OPCODE(0x%02x)", uint8(o))
}

// Valid reports whether o is one of the ten LWIO opcodes or FRAGMENT.
func (o Opcode) Valid() bool { return int(o) < NumOpcodes }

// IsIO reports whether o moves file data: READ, WRITE, VEC_READ or
// VEC_WRITE, the requests that carry Marker 0xFF and complete in the mode
// their Flags choose (FIG. 8); the others are control requests.
func (o Opcode) IsIO() bool { return o <= OpVecWrite }

// Header flags (seed: LWIO_HDR_FLAG_*).
const (
	// FlagInterrupt asks the server to complete the request with an RDMA
	// WRITE WITH IMMEDIATE (interrupt mode) rather than a plain RDMA WRITE
	// the client polls for (LWIO_HDR_FLAG_INTERRUPT).
	FlagInterrupt uint8 = 0x80
	// FlagControl marks a control request such as the interrupt request of
	// FIG. 9A (LWIO_HDR_FLAG_CONTROL).
	FlagControl uint8 = 0x40
	// FlagCollapse marks a collapsed vectored write: one page of data follows
	// the header and is written to every page of the range (FIG. 17B,
	// LWIO_HDR_FLAG_COLLAPSE_IO).
	FlagCollapse uint8 = 0x20
	// FlagFragmented marks the first message of a fragmented WRITE or
	// VEC_WRITE: Length counts the whole write, and the rest of the data
	// follows in FRAGMENT messages (docs/wire.md, "Fragmented writes";
	// not in the seed).
	FlagFragmented uint8 = 0x10
)

// MarkerIO is the Marker byte of READ and WRITE requests (FIG. 14A, 15A).
const MarkerIO uint8 = 0xFF
