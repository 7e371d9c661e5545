package protocol

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/lwiofs/lwiofs/transport"
)

// Every decoder has a Fuzz target: decoding never panics, every error is a
// *FieldError, and what decodes re-encodes to something that decodes to the
// same value (and, where the encoding is canonical, to the same bytes).

func mustFieldErr(t *testing.T, err error) {
	t.Helper()
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("decode error %v (%T) is not a *FieldError", err, err)
	}
}

// roundTrip is the body of a canonical decoder's fuzz target: a decode
// error must be a *FieldError; what decodes re-encodes to the same bytes,
// which decode to the same value.
func roundTrip[T any](t *testing.T, b []byte, decode func([]byte) (T, error), encode func(T) ([]byte, error)) {
	t.Helper()
	v, err := decode(b)
	if err != nil {
		mustFieldErr(t, err)
		return
	}
	enc, err := encode(v)
	if err != nil || !bytes.Equal(enc, b) {
		t.Fatalf("re-encoding differs: %x vs %x (%v)", enc, b, err)
	}
	if v2, err := decode(enc); err != nil || !reflect.DeepEqual(v, v2) {
		t.Fatalf("unstable: %+v vs %+v (%v)", v, v2, err)
	}
}

// fuzzRoundTrip is a canonical decoder's fuzz target: seeded with seeds,
// with roundTrip as its body.
func fuzzRoundTrip[T any](f *testing.F, decode func([]byte) (T, error), encode func(T) ([]byte, error), seeds ...[]byte) {
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, decode, encode) })
}

// appender adapts an infallible Append method to roundTrip.
func appender[T any](app func(*T, []byte) []byte) func(T) ([]byte, error) {
	return func(v T) ([]byte, error) { return app(&v, nil), nil }
}

// appenderE adapts a fallible Append method to roundTrip.
func appenderE[T any](app func(*T, []byte) ([]byte, error)) func(T) ([]byte, error) {
	return func(v T) ([]byte, error) { return app(&v, nil) }
}

func FuzzDecodeRequest(f *testing.F) {
	for _, c := range requestCases() {
		f.Add(c.enc)
	}
	f.Add(headerBytes(NewCreditRequest(-1, 1, 1)))
	f.Add(appendOf(NewVecReadRequest(1, 0, 0, 512, nil, 0, PollingMode(0, 0))))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRequest(b)
		if err != nil {
			mustFieldErr(t, err)
			return
		}
		if r.Size() != len(b) {
			t.Fatalf("Size %d for %d bytes", r.Size(), len(b))
		}
		enc := r.Append(nil)
		r2, err := DecodeRequest(enc)
		if err != nil {
			t.Fatalf("re-encoded request does not decode: %v\n%x", err, enc)
		}
		if !reflect.DeepEqual(r, r2) {
			t.Fatalf("decode→encode→decode changed the request:\n%+v\n%+v", r, r2)
		}
		// Options may come in any order; every other encoding is canonical.
		if r.Header.Opcode != OpAuth && !bytes.Equal(enc, b) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", enc, b)
		}
	})
}

func FuzzDecodeHeader(f *testing.F) {
	for _, c := range requestCases() {
		f.Add(c.enc[:HeaderSize])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			mustFieldErr(t, err)
			return
		}
		enc := h.Append(nil)
		if !bytes.Equal(enc, b[:HeaderSize]) {
			t.Fatalf("re-encoding differs: %x vs %x", enc, b[:HeaderSize])
		}
		if h2, _ := DecodeHeader(enc); h2 != h {
			t.Fatal("unstable")
		}
	})
}

func FuzzDecodeStatusResponse(f *testing.F) {
	fuzzRoundTrip(f, DecodeStatusResponse, appender((*StatusResponse).Append),
		appendOf(NewDeltaCredit(-2)), appendOf(NewAuthResponse(1, &AuthParams{}, StatusAccessDenied)))
}

func FuzzDecodeIOStatusBlock(f *testing.F) {
	fuzzRoundTrip(f, DecodeIOStatusBlock, appender((*IOStatusBlock).Append), appendOf(NewIOStatusBlock(512, StatusEndOfFile)))
}

func FuzzDecodeRDMARegion(f *testing.F) {
	fuzzRoundTrip(f, DecodeRDMARegion, appender((*RDMARegion).Append), appendOf(RDMARegion{DataVa: 1, DataMh: 2, Length: 4096}))
}

func FuzzDecodeAuthParams(f *testing.F) {
	p := testAuthParams()
	f.Add(p.Append(nil))
	f.Add((&AuthParams{}).Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		pre, n, perr := DecodeAuthParamsPrefix(b)
		p, err := DecodeAuthParams(b)
		if perr == nil && n == len(b) && (err != nil || p != pre) {
			t.Fatalf("prefix and exact decode disagree: %v", err)
		}
		if err != nil {
			mustFieldErr(t, err)
			return
		}
		enc := p.Append(nil)
		if len(enc) != len(b) || p.Size() != len(b) {
			t.Fatalf("re-encoded %d bytes (Size %d) from %d", len(enc), p.Size(), len(b))
		}
		p2, err := DecodeAuthParams(enc)
		if err != nil || p2 != p {
			t.Fatalf("decode→encode→decode: %+v %v", p2, err)
		}
	})
}

func FuzzDecodeFidParams(f *testing.F) {
	fp := testFidParams()
	fuzzRoundTrip(f, DecodeFidParams, appender((*FidParams).Append), fp.Append(nil))
}

func FuzzDecodeResumeKeyResponse(f *testing.F) {
	r := ResumeKeyResponse{Key: MakeResumeKey(1, 2, 3), Context: `\\server\share𝄞`}
	fuzzRoundTrip(f, DecodeResumeKeyResponse, appenderE((*ResumeKeyResponse).Append), must(r.Append(nil)))
}

func fuzzProviders() []transport.ProviderInfo {
	return []transport.ProviderInfo{
		{Name: "softrdma", Instances: []transport.Instance{{HostAddress: []byte{10, 0, 0, 1}, Discriminator: []byte{0x12, 0x34}}, {}}},
		{Name: "verbs"},
	}
}

func FuzzDecodeNegotiateRequest(f *testing.F) {
	r := NewNegotiateRequest("client", testKey(), fuzzProviders())
	fuzzRoundTrip(f, DecodeNegotiateRequest, appenderE((*NegotiateRequest).Append), must(r.Append(nil)))
}

func FuzzDecodeNegotiateResponse(f *testing.F) {
	r := NewNegotiateResponse("server", testKey(), fuzzProviders())
	fuzzRoundTrip(f, DecodeNegotiateResponse, appenderE((*NegotiateResponse).Append), must(r.Append(nil)))
}

func FuzzPeekControlHeader(f *testing.F) {
	r := NewNegotiateRequest("client", testKey(), fuzzProviders())
	b, _ := r.Append(nil)
	f.Add(b[:ControlHeaderSize])
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := PeekControlHeader(b)
		if err != nil {
			mustFieldErr(t, err)
			return
		}
		enc := make([]byte, ControlHeaderSize)
		h.Put(enc)
		if !bytes.Equal(enc, b[:ControlHeaderSize]) {
			t.Fatalf("re-encoding differs: %x vs %x", enc, b[:ControlHeaderSize])
		}
	})
}
