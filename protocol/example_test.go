package protocol_test

import (
	"fmt"

	"github.com/lwiofs/lwiofs/protocol"
)

// A client encodes a READ header (FIG. 14A) straight into a send buffer.
func ExampleNewReadRequest() {
	sendBuf := make([]byte, protocol.HeaderSize) // registered memory in an engine
	h := protocol.NewReadRequest(3, 8192, 4096, 0x7f0000001000, 0x1234, 1, protocol.InterruptMode(7, 42))
	h.Put(sendBuf)
	fmt.Printf("% x\n", sendBuf[:8])
	// Output: 00 10 00 00 00 80 01 ff
}

// A WRITE's header and data can come from two buffers (scatter/gather); the
// server's decoded Data aliases its receive buffer.
func ExampleDecodeRequest() {
	w := protocol.NewWriteRequest(3, 0, []byte("payload"), 1, protocol.PollingMode(0x7f0000002000, 0x99))
	hdr := make([]byte, protocol.HeaderSize)
	w.Header.Put(hdr)
	recv := append(hdr, w.Data...) // what the server's receive buffer holds

	r, err := protocol.DecodeRequest(recv)
	if err != nil {
		fmt.Println("drop the connection:", err)
		return
	}
	fmt.Println(r.Header.Opcode, r.Header.Length, string(r.Data), &r.Data[0] == &recv[protocol.HeaderSize])

	_, err = protocol.DecodeRequest(recv[:len(recv)-1])
	fmt.Println(err, protocol.IsProtocolError(err))
	// Output:
	// WRITE 7 payload true
	// lwio: malformed WRITE: Length: 7, but 6 data bytes follow the header true
}

// Both ends sign their AUTH parameters with the session key.
func ExampleAuthParams_Sign() {
	sessionKey := []byte("NTLM session key")
	p := protocol.AuthParams{RevID: protocol.RevID, Endian: protocol.AuthEndian, HeaderSize: protocol.HeaderSize, HasKey: true}
	p.Sign(sessionKey)
	wire := p.Append(nil)

	got, _ := protocol.DecodeAuthParams(wire)
	fmt.Println(got.Verify(sessionKey), got.Verify([]byte("guess")))
	// Output: true false
}
