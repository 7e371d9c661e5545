package protocol

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// unhex decodes a hex string that may contain spaces, newlines and
// "|"-separated comments for readability.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	var clean strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if i := strings.Index(line, "|"); i >= 0 {
			line = line[:i]
		}
		clean.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(clean.String())
	if err != nil {
		t.Fatalf("bad golden hex: %v", err)
	}
	return b
}

func TestHeaderGolden(t *testing.T) {
	h := Header{
		Length: 0x04030201, Opcode: OpVecRead, Flags: 0x80, Credits: 0x07, Marker: 0xFF,
		Fid: 0x0a09, Sequence: 0x0c0b, Tid: 0x100f0e0d,
		Offset: 0x1817161514131211, DataVa: 0x201f1e1d1c1b1a19,
		DataMh: 0x24232221, IosMh: 0x28272625, IosVa: 0x302f2e2d2c2b2a29,
	}
	want := unhex(t, `
		01020304 | Length
		02 80 07 ff | Opcode Flags Credits Marker
		090a 0b0c 0d0e0f10 | Fid Sequence Tid
		1112131415161718 | Offset
		191a1b1c1d1e1f20 | DataVa
		21222324 | DataMh
		25262728 | IosMh
		292a2b2c2d2e2f30 | IosVa`)
	if len(want) != HeaderSize {
		t.Fatalf("golden is %d bytes", len(want))
	}
	got := h.Append(nil)
	if !bytes.Equal(got, want) {
		t.Fatalf("encode:\n got %x\nwant %x", got, want)
	}
	back, err := DecodeHeader(want)
	if err != nil || back != h {
		t.Fatalf("decode: %+v %v", back, err)
	}
	if back.NumPages() != 0x2221 || back.PageSize() != 0x2423 {
		t.Fatalf("vec view: %x %x", back.NumPages(), back.PageSize())
	}
	if back.ImmediateCookie() != 0x28272625 || back.Cookie() != 0x302f2e2d2c2b2a29 {
		t.Fatal("cookie views")
	}
	if back.Status() != 0xff078002 {
		t.Fatalf("status view %x", uint32(back.Status()))
	}
	var v Header
	v.SetVec(0x2221, 0x2423)
	v.SetCookies(1, 2)
	v.SetStatus(0xff078002)
	if v.DataMh != h.DataMh || v.IosMh != 1 || v.IosVa != 2 || v.Opcode != OpVecRead || v.Marker != 0xFF || v.Credits != 7 || v.Flags != 0x80 {
		t.Fatalf("setters: %+v", v)
	}
	if _, err := DecodeHeader(want[:HeaderSize-1]); !IsProtocolError(err) {
		t.Fatalf("short header: %v", err)
	}
}

func TestStatusResponseGolden(t *testing.T) {
	r := StatusResponse{Cookie: 0x0807060504030201, Ios: IOStatusBlock{Information: 0x0c0b0a09, Status: StatusAccessDenied}}
	want := unhex(t, "0102030405060708 | Cookie\n 090a0b0c | Information\n 220000c0 | Status")
	if got := r.Append(nil); !bytes.Equal(got, want) {
		t.Fatalf("got %x want %x", got, want)
	}
	back, err := DecodeStatusResponse(want)
	if err != nil || back != r {
		t.Fatalf("decode %+v %v", back, err)
	}
	if _, err := DecodeStatusResponse(append(want, 0)); !IsProtocolError(err) {
		t.Fatalf("trailing: %v", err)
	}
	if _, err := DecodeStatusResponse(want[:15]); !IsProtocolError(err) {
		t.Fatalf("short: %v", err)
	}
	ios, err := DecodeIOStatusBlock(want[8:])
	if err != nil || ios != r.Ios {
		t.Fatalf("ios %+v %v", ios, err)
	}
	rg := RDMARegion{DataVa: 0x0807060504030201, DataMh: 0x0c0b0a09, Length: 0x100f0e0d}
	wantRg := unhex(t, "0102030405060708 090a0b0c 0d0e0f10")
	if got := rg.Append(nil); !bytes.Equal(got, wantRg) {
		t.Fatalf("region got %x", got)
	}
	if back, err := DecodeRDMARegion(wantRg); err != nil || back != rg {
		t.Fatalf("region decode %+v %v", back, err)
	}
}

func TestHotPathAllocs(t *testing.T) {
	buf := make([]byte, HeaderSize)
	h := Header{Length: 4096, Opcode: OpRead, Marker: MarkerIO}
	r := StatusResponse{Cookie: 9}
	sb := make([]byte, StatusResponseSize)
	n := testing.AllocsPerRun(100, func() {
		h.Put(buf)
		hh, _ := DecodeHeader(buf)
		r.Put(sb)
		rr, _ := DecodeStatusResponse(sb)
		_, _ = hh, rr
	})
	if n != 0 {
		t.Fatalf("%v allocs per header/status round trip", n)
	}
}

func TestOpcodeString(t *testing.T) {
	if OpInterrupt.String() != "INTERRUPT" || OpVecWrite.String() != "VEC_WRITE" || Opcode(0xfe).String() != "OPCODE(0xfe)" {
		t.Fatal(OpInterrupt, OpVecWrite, Opcode(0xfe))
	}
	if Opcode(11).Valid() || !OpInterrupt.Valid() || !OpFragment.Valid() || OpFragment.String() != "FRAGMENT" {
		t.Fatal("Valid")
	}
}
