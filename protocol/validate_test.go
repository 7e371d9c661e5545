package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/lwiofs/lwiofs/transport"
)

// edit returns a copy of b changed by f.
func edit(b []byte, f func(b []byte) []byte) []byte {
	return f(append([]byte{}, b...))
}

func put32(off int, v uint32) func([]byte) []byte {
	return func(b []byte) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b }
}

func put16(off int, v uint16) func([]byte) []byte {
	return func(b []byte) []byte { binary.LittleEndian.PutUint16(b[off:], v); return b }
}

func setByte(off int, v byte) func([]byte) []byte {
	return func(b []byte) []byte { b[off] = v; return b }
}

func cut(n int) func([]byte) []byte {
	return func(b []byte) []byte { return b[:len(b)-n] }
}

func extra(tail ...byte) func([]byte) []byte {
	return func(b []byte) []byte { return append(b, tail...) }
}

// wantFieldErr checks that err is a *FieldError of msg naming field.
func wantFieldErr(t *testing.T, name string, err error, msg, field string) {
	t.Helper()
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Errorf("%s: got %v, want a *FieldError for %s %s", name, err, msg, field)
		return
	}
	if fe.Msg != msg || fe.Field != field {
		t.Errorf("%s: got %s/%s (%v), want %s/%s", name, fe.Msg, fe.Field, err, msg, field)
	}
	if !IsProtocolError(err) || fe.Reason == "" || !strings.Contains(err.Error(), field) {
		t.Errorf("%s: error %q lacks scope or reason", name, err)
	}
	var st Status
	if errors.As(err, &st) {
		t.Errorf("%s: a malformed message must not be a per-request Status", name)
	}
}

// reject is a malformed message and the field its FieldError must name.
type reject struct {
	name  string
	b     []byte
	field string
}

// wantRejects checks that decode fails every case with a *FieldError of
// msg naming the case's field; what prefixes the case names.
func wantRejects[T any](t *testing.T, what string, decode func([]byte) (T, error), msg string, cases []reject) {
	t.Helper()
	for _, c := range cases {
		_, err := decode(c.b)
		wantFieldErr(t, strings.TrimSpace(what+" "+c.name), err, msg, c.field)
	}
}

func TestDecodeRequestRejects(t *testing.T) {
	read := headerBytes(NewReadRequest(1, 0, 4096, 1, 1, 1, InterruptMode(1, 1)))
	write := appendOf(NewWriteRequest(1, 0, []byte("0123456789"), 1, InterruptMode(1, 1)))
	vecw := appendOf(NewVecWriteRequest(1, 0, []byte("0123456789"), 4, 1, InterruptMode(1, 1)))
	coll := appendOf(NewCollapsedVecWriteRequest(1, 0, 10000, make([]byte, 4096), 1, InterruptMode(1, 1)))
	// 3 regions: 4096, 4096, 1024 for Length 9000.
	vecr := appendOf(NewVecReadRequest(1, 0, 9000, 4096, testRegions(3, 4096, 1024), 1, InterruptMode(1, 1)))
	lenOf := func(i int) int { return HeaderSize + i*RDMARegionSize + 12 }
	p := testAuthParams()
	auth := appendOf(NewAuthRequest(p, 1, 1, 1))
	opts := HeaderSize + AuthParamsFixedSize // first option
	reg := appendOf(NewRegisterRequest(testFidParams(), 1, 1))
	closeMsg := headerBytes(NewCloseRequest(1, 1, 1))
	w := NewWriteRequest(1, 0, []byte("0123456789"), 1, InterruptMode(1, 1))
	f := w.Fragment(4)
	fragFirst := appendOf(f)
	fh := NewFragmentHeader(&f.Header, 4, 6, 1)
	frag := (&WriteRequest{Header: fh, Data: []byte("456789")}).Append(nil)

	for _, c := range []struct {
		name       string
		b          []byte
		msg, field string
	}{
		{"short header", read[:HeaderSize-1], "HEADER", "Header"},
		{"empty", nil, "HEADER", "Header"},
		{"unknown opcode", edit(read, setByte(4, 0x0b)), "REQUEST", "Opcode"},
		{"opcode 0xfe", edit(read, setByte(4, 0xfe)), "REQUEST", "Opcode"},
		{"unknown flag", edit(read, setByte(5, 0x81)), "READ", "Flags"},
		{"collapse on WRITE", edit(write, setByte(5, 0xa0)), "WRITE", "Flags"},
		{"READ marker", edit(read, setByte(7, 0)), "READ", "Marker"},
		{"WRITE marker", edit(write, setByte(7, 0xfe)), "WRITE", "Marker"},
		{"READ trailing", edit(read, extra(1)), "READ", "Length"},
		{"WRITE Length long", edit(write, put32(0, 11)), "WRITE", "Length"},
		{"WRITE truncated data", edit(write, cut(1)), "WRITE", "Length"},
		{"WRITE huge Length", edit(write, put32(0, 0xffffffff)), "WRITE", "Length"},
		{"VEC_WRITE Length", edit(vecw, put32(0, 9)), "VEC_WRITE", "Length"},
		{"collapse NumPages", edit(coll, put16(32, 2)), "VEC_WRITE", "NumPages"},
		{"collapse PageSize 0", edit(coll, put16(34, 0)), "VEC_WRITE", "PageSize"},
		{"collapse data short", edit(coll, cut(1)), "VEC_WRITE", "Length"},
		{"collapse data long", edit(coll, extra(0)), "VEC_WRITE", "Length"},
		{"VEC_READ regions truncated", edit(vecr, cut(1)), "VEC_READ", "NumPages"},
		{"VEC_READ region missing", edit(vecr, cut(RDMARegionSize)), "VEC_READ", "NumPages"},
		{"VEC_READ trailing", edit(vecr, extra(0)), "VEC_READ", "NumPages"},
		{"VEC_READ NumPages past buffer", edit(vecr, put16(32, 0xffff)), "VEC_READ", "NumPages"},
		{"VEC_READ not covering", edit(vecr, put32(0, 9000+4096)), "VEC_READ", "NumPages"},
		{"VEC_READ too many regions", edit(vecr, put32(0, 8000)), "VEC_READ", "NumPages"},
		{"VEC_READ final short of Length", edit(vecr, put32(lenOf(2), 512)), "VEC_READ", "Regions[2].Length"},
		{"VEC_READ non-final not a page", edit(vecr, put32(lenOf(1), 2048)), "VEC_READ", "Regions[1].Length"},
		{"VEC_READ final not sectors", edit(vecr, put32(lenOf(2), 1000)), "VEC_READ", "Regions[2].Length"},
		{"VEC_READ final zero", edit(vecr, put32(lenOf(2), 0)), "VEC_READ", "Regions[2].Length"},
		{"VEC_READ final over a page", edit(vecr, put32(lenOf(2), 4608)), "VEC_READ", "Regions[2].Length"},
		{"VEC_READ PageSize not sectors", edit(vecr, put16(34, 4000)), "VEC_READ", "PageSize"},
		{"VEC_READ PageSize 0", edit(vecr, put16(34, 0)), "VEC_READ", "PageSize"},
		{"AUTH Length", edit(auth, put32(0, uint32(len(auth)+1))), "AUTH", "Length"},
		{"AUTH truncated", edit(auth, func(b []byte) []byte {
			b = b[:HeaderSize+10]
			binary.LittleEndian.PutUint32(b, uint32(len(b)))
			return b
		}), "AUTH_PARAMS", "fixed part"},
		{"AUTH magic", edit(auth, setByte(HeaderSize+3, 'X')), "AUTH_PARAMS", "Magic"},
		{"AUTH no END", edit(auth, func(b []byte) []byte { b = b[:len(b)-1]; binary.LittleEndian.PutUint32(b, uint32(len(b))); return b }), "AUTH_PARAMS", "Options[4]"},
		{"AUTH key length", edit(auth, setByte(opts+1, 15)), "AUTH_PARAMS", "Options[0].OptionLen"},
		{"AUTH unknown option", edit(auth, setByte(opts, 9)), "AUTH_PARAMS", "Options[0].OptionCode"},
		{"AUTH repeated option", edit(auth, setByte(opts+18+10, AuthOptionKey)), "AUTH_PARAMS", "Options[2].OptionCode"},
		{"AUTH bytes after END", edit(auth, func(b []byte) []byte { b = append(b, 0); binary.LittleEndian.PutUint32(b, uint32(len(b))); return b }), "AUTH_PARAMS", "Options"},
		{"AUTH option data truncated", edit(auth, func(b []byte) []byte { b = b[:opts+10]; binary.LittleEndian.PutUint32(b, uint32(len(b))); return b }), "AUTH_PARAMS", "Options[0].OptionData"},
		{"AUTH option len truncated", edit(auth, func(b []byte) []byte { b = b[:opts+1]; binary.LittleEndian.PutUint32(b, uint32(len(b))); return b }), "AUTH_PARAMS", "Options[0].OptionLen"},
		{"REGISTER Length", edit(reg, put32(0, 80)), "REGISTER", "Length"},
		{"REGISTER truncated", edit(reg, func(b []byte) []byte { b = b[:len(b)-1]; binary.LittleEndian.PutUint32(b, uint32(len(b))); return b }), "FID_PARAMS", "FID_PARAMS"},
		{"REGISTER trailing", edit(reg, func(b []byte) []byte { b = append(b, 0); binary.LittleEndian.PutUint32(b, uint32(len(b))); return b }), "FID_PARAMS", "FID_PARAMS"},
		{"CLOSE Length 0", edit(closeMsg, put32(0, 0)), "CLOSE", "Length"},
		{"CLOSE trailing", edit(closeMsg, extra(0)), "CLOSE", "Length"},
		{"INTERRUPT trailing", edit(headerBytes(NewInterruptRequest(1, 1)), extra(0)), "INTERRUPT", "Length"},
		{"FRAGMENTED on READ", edit(read, setByte(5, 0x90)), "READ", "Flags"},
		{"FRAGMENTED on collapse", edit(coll, setByte(5, 0xb0)), "VEC_WRITE", "Flags"},
		{"FRAGMENTED with all its data", edit(write, setByte(5, 0x90)), "WRITE", "Length"},
		{"FRAGMENTED with no data", edit(fragFirst, cut(4)), "WRITE", "Length"},
		{"FRAGMENT Length", edit(frag, put32(0, 5)), "FRAGMENT", "Length"},
		{"FRAGMENT empty", edit(frag, func(b []byte) []byte { b = b[:HeaderSize]; binary.LittleEndian.PutUint32(b, 0); return b }), "FRAGMENT", "Length"},
		{"FRAGMENT flags", edit(frag, setByte(5, 0xa0)), "FRAGMENT", "Flags"},
		{"FRAGMENT marker", edit(frag, setByte(7, 0)), "FRAGMENT", "Marker"},
		{"READ at end of file", edit(read, toEOF), "READ", "Offset"},
		{"VEC_READ at end of file", edit(vecr, toEOF), "VEC_READ", "Offset"},
		{"VEC_WRITE at end of file", edit(vecw, toEOF), "VEC_WRITE", "Offset"},
		{"collapsed VEC_WRITE at end of file", edit(coll, toEOF), "VEC_WRITE", "Offset"},
	} {
		_, err := DecodeRequest(c.b)
		wantFieldErr(t, c.name, err, c.msg, c.field)
	}
	// A WRITE may append: Offset WriteToEndOfFile.
	if r, err := DecodeRequest(edit(write, toEOF)); err != nil || r.Header.Offset != WriteToEndOfFile {
		t.Errorf("WRITE at end of file: %v, offset %#x", err, r.Header.Offset)
	}
}

// toEOF sets a message's Offset to WriteToEndOfFile.
func toEOF(b []byte) []byte {
	binary.LittleEndian.PutUint64(b[16:], WriteToEndOfFile)
	return b
}

func TestDecodeSessionRejects(t *testing.T) {
	provs := []transport.ProviderInfo{{Name: "p", Instances: []transport.Instance{{HostAddress: []byte{1, 2, 3, 4}, Discriminator: []byte{5, 6}}}}}
	nq := NewNegotiateRequest("client", testKey(), provs)
	q, err := nq.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	pOff := NegotiateRequestFixedSize
	iOff := pOff + ProviderFixedSize
	relen := func(f func([]byte) []byte) func([]byte) []byte {
		return func(b []byte) []byte { b = f(b); binary.LittleEndian.PutUint16(b[10:], uint16(len(b))); return b }
	}
	wantRejects(t, "request", DecodeNegotiateRequest, "NEGOTIATE_REQUEST", []reject{
		{"short", q[:5], "ControlHeader"},
		{"protocol id", edit(q, setByte(0, 'l')), "ProtocolId"},
		{"opcode", edit(q, put16(8, 0xff)), "Opcode"},
		{"Length", edit(q, put16(10, uint16(len(q)-1))), "Length"},
		{"fixed part truncated", edit(q[:100], put16(10, 100)), "ProviderCount"},
		{"ProviderCount past buffer", edit(q, put16(158, 2)), "ProviderCount"},
		{"ProviderCount huge", edit(q, put16(158, 0xffff)), "ProviderCount"},
		{"InstanceCount past buffer", edit(q, put16(pOff+64, 3)), "Providers[0].InstanceCount"},
		{"HostAddressLen past buffer", edit(q, put16(iOff, 5)), "Providers[0].Instances[0].HostAddressLen"},
		{"DiscriminatorLen past buffer", edit(q, put16(iOff+2, 0x100)), "Providers[0].Instances[0].HostAddressLen"},
		{"trailing", edit(q, relen(extra(0))), "ProviderList"},
		{"ProviderCount short", edit(q, put16(158, 0)), "ProviderList"},
		{"name not zero-padded", edit(q, setByte(12+2*10, 'x')), "ClientName"},
		{"name lone surrogate", edit(q, put16(12, 0xd800)), "ClientName"},
		{"provider name bad", edit(q, put16(pOff, 0xdc00)), "Providers[0].Name"},
	})

	ns := NewNegotiateResponse("server", testKey(), provs)
	s, err := ns.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	wantRejects(t, "response", DecodeNegotiateResponse, "NEGOTIATE_RESPONSE", []reject{
		{"ProviderCount", edit(s, put16(156, 9)), "ProviderCount"},
		{"SrvName", edit(s, setByte(12+2*MaxHostName-1, 1)), "SrvName"},
		{"Length", edit(s, put16(10, 0)), "Length"},
		{"HostAddressLen", edit(s, put16(NegotiateResponseFixedSize+ProviderFixedSize, 0x7fff)), "Providers[0].Instances[0].HostAddressLen"},
	})

	rk := ResumeKeyResponse{Context: `\\h\s`}
	r, err := rk.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	wantRejects(t, "resume key", DecodeResumeKeyResponse, "SRV_REQUEST_RESUME_KEY", []reject{
		{"short", r[:25], "ContextLength"},
		{"ContextLength past buffer", edit(r, put16(24, 12)), "ContextLength"},
		{"trailing", edit(r, extra(0, 0)), "Context"},
		{"odd", edit(r, func(b []byte) []byte { b = append(b, 0); binary.LittleEndian.PutUint16(b[24:], 11); return b }), "Context"},
		{"NUL", edit(r, put16(26, 0)), "Context"},
		{"surrogate", edit(r, put16(26, 0xd801)), "Context"},
	})
}

func TestEncodeRejects(t *testing.T) {
	long := strings.Repeat("x", MaxHostName+1)
	if _, err := (&NegotiateRequest{ClientName: long}).Append(nil); !IsProtocolError(err) {
		t.Errorf("long client name: %v", err)
	}
	full := strings.Repeat("x", MaxHostName) // fills the array, no terminator
	b, err := (&NegotiateRequest{ClientName: full}).Append(nil)
	if err != nil {
		t.Fatalf("full-length name: %v", err)
	}
	if back, err := DecodeNegotiateRequest(b); err != nil || back.ClientName != full {
		t.Errorf("full-length name round trip: %q %v", back.ClientName, err)
	}
	if _, err := (&NegotiateResponse{SrvName: "a\x00b"}).Append(nil); !IsProtocolError(err) {
		t.Errorf("NUL in name: %v", err)
	}
	if _, err := (&NegotiateResponse{Providers: []transport.ProviderInfo{{Name: strings.Repeat("p", MaxProviderName+1)}}}).Append(nil); !IsProtocolError(err) {
		t.Errorf("long provider name: %v", err)
	}
	big := []transport.ProviderInfo{{Name: "p", Instances: []transport.Instance{{HostAddress: make([]byte, 0x10000)}}}}
	if _, err := (&NegotiateRequest{Providers: big}).Append(nil); !IsProtocolError(err) {
		t.Errorf("oversized message: %v", err)
	}
	if _, err := (&ResumeKeyResponse{Context: "\xff"}).Append(nil); !IsProtocolError(err) {
		t.Errorf("invalid UTF-8 context: %v", err)
	}
	if _, err := (&ResumeKeyResponse{Context: strings.Repeat("x", 0x8000)}).Append(nil); !IsProtocolError(err) {
		t.Errorf("oversized context: %v", err)
	}
	// A failed Append leaves b as it was.
	pre := []byte{1, 2, 3}
	out, _ := (&NegotiateRequest{ClientName: long}).Append(pre)
	if !bytes.Equal(out, pre) {
		t.Errorf("failed Append returned %x", out)
	}
}

func TestDecodeRequestZeroLengthVecRead(t *testing.T) {
	r := NewVecReadRequest(1, 0, 0, 4096, nil, 1, InterruptMode(1, 1))
	got, err := DecodeRequest(r.Append(nil))
	if err != nil || got.Regions.Len() != 0 {
		t.Fatalf("zero-length VEC_READ: %v", err)
	}
}

func TestRegionListAliases(t *testing.T) {
	enc := appendOf(NewVecReadRequest(1, 0, 5000, 4096, testRegions(2, 4096, 1024), 1, InterruptMode(1, 1)))
	r, err := DecodeRequest(enc)
	if err != nil {
		t.Fatal(err)
	}
	if r.Regions.Len() != 2 || r.Regions.At(1).Length != 1024 {
		t.Fatalf("regions %+v", r.Regions.AppendTo(nil))
	}
	enc[HeaderSize+12] = 0x99 // the list aliases the buffer
	if r.Regions.At(0).Length&0xff != 0x99 {
		t.Fatal("RegionList does not alias the decoded buffer")
	}
	w := appendOf(NewWriteRequest(1, 0, []byte("abc"), 1, InterruptMode(1, 1)))
	wr, err := DecodeRequest(w)
	if err != nil {
		t.Fatal(err)
	}
	w[HeaderSize] = 'z'
	if wr.Data[0] != 'z' {
		t.Fatal("write Data does not alias the decoded buffer")
	}
}

func TestPeekControlHeader(t *testing.T) {
	r := NewNegotiateRequest("c", testKey(), nil)
	b, err := r.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := PeekControlHeader(b[:ControlHeaderSize])
	if err != nil || int(h.Length) != len(b) || h.RevID != RevID {
		t.Fatalf("peek %+v %v", h, err)
	}
	wantRejects(t, "", PeekControlHeader, "CONTROL_HEADER", []reject{
		{"short", b[:11], "ControlHeader"},
		{"id", edit(b, setByte(3, 'o')), "ProtocolId"},
		{"opcode", edit(b, put16(8, 0xfd)), "Opcode"},
		{"length", edit(b, put16(10, 11)), "Length"},
	})
}
