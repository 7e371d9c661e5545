package protocol

import (
	"testing"

	"github.com/lwiofs/lwiofs/transport"
)

// TestSizePins pins every fixed part to the size the layout tables give, and
// checks that the encoders produce that many bytes.
func TestSizePins(t *testing.T) {
	var p AuthParams
	rk := ResumeKeyResponse{}
	rkb, _ := rk.Append(nil)
	nq := NegotiateRequest{}
	nqb, _ := nq.Append(nil)
	ns := NegotiateResponse{}
	nsb, _ := ns.Append(nil)
	one := []transport.ProviderInfo{{Name: "p", Instances: []transport.Instance{{}}}}
	withProv := NegotiateResponse{Providers: one}
	wpb, _ := withProv.Append(nil)
	var fid FidParams
	var ch ControlHeader
	chb := make([]byte, ControlHeaderSize)
	ch.Put(chb)
	for _, c := range []struct {
		name      string
		const_    int
		want      int
		encodedAs int
	}{
		{"LWIO_COMMON_HEADER", HeaderSize, 48, len((&Header{}).Append(nil))},
		{"LWIO_MSG_STATUS_RESPONSE", StatusResponseSize, 16, len((&StatusResponse{}).Append(nil))},
		{"LWIO_IO_STATUS_BLOCK", IOStatusBlockSize, 8, len((&IOStatusBlock{}).Append(nil))},
		{"LWIO_RDMA_REGION", RDMARegionSize, 16, len((&RDMARegion{}).Append(nil))},
		{"LWIO_AUTH_PARAMS fixed part + END", AuthParamsFixedSize + 1, 31, len(p.Append(nil))},
		{"LWIO_AUTH_PARAMS all options", AuthParamsMaxSize, 30 + 18 + 10 + 18 + 18 + 1, len(appendOf(testAuthParams()))},
		{"LWIO_FID_PARAMS", FidParamsSize, 36, len(fid.Append(nil))},
		{"register message", RegisterRequestSize, 84, len(appendOf(NewRegisterRequest(fid, 0, 0)))},
		{"SRV_RESUME_KEY", ResumeKeySize, 24, len(ResumeKey{})},
		{"SRV_REQUEST_RESUME_KEY fixed part", ResumeKeyResponseFixedSize, 26, len(rkb)},
		{"LWIO_CONTROL_HEADER", ControlHeaderSize, 12, len(chb)},
		{"negotiate request fixed part", NegotiateRequestFixedSize, 160, len(nqb)},
		{"negotiate response fixed part", NegotiateResponseFixedSize, 158, len(nsb)},
		{"provider fixed part", ProviderFixedSize, 66, 0},
		{"LWIO_NET_ADDRESS fixed part", InstanceFixedSize, 4, 0},
		{"response with one empty instance", NegotiateResponseFixedSize + ProviderFixedSize + InstanceFixedSize, 228, len(wpb)},
	} {
		if c.const_ != c.want {
			t.Errorf("%s: constant %d, want %d", c.name, c.const_, c.want)
		}
		if c.encodedAs != 0 && c.encodedAs != c.want {
			t.Errorf("%s: encodes to %d bytes, want %d", c.name, c.encodedAs, c.want)
		}
	}
	if MaxHostName != 64 || MaxProviderName != 32 || SectorSize != 512 || RevID != 0x1001 || ControlOpNegotiate != 0xfe {
		t.Error("a documented constant changed")
	}
	if FlagInterrupt != 0x80 || FlagControl != 0x40 || FlagCollapse != 0x20 || MarkerIO != 0xFF || NotifyCredit != 1 || FileNoIntermediateBuffering != 8 {
		t.Error("a seed constant changed")
	}
}

// TestDecodeHotPathAllocs pins the engines' hot path to zero allocations:
// encoding and decoding READ, WRITE and VEC_READ requests and status
// responses.
func TestDecodeHotPathAllocs(t *testing.T) {
	read := headerBytes(NewReadRequest(1, 0, 4096, 1, 1, 1, InterruptMode(1, 1)))
	write := appendOf(NewWriteRequest(1, 0, make([]byte, 4096), 1, InterruptMode(1, 1)))
	vr := NewVecReadRequest(1, 0, 9000, 4096, testRegions(3, 4096, 1024), 1, InterruptMode(1, 1))
	vecr := vr.Append(nil)
	coll := appendOf(NewCollapsedVecWriteRequest(1, 0, 10000, make([]byte, 4096), 1, InterruptMode(1, 1)))
	buf := make([]byte, 0, 16384)
	n := testing.AllocsPerRun(200, func() {
		for _, b := range [][]byte{read, write, vecr, coll} {
			r, err := DecodeRequest(b)
			if err != nil {
				panic(err)
			}
			buf = r.Append(buf[:0])
		}
		vr.Put(buf[:vr.Size()])
		w := NewWriteRequest(1, 0, write[HeaderSize:], 1, PollingMode(1, 1))
		w.Header.Put(buf)
		s := NewStatusResponse(1, 2, StatusSuccess)
		s.Put(buf)
	})
	if n != 0 {
		t.Fatalf("%v allocations on the hot path", n)
	}
}

func BenchmarkDecodeRead(b *testing.B) {
	read := headerBytes(NewReadRequest(1, 0, 4096, 1, 1, 1, InterruptMode(1, 1)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeRequest(read); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeWrite(b *testing.B) {
	write := appendOf(NewWriteRequest(1, 0, make([]byte, 1<<20), 1, InterruptMode(1, 1)))
	b.ReportAllocs()
	b.SetBytes(1 << 20)
	for b.Loop() {
		if _, err := DecodeRequest(write); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeVecRead256(b *testing.B) {
	vecr := appendOf(NewVecReadRequest(1, 0, 1<<20, 4096, testRegions(256, 4096, 4096), 1, InterruptMode(1, 1)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeRequest(vecr); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPutHeader(b *testing.B) {
	h := NewReadRequest(1, 0, 4096, 1, 1, 1, InterruptMode(1, 1))
	buf := make([]byte, HeaderSize)
	b.ReportAllocs()
	for b.Loop() {
		h.Put(buf)
	}
}

func BenchmarkStatusResponse(b *testing.B) {
	s := NewStatusResponse(1, 4096, StatusSuccess)
	buf := make([]byte, StatusResponseSize)
	b.ReportAllocs()
	for b.Loop() {
		s.Put(buf)
		if _, err := DecodeStatusResponse(buf); err != nil {
			b.Fatal(err)
		}
	}
}
