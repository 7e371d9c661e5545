package protocol

import "testing"

// TestDecodersNeverPanic runs every decoder over every truncation of every
// valid message (within its first 400 bytes, and less its last byte) and
// over each single-byte change to 0x00, 0x7f, 0x80 and 0xff: a deterministic
// complement to the Fuzz targets, run on every `go test`.
func TestDecodersNeverPanic(t *testing.T) {
	var inputs [][]byte
	for _, c := range requestCases() {
		inputs = append(inputs, c.enc)
	}
	nq := NewNegotiateRequest("client", testKey(), fuzzProviders())
	ns := NewNegotiateResponse("server", testKey(), fuzzProviders())
	rk := ResumeKeyResponse{Key: MakeResumeKey(1, 2, 3), Context: `\\h\s`}
	ap := testAuthParams()
	fp := testFidParams()
	inputs = append(inputs, must(nq.Append(nil)), must(ns.Append(nil)), must(rk.Append(nil)), ap.Append(nil), fp.Append(nil),
		appendOf(NewDeltaCredit(-1)), appendOf(RDMARegion{1, 2, 3}), appendOf(IOStatusBlock{1, 2}))

	decoders := []func([]byte) error{
		func(b []byte) error { _, err := DecodeRequest(b); return err },
		func(b []byte) error { _, err := DecodeHeader(b); return err },
		func(b []byte) error { _, err := DecodeStatusResponse(b); return err },
		func(b []byte) error { _, err := DecodeIOStatusBlock(b); return err },
		func(b []byte) error { _, err := DecodeRDMARegion(b); return err },
		func(b []byte) error { _, err := DecodeAuthParams(b); return err },
		func(b []byte) error { _, _, err := DecodeAuthParamsPrefix(b); return err },
		func(b []byte) error { _, err := DecodeFidParams(b); return err },
		func(b []byte) error { _, err := DecodeResumeKeyResponse(b); return err },
		func(b []byte) error { _, err := DecodeNegotiateRequest(b); return err },
		func(b []byte) error { _, err := DecodeNegotiateResponse(b); return err },
		func(b []byte) error { _, err := PeekControlHeader(b); return err },
	}
	run := func(b []byte) {
		for _, d := range decoders {
			if err := d(b); err != nil && !IsProtocolError(err) {
				t.Fatalf("decode error %v is not a protocol error", err)
			}
		}
	}
	for _, in := range inputs {
		for n := 0; n <= len(in) && n < 400; n++ {
			run(in[:n])
		}
		run(in[:len(in)-1])
		// Single-byte changes over the first 300 bytes (headers, counts,
		// lengths); data past that is opaque to every decoder.
		for i := 0; i < len(in) && i < 300; i++ {
			for _, v := range []byte{0x00, 0x7f, 0x80, 0xff} {
				run(edit(in, setByte(i, v)))
			}
		}
	}
}
