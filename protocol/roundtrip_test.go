package protocol

import (
	"bytes"
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"reflect"
	"testing"

	"github.com/lwiofs/lwiofs/transport"
)

// fill sets the header fields no constructor sets (Sequence, Tid, and those
// a message leaves unused) to non-zero values, so a round trip exercises
// every byte of the header.
func fill(h Header) Header {
	h.Sequence = 0x1234
	h.Tid = 0x89abcdef
	h.Credits = cmp.Or(h.Credits, 0x21)
	h.Fid = cmp.Or(h.Fid, 0x0102)
	h.Offset = cmp.Or(h.Offset, 0x1122334455667788)
	h.DataVa = cmp.Or(h.DataVa, 0x0a0b0c0d0e0f1011)
	h.DataMh = cmp.Or(h.DataMh, 0x55aa55aa)
	h.IosMh = cmp.Or(h.IosMh, 0x66bb66bb)
	h.IosVa = cmp.Or(h.IosVa, 0x7788990011223344)
	return h
}

func testKey() [16]byte {
	var k [16]byte
	for i := range k {
		k[i] = byte(0xa0 + i)
	}
	return k
}

func testAuthParams() AuthParams {
	return AuthParams{
		RevID: RevID, Endian: AuthEndian, PageSize: 4096, BaseSequence: 7,
		MaxRdmaWindowSize: 1 << 20, MaxSendBufferSize: 1<<20 + HeaderSize, MaxRecvBufferSize: 16,
		HeaderSize: HeaderSize, Credits: 32, RdmaReadSupported: 1,
		HasKey: true, Key: testKey(),
		HasSessionID: true, SessionID: 0x0102030405060708,
		HasNonce: true, Nonce: [16]byte{0xa0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xaf},
		HasSignature: true, Signature: [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
	}
}

func testFidParams() FidParams {
	return FidParams{ResumeKey: MakeResumeKey(0x1111, 0x2222, 0x3333), SessionID: 0x0102030405060708, FlagsAndAttributes: FileNoIntermediateBuffering | 0x40000000}
}

func testRegions(n int, pageSize uint32, last uint32) []RDMARegion {
	rs := make([]RDMARegion, n)
	for i := range rs {
		rs[i] = RDMARegion{DataVa: 0x7f0000000000 + uint64(i)*uint64(pageSize), DataMh: 0x1000 + uint32(i), Length: pageSize}
	}
	rs[n-1].Length = last
	return rs
}

// requestCases are every client message of the seed, built by its
// constructor, with all header fields made non-zero.
func requestCases() []struct {
	name string
	enc  []byte
	want Request
} {
	type tc = struct {
		name string
		enc  []byte
		want Request
	}
	var out []tc
	hdrOnly := func(name string, h Header) {
		h = fill(h)
		out = append(out, tc{name, h.Append(nil), Request{Header: h}})
	}
	hdrOnly("READ 14A", NewReadRequest(3, 8192, 5000, 0x7f00dead0000, 0x4321, 2, InterruptMode(0x99, 0x1234567890)))
	hdrOnly("READ 14C", NewReadRequest(3, 8192, 5000, 0x7f00dead0000, 0x4321, 2, PollingMode(0x7f00beef0000, 0x5555)))
	hdrOnly("CLOSE 12A", NewCloseRequest(9, 1, 0xc1))
	hdrOnly("CANCEL 13A", NewCancelRequest(9, 1, 0xc2))
	hdrOnly("INTERRUPT 9A", NewInterruptRequest(4, 0xc3))
	hdrOnly("CREDIT 11B", NewCreditRequest(-3, 5, 0xc4))

	a := NewAuthRequest(testAuthParams(), 0x7f0011110000, 0x2468, 0xa1)
	a.Header = fill(a.Header)
	out = append(out, tc{"AUTH 6A", a.Append(nil), Request{Header: a.Header, Auth: a.Params}})

	g := NewRegisterRequest(testFidParams(), 3, 0xa2)
	g.Header = fill(g.Header)
	out = append(out, tc{"REGISTER 7A", g.Append(nil), Request{Header: g.Header, Register: g.Params}})

	data := bytes.Repeat([]byte{0xd7, 0x3c, 0x11}, 700)
	for _, w := range []struct {
		name string
		r    WriteRequest
	}{
		{"WRITE 15A", NewWriteRequest(5, 4096, data, 6, InterruptMode(0x77, 0xb1))},
		{"WRITE 15C", NewWriteRequest(5, 4096, data, 6, PollingMode(0x7f00aaaa0000, 0x88))},
		{"VEC_WRITE 17A", NewVecWriteRequest(5, 4096, data, 1024, 6, InterruptMode(0x77, 0xb2))},
		{"VEC_WRITE 17A polling", NewVecWriteRequest(5, 4096, data, 1024, 6, PollingMode(0x7f00aaaa0000, 0x88))},
		{"VEC_WRITE 17B", NewCollapsedVecWriteRequest(5, 4096, 3*4096+512, bytes.Repeat([]byte{0xee}, 4096), 6, InterruptMode(0x77, 0xb3))},
		{"VEC_WRITE 17C", NewCollapsedVecWriteRequest(5, 4096, 3*4096+512, bytes.Repeat([]byte{0xee}, 4096), 6, PollingMode(0x7f00aaaa0000, 0x88))},
		{"VEC_WRITE 17B short", NewCollapsedVecWriteRequest(5, 4096, 1000, bytes.Repeat([]byte{0xee}, 4096), 6, InterruptMode(0x77, 0xb3))},
		{"WRITE fragmented", fragmentOf(NewWriteRequest(5, 4096, data, 6, InterruptMode(0x77, 0xb4)))},
		{"VEC_WRITE fragmented polling", fragmentOf(NewVecWriteRequest(5, 4096, data, 1024, 6, PollingMode(0x7f00aaaa0000, 0x88)))},
		{"FRAGMENT", continuationOf(NewWriteRequest(5, 4096, data, 6, InterruptMode(0x77, 0xb5)))},
		{"FRAGMENT polling", continuationOf(NewWriteRequest(5, 4096, data, 6, PollingMode(0x7f00aaaa0000, 0x88)))},
	} {
		r := w.r
		r.Header = fill(r.Header)
		out = append(out, tc{w.name, r.Append(nil), Request{Header: r.Header, Data: r.Data}})
	}

	for _, v := range []struct {
		name string
		c    Completion
	}{{"VEC_READ 16A", InterruptMode(0x31, 0xd1)}, {"VEC_READ 16C", PollingMode(0x7f00cccc0000, 0x32)}} {
		r := NewVecReadRequest(7, 1<<20, 3*4096+1000, 4096, testRegions(4, 4096, 1024), 8, v.c)
		r.Header = fill(r.Header)
		enc := r.Append(nil)
		out = append(out, tc{v.name, enc, Request{Header: r.Header, Regions: RegionList(enc[HeaderSize:])}})
	}
	return out
}

func TestRequestRoundTrip(t *testing.T) {
	for _, c := range requestCases() {
		t.Run(c.name, func(t *testing.T) {
			got, err := DecodeRequest(c.enc)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("decode:\n got %+v\nwant %+v", got, c.want)
			}
			if re := got.Append(nil); !bytes.Equal(re, c.enc) {
				t.Fatalf("re-encode differs:\n got %x\nwant %x", re, c.enc)
			}
			if got.Size() != len(c.enc) {
				t.Fatalf("Size %d, encoded %d", got.Size(), len(c.enc))
			}
			h := got.Header
			for name, v := range map[string]uint64{
				"Length": uint64(h.Length), "Fid": uint64(h.Fid), "Sequence": uint64(h.Sequence), "Tid": uint64(h.Tid),
				"Offset": h.Offset, "DataVa": h.DataVa, "DataMh": uint64(h.DataMh), "IosMh": uint64(h.IosMh), "IosVa": h.IosVa,
				"Credits": uint64(h.Credits),
			} {
				if v == 0 {
					t.Errorf("header field %s is zero: the round trip does not exercise it", name)
				}
			}
		})
	}
}

// TestConstructorsFollowTheSeed checks the fields each figure sets.
func TestConstructorsFollowTheSeed(t *testing.T) {
	type want struct {
		op     Opcode
		flags  uint8
		marker uint8
		length uint32
	}
	page := bytes.Repeat([]byte{1}, 4096)
	data := make([]byte, 3000)
	regs := testRegions(2, 4096, 512)
	ap := testAuthParams()
	for _, c := range []struct {
		fig string
		h   Header
		w   want
	}{
		{"6A", NewAuthRequest(testAuthParams(), 1, 2, 3).Header, want{OpAuth, 0x80, 0, uint32(HeaderSize + ap.Size())}},
		{"7A", NewRegisterRequest(testFidParams(), 1, 2).Header, want{OpRegister, 0x80, 0, HeaderSize + 36}},
		{"9A", NewInterruptRequest(1, 2), want{OpInterrupt, 0xC0, 0, HeaderSize}},
		{"11B", NewCreditRequest(-1, 1, 2), want{OpCredit, 0x80, 0, HeaderSize}},
		{"12A", NewCloseRequest(1, 1, 2), want{OpClose, 0x80, 0, HeaderSize}},
		{"13A", NewCancelRequest(1, 1, 2), want{OpCancel, 0x80, 0, HeaderSize}},
		{"14A", NewReadRequest(1, 0, 777, 1, 1, 1, InterruptMode(1, 2)), want{OpRead, 0x80, 0xFF, 777}},
		{"14C", NewReadRequest(1, 0, 777, 1, 1, 1, PollingMode(1, 2)), want{OpRead, 0x00, 0xFF, 777}},
		{"15A", NewWriteRequest(1, 0, data, 1, InterruptMode(1, 2)).Header, want{OpWrite, 0x80, 0xFF, 3000}},
		{"15C", NewWriteRequest(1, 0, data, 1, PollingMode(1, 2)).Header, want{OpWrite, 0x00, 0xFF, 3000}},
		{"16A", NewVecReadRequest(1, 0, 4096+512, 4096, regs, 1, InterruptMode(1, 2)).Header, want{OpVecRead, 0x80, 0xFF, 4608}},
		{"16C", NewVecReadRequest(1, 0, 4096+512, 4096, regs, 1, PollingMode(1, 2)).Header, want{OpVecRead, 0x00, 0xFF, 4608}},
		{"17A", NewVecWriteRequest(1, 0, data, 1024, 1, InterruptMode(1, 2)).Header, want{OpVecWrite, 0x80, 0xFF, 3000}},
		{"17B", NewCollapsedVecWriteRequest(1, 0, 10000, page, 1, InterruptMode(1, 2)).Header, want{OpVecWrite, 0xA0, 0xFF, 10000}},
		{"17C", NewCollapsedVecWriteRequest(1, 0, 10000, page, 1, PollingMode(1, 2)).Header, want{OpVecWrite, 0x20, 0xFF, 10000}},
	} {
		got := want{c.h.Opcode, c.h.Flags, c.h.Marker, c.h.Length}
		if got != c.w {
			t.Errorf("FIG. %s: got %+v, want %+v", c.fig, got, c.w)
		}
	}

	if h := NewCreditRequest(-3, 0, 0); h.CreditCount() != -3 || h.Offset != 0xFFFFFFFD00000000 {
		t.Errorf("11B Offset %#x", h.Offset)
	}
	if h := NewCloseRequest(0x4455, 9, 0xabc); h.Fid != 0x4455 || h.Credits != 9 || h.Cookie() != 0xabc {
		t.Errorf("12A %+v", h)
	}
	if h := NewReadRequest(1, 0, 1, 0xd0, 0xd1, 0, InterruptMode(0x11, 0x22)); h.ImmediateCookie() != 0x11 || h.Cookie() != 0x22 || h.DataVa != 0xd0 || h.DataMh != 0xd1 {
		t.Errorf("14A %+v", h)
	}
	if h := NewReadRequest(1, 0, 1, 0, 0, 0, PollingMode(0x33, 0x44)); h.IosVa != 0x33 || h.IosMh != 0x44 {
		t.Errorf("14C %+v", h)
	}
	if r := NewVecReadRequest(1, 0, 4608, 4096, regs, 1, PollingMode(1, 2)); r.Header.NumPages() != 2 || r.Header.PageSize() != 4096 {
		t.Errorf("16A vec %d/%d", r.Header.NumPages(), r.Header.PageSize())
	}
	if r := NewCollapsedVecWriteRequest(1, 0, 10000, page, 1, PollingMode(1, 2)); r.Header.NumPages() != 3 || r.Header.PageSize() != 4096 || len(r.Data) != 4096 || !r.Collapsed() {
		t.Errorf("17B vec %d/%d data %d", r.Header.NumPages(), r.Header.PageSize(), len(r.Data))
	}
	if r := NewVecWriteRequest(1, 0, data, 1024, 1, PollingMode(1, 2)); r.Header.NumPages() != 3 || r.Header.PageSize() != 1024 || r.Collapsed() {
		t.Errorf("17A vec %d/%d", r.Header.NumPages(), r.Header.PageSize())
	}
}

func TestServerMessages(t *testing.T) {
	for _, c := range []struct {
		fig  string
		got  StatusResponse
		want StatusResponse
	}{
		{"6C", NewAuthResponse(0x11, &AuthParams{HasSessionID: true}, StatusAccessDenied), StatusResponse{0x11, IOStatusBlock{AuthParamsFixedSize + 1 + 10 + 8, StatusAccessDenied}}},
		{"7B", NewRegisterResponse(0x12, 0x0304, StatusSuccess), StatusResponse{0x12, IOStatusBlock{0x0304, 0}}},
		{"9B", NewStatusResponse(0x13, 0, StatusCancelled), StatusResponse{0x13, IOStatusBlock{0, StatusCancelled}}},
		{"11A+", NewDeltaCredit(5), StatusResponse{0, IOStatusBlock{5, NotifyCredit}}},
		{"11A-", NewDeltaCredit(-2), StatusResponse{0, IOStatusBlock{0xFFFFFFFE, NotifyCredit}}},
		{"11C>=0", NewCreditCompletion(0x14, 0), StatusResponse{0x14, IOStatusBlock{0, StatusSuccess}}},
		{"11C<0", NewCreditCompletion(0x15, -1), StatusResponse{0x15, IOStatusBlock{0, NotifyCredit}}},
	} {
		if c.got != c.want {
			t.Errorf("FIG. %s: got %+v want %+v", c.fig, c.got, c.want)
		}
		enc := c.got.Append(nil)
		back, err := DecodeStatusResponse(enc)
		if err != nil || back != c.got {
			t.Errorf("FIG. %s round trip: %+v %v", c.fig, back, err)
		}
	}
	d := NewDeltaCredit(-4)
	if !d.IsDeltaCredit() || d.CreditDelta() != -4 {
		t.Errorf("delta credit %+v", d)
	}
	cc := NewCreditCompletion(9, -1)
	if cc.IsDeltaCredit() {
		t.Error("credit completion taken for a delta credit")
	}
	if b := NewIOStatusBlock(512, StatusEndOfFile); b.Information != 512 || b.Status != StatusEndOfFile {
		t.Errorf("14D %+v", b)
	}
}

func TestParamRoundTrips(t *testing.T) {
	p := testAuthParams()
	enc := p.Append(nil)
	if len(enc) != AuthParamsMaxSize || p.Size() != len(enc) {
		t.Fatalf("auth params size %d/%d, want %d", len(enc), p.Size(), AuthParamsMaxSize)
	}
	back, err := DecodeAuthParams(enc)
	if err != nil || back != p {
		t.Fatalf("auth params: %+v %v", back, err)
	}
	pre, n, err := DecodeAuthParamsPrefix(append(enc, 0xEE, 0xEE, 0xEE))
	if err != nil || n != len(enc) || pre != p {
		t.Fatalf("auth params prefix: %d %v", n, err)
	}

	f := testFidParams()
	fb, err := DecodeFidParams(f.Append(nil))
	if err != nil || fb != f {
		t.Fatalf("fid params: %+v %v", fb, err)
	}
	rk, ts, pid := f.ResumeKey.Parts()
	if rk != 0x1111 || ts != 0x2222 || pid != 0x3333 {
		t.Fatalf("resume key parts %x %x %x", rk, ts, pid)
	}

	rr := ResumeKeyResponse{Key: MakeResumeKey(1, 2, 3), Context: `\\sérvér𝄞\share`}
	re, err := rr.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := DecodeResumeKeyResponse(re)
	if err != nil || rb != rr {
		t.Fatalf("resume key response: %+v %v", rb, err)
	}

	provs := []transport.ProviderInfo{
		{Name: "softrdma", Instances: []transport.Instance{{HostAddress: []byte{10, 0, 0, 1}, Discriminator: []byte{0x12, 0x34}}, {HostAddress: bytes.Repeat([]byte{0xfe}, 16), Discriminator: []byte{1}}}},
		{Name: "verbs:mlx5_0", Instances: []transport.Instance{{HostAddress: []byte{192, 168, 1, 2}, Discriminator: []byte{0, 0x50}}}},
	}
	nq := NewNegotiateRequest("client-ü", testKey(), provs)
	nq.ResponseLength = 4000
	qe, err := nq.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(qe) != nq.Size() {
		t.Fatalf("negotiate request Size %d, encoded %d", nq.Size(), len(qe))
	}
	qb, err := DecodeNegotiateRequest(qe)
	if err != nil || !reflect.DeepEqual(qb, nq) {
		t.Fatalf("negotiate request:\n got %+v\nwant %+v\n%v", qb, nq, err)
	}
	ns := NewNegotiateResponse("server", [16]byte{15: 1}, provs[1:])
	se, err := ns.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := DecodeNegotiateResponse(se)
	if err != nil || !reflect.DeepEqual(sb, ns) {
		t.Fatalf("negotiate response:\n got %+v\nwant %+v\n%v", sb, ns, err)
	}
}

func TestSignature(t *testing.T) {
	key := []byte("session key from NTLM")
	p := testAuthParams()
	p.HasSignature = false
	p.Sign(key)
	if !p.HasSignature || !p.Verify(key) {
		t.Fatal("signed params do not verify")
	}
	// The signature covers everything but itself: wire bytes decoded back
	// still verify, and any change to a signed field breaks it.
	back, err := DecodeAuthParams(p.Append(nil))
	if err != nil || !back.Verify(key) {
		t.Fatalf("decoded params do not verify: %v", err)
	}
	if p.Verify([]byte("another key")) || p.Verify(nil) {
		t.Fatal("verified with the wrong key")
	}
	q := p
	q.Credits++
	if q.Verify(key) {
		t.Fatal("verified after Credits changed")
	}
	q = p
	q.Key[0] ^= 1
	if q.Verify(key) {
		t.Fatal("verified after Key changed")
	}
	q = p
	q.HasSignature = false
	if q.Verify(key) {
		t.Fatal("verified without a signature")
	}
	// Signing input is the encoding without the signature option.
	si := p.SigningInput()
	if len(si) != p.Size()-2-AuthOptionSignatureLength || si[len(si)-1] != AuthOptionEnd {
		t.Fatalf("signing input of %d bytes", len(si))
	}
	// HMAC-SHA256 keyed with the session key, truncated to 16 bytes.
	m := hmac.New(sha256.New, key)
	m.Write(si)
	if full := m.Sum(nil); !bytes.Equal(p.Signature[:], full[:16]) {
		t.Fatalf("signature %x, want HMAC-SHA256 prefix %x", p.Signature, full[:16])
	}
}

// fragmentOf is the first fragment of w: half its data.
func fragmentOf(w WriteRequest) WriteRequest { return w.Fragment(len(w.Data) / 2) }

// continuationOf is the FRAGMENT carrying the second half of w's data.
func continuationOf(w WriteRequest) WriteRequest {
	f := w.Fragment(len(w.Data) / 2)
	done := len(f.Data)
	h := NewFragmentHeader(&f.Header, w.Header.Offset+uint64(done), uint32(len(w.Data)-done), w.Header.Credits)
	return WriteRequest{Header: h, Data: w.Data[done:]}
}
