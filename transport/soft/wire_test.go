package soft

import (
	"bytes"
	"encoding/hex"
	"testing"
	"time"
)

// golden checks that v encodes to the hex string want (size bytes) and that
// those bytes decode to v again; it returns them.
func golden[T comparable, P interface {
	*T
	encode([]byte)
	decode([]byte) error
}](t *testing.T, v T, size int, want string) []byte {
	t.Helper()
	b := make([]byte, size)
	P(&v).encode(b)
	if got := hex.EncodeToString(b); got != want {
		t.Fatalf("encode:\n got %s\nwant %s", got, want)
	}
	var d T
	if err := P(&d).decode(b); err != nil || d != v {
		t.Fatalf("decode = %+v, %v; want %+v", d, err, v)
	}
	return b
}

func TestFrameHeaderGolden(t *testing.T) {
	h := frameHeader{Type: frameWrite, Flags: flagImm, Ack: 0x04030201, Length: 0x00100000,
		Imm: 0xdeadbeef, RKey: 0x11223344, Addr: 0x00007f0012345000}
	// Written by hand from the layout in wire.go.
	const want = "02" + "01" + "00" + "00" + "01020304" + "00001000" + "efbeadde" + "44332211" + "00000000" + "00503412007f0000"
	golden(t, h, frameHeaderSize, want)
}

func TestFrameHeaderShmGolden(t *testing.T) {
	h := frameHeader{Type: frameSend, Flags: flagShm, Ack: 1, Length: 0x00100000, Wire: 0x30}
	const want = "01" + "02" + "00" + "00" + "01000000" + "00001000" + "00000000" + "00000000" + "30000000" + "0000000000000000"
	golden(t, h, frameHeaderSize, want)
}

func TestFrameHeaderRejects(t *testing.T) {
	good := make([]byte, frameHeaderSize)
	(&frameHeader{Type: frameSend, Length: 5}).encode(good)
	for name, mutate := range map[string]func(b []byte){
		"type zero":         func(b []byte) { b[0] = 0 },
		"type unknown":      func(b []byte) { b[0] = 9 },
		"unknown flag":      func(b []byte) { b[1] = 4 },
		"shm SEND, no wire": func(b []byte) { b[1] = flagShm },
		"shm WRITE, wire":   func(b []byte) { b[0], b[1], b[20] = byte(frameWrite), flagShm, 1 },
		"shm ACK":           func(b []byte) { b[0], b[1], b[8] = byte(frameAck), flagShm, 0 },
		"reserved byte":     func(b []byte) { b[3] = 1 },
		"reserved word":     func(b []byte) { b[20] = 1 },
		"ACK with payload":  func(b []byte) { b[0] = byte(frameAck) },
		"NAK with payload":  func(b []byte) { b[0] = byte(frameNak) },
	} {
		b := bytes.Clone(good)
		mutate(b)
		var h frameHeader
		if err := h.decode(b); err == nil {
			t.Errorf("%s: decoded %+v", name, h)
		}
	}
	var h frameHeader
	if err := h.decode(good[:frameHeaderSize-1]); err == nil {
		t.Error("short header decoded")
	}
}

func TestHelloGolden(t *testing.T) {
	h := hello{RNRTimeout: 2 * time.Second, MaxMessageSize: 16 << 20}
	const want = "5352444d" + "0100" + "0000" + "80841e00" + "00000001" + "0000000000000000"
	b := golden(t, h, helloSize, want)
	var d hello
	for name, mutate := range map[string]func(b []byte){
		"magic":   func(b []byte) { b[0] = 'X' },
		"version": func(b []byte) { b[4] = 2 },
		"max 0":   func(b []byte) { copy(b[12:16], []byte{0, 0, 0, 0}) },
	} {
		c := bytes.Clone(b)
		mutate(c)
		if err := d.decode(c); err == nil {
			t.Errorf("%s: hello decoded", name)
		}
	}
}

func FuzzFrameHeader(f *testing.F) {
	for _, h := range []frameHeader{
		{Type: frameSend, Length: 64, Ack: 3},
		{Type: frameWrite, Flags: flagImm, Length: 1 << 20, Imm: 7, RKey: 0xabcdef01, Addr: 0x7f0000001000},
		{Type: frameAck, Ack: 0xffffffff},
		{Type: frameNak, Status: 3, Ack: 9},
	} {
		b := make([]byte, frameHeaderSize)
		h.encode(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h frameHeader
		if h.decode(b) != nil {
			return
		}
		e := make([]byte, frameHeaderSize)
		h.encode(e)
		var h2 frameHeader
		if err := h2.decode(e); err != nil || h2 != h {
			t.Fatalf("round trip: %+v -> %+v, %v", h, h2, err)
		}
		if !bytes.Equal(e, b[:frameHeaderSize]) {
			t.Fatalf("re-encoding differs: %x vs %x", e, b[:frameHeaderSize])
		}
	})
}
