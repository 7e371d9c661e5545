package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/lwiofs/lwiofs/internal/enum"
)

// The wire framing of a softrdma connection (see docs/transport.md).
//
// After the TCP connection is made each side sends a hello (helloSize
// bytes) and reads the peer's (then, when both set helloLocal, the
// same-host step of local.go may move the stream to a unix socket). From
// then on the stream carries frames, each a frameHeaderSize header followed
// by Length payload bytes:
//
//	0  Type   u8   frameSend | frameWrite | frameAck | frameNak
//	1  Flags  u8   flagImm: Imm is valid
//	2  Status u8   frameNak: the transport.Status the initiator reports
//	3  -      u8   zero
//	4  Ack    u32  cumulative count of the peer's requests placed here
//	8  Length u32  payload bytes that follow the header
//	12 Imm    u32  immediate data
//	16 RKey   u32  frameWrite: the target region's handle
//	20 Wire   u32  flagShm: payload bytes on the wire; else zero
//	24 Addr   u64  frameWrite: the target address
//
// Requests (frameSend, frameWrite) are numbered implicitly 0, 1, 2… in
// each direction. Every frame carries Ack, so acknowledgements ride on
// traffic going the other way; a frameAck carries only that. A frameNak
// says request number Ack failed at the responder with Status; the
// connection is then in error on both sides.
//
// flagShm (shared memory, shm.go) changes what follows the header: a
// frameWrite from the listener says it copied Length bytes into the
// dialer's region itself (Wire is 0, nothing follows); a frameSend from the
// dialer carries Wire bytes of entries (shmEntrySize each, inline bytes
// after an inline one) that make up its Length bytes.
const (
	frameHeaderSize = 32
	helloSize       = 24
)

type frameType uint8

const (
	frameSend frameType = iota + 1
	frameWrite
	frameAck
	frameNak
)

var frameTypeNames = [...]string{frameSend: "SEND", frameWrite: "WRITE", frameAck: "ACK", frameNak: "NAK"}

func (t frameType) String() string { return enum.Name(frameTypeNames[:], t, "frameType") }

const (
	flagImm = 1 << 0
	flagShm = 1 << 1
)

type frameHeader struct {
	Type   frameType
	Flags  uint8
	Status uint8
	Ack    uint32
	Length uint32
	Imm    uint32
	RKey   uint32
	Addr   uint64
	Wire   uint32 // flagShm: the payload's size on the wire
	seq    uint64 // a sealed frame's number (its nonce); 0: in clear
}

func (h *frameHeader) encode(b []byte) {
	_ = b[frameHeaderSize-1]
	b[0] = byte(h.Type)
	b[1] = h.Flags
	b[2] = h.Status
	b[3] = 0
	binary.LittleEndian.PutUint32(b[4:], h.Ack)
	binary.LittleEndian.PutUint32(b[8:], h.Length)
	binary.LittleEndian.PutUint32(b[12:], h.Imm)
	binary.LittleEndian.PutUint32(b[16:], h.RKey)
	binary.LittleEndian.PutUint32(b[20:], h.Wire)
	binary.LittleEndian.PutUint64(b[24:], h.Addr)
}

var errBadFrame = errors.New("softrdma: malformed frame")

func (h *frameHeader) decode(b []byte) error {
	if len(b) < frameHeaderSize {
		return errBadFrame
	}
	h.Type = frameType(b[0])
	h.Flags = b[1]
	h.Status = b[2]
	h.Ack = binary.LittleEndian.Uint32(b[4:])
	h.Length = binary.LittleEndian.Uint32(b[8:])
	h.Imm = binary.LittleEndian.Uint32(b[12:])
	h.RKey = binary.LittleEndian.Uint32(b[16:])
	h.Addr = binary.LittleEndian.Uint64(b[24:])
	h.Wire = binary.LittleEndian.Uint32(b[20:])
	if h.Type < frameSend || h.Type > frameNak || h.Flags&^(flagImm|flagShm) != 0 || b[3] != 0 {
		return errBadFrame
	}
	if h.Flags&flagShm == 0 && h.Wire != 0 ||
		h.Flags&flagShm != 0 && (h.Type == frameWrite && h.Wire != 0 || h.Type == frameSend && h.Wire == 0 ||
			h.Type != frameSend && h.Type != frameWrite) {
		return errBadFrame
	}
	if (h.Type == frameAck || h.Type == frameNak) && h.Length != 0 {
		return errBadFrame
	}
	return nil
}

// hello is the connection preamble:
//
//	0  Magic          [4]byte "SRDM"
//	4  Version        u16     1
//	6  Flags          u16     helloLocal: offers (listener) or asks for (dialer) the same-host path (local.go); helloShm: shared memory too (shm.go); helloPipe: pipes (local_pipe.go); helloLend: takes lent SENDs (listener, shmlend.go)
//	8  RNRTimeout     u32     microseconds the sender lets a SEND wait for a receive
//	12 MaxMessageSize u32     largest request payload the sender accepts
//	16 -              u64     zero
type hello struct {
	RNRTimeout     time.Duration
	MaxMessageSize uint32
	Flags          uint16
}

// helloLocal in a listener's hello offers the same-host path, in a
// dialer's asks for it; a peer older than it sends zero and ignores it.
// helloShm, with it, offers (listener) or asks for (dialer) the
// shared-memory step after the move to the unix socket (shm.go).
// helloLend, with helloShm, in a listener's hello says it takes lent
// SENDs (shmlend.go): a dialer lends only to such a listener, so a new
// mount does not send an older server entries it would refuse.
const (
	helloLocal = 1 << 0
	helloShm   = 1 << 1
	helloLend  = 1 << 3
)

const helloVersion = 1

var helloMagic = [4]byte{'S', 'R', 'D', 'M'}

func (h *hello) encode(b []byte) {
	_ = b[helloSize-1]
	copy(b, helloMagic[:])
	binary.LittleEndian.PutUint16(b[4:], helloVersion)
	binary.LittleEndian.PutUint16(b[6:], h.Flags)
	us := h.RNRTimeout / time.Microsecond
	if us > 1<<32-1 {
		us = 1<<32 - 1
	}
	binary.LittleEndian.PutUint32(b[8:], uint32(us))
	binary.LittleEndian.PutUint32(b[12:], h.MaxMessageSize)
	binary.LittleEndian.PutUint64(b[16:], 0)
}

func (h *hello) decode(b []byte) error {
	if len(b) != helloSize {
		return fmt.Errorf("softrdma: hello is %d bytes, want %d", len(b), helloSize)
	}
	if [4]byte(b[:4]) != helloMagic {
		return fmt.Errorf("softrdma: peer is not a softrdma endpoint (magic %q)", b[:4])
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != helloVersion {
		return fmt.Errorf("softrdma: peer speaks version %d, want %d", v, helloVersion)
	}
	h.RNRTimeout = time.Duration(binary.LittleEndian.Uint32(b[8:])) * time.Microsecond
	h.MaxMessageSize = binary.LittleEndian.Uint32(b[12:])
	h.Flags = binary.LittleEndian.Uint16(b[6:])
	if h.MaxMessageSize == 0 {
		return errors.New("softrdma: peer announces a zero MaxMessageSize")
	}
	return nil
}
