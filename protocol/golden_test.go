package protocol

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/lwiofs/lwiofs/transport"
)

// The golden encodings below are written by hand from the layout tables of
// docs/wire.md, not produced by the encoder: little-endian fields, in order,
// no padding. z(n) is n zero bytes, for long zero runs.

func z(n int) string { return strings.Repeat("00", n) }

func seq(from byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = from + byte(i)
	}
	return b
}

func TestGoldenRequests(t *testing.T) {
	auth := AuthParams{
		RevID: 0x1001, Endian: 8, PageSize: 0x1000, MaxRdmaWindowSize: 0x10000,
		MaxSendBufferSize: 0x400, MaxRecvBufferSize: 0x10, HeaderSize: 0x30, Credits: 0x20,
		RdmaReadSupported: 1, HasKey: true, HasSignature: true,
	}
	copy(auth.Key[:], seq(0, 16))
	copy(auth.Signature[:], seq(0xa0, 16))

	page16 := bytes.Repeat([]byte{0xab}, 16)
	regions := []RDMARegion{{DataVa: 0x11110000, DataMh: 0x21, Length: 0x1000}, {DataVa: 0x22220000, DataMh: 0x22, Length: 0x400}}

	for _, c := range []struct {
		name string
		enc  []byte
		hex  string
	}{
		{"READ 14A", headerBytes(NewReadRequest(0x0102, 0x2000, 0x1000, 0x00007f0000001000, 0x0a0b0c0d, 3, InterruptMode(0x11223344, 0x5566778899aabbcc))), `
			00100000 | Length 4096
			00 80 03 ff | READ, INTERRUPT, Credits 3, Marker
			0201 0000 00000000 | Fid, Sequence, Tid
			0020000000000000 | Offset
			001000 00 007f0000 | DataVa
			0d0c0b0a | DataMh
			44332211 | ImmediateCookie
			ccbbaa9988776655 | Cookie`},
		{"READ 14C", headerBytes(NewReadRequest(0x0102, 0x2000, 0x1000, 0x00007f0000001000, 0x0a0b0c0d, 3, PollingMode(0x00007f0000002000, 0x0e0f1011))), `
			00100000 00 00 03 ff 0201 0000 00000000 0020000000000000 0010000000 7f0000 0d0c0b0a
			11100f0e | IosMh
			0020000000 7f0000 | IosVa`},
		{"WRITE 15A", appendOf(NewWriteRequest(0x0102, 0x200, []byte("hello"), 3, InterruptMode(0, 0x0807060504030201))), `
			05000000 01 80 03 ff 0201 0000 00000000 | Length 5, WRITE
			0002000000000000 ` + z(8+4+4) + ` | Offset, DataVa, DataMh, ImmediateCookie
			0102030405060708 | Cookie
			68656c6c6f | data`},
		{"WRITE 15C", appendOf(NewWriteRequest(0x0102, 0x200, []byte("hello"), 3, PollingMode(0x1122334455667788, 0x99aabbcc))), `
			05000000 01 00 03 ff 0201 0000 00000000 0002000000000000 ` + z(12) + `
			ccbbaa99 8877665544332211 68656c6c6f`},
		{"WRITE at end of file", appendOf(NewWriteRequest(0x0102, WriteToEndOfFile, []byte("hi"), 3, InterruptMode(0, 9))), `
			02000000 01 80 03 ff 0201 0000 00000000 | Length 2, WRITE
			ffffffffffffffff | Offset FILE_WRITE_TO_END_OF_FILE
			` + z(16) + ` 0900000000000000 6869`},
		{"VEC_READ 16A", appendOf(NewVecReadRequest(7, 0x10000, 5096, 4096, regions, 2, InterruptMode(1, 2))), `
			e8130000 02 80 02 ff 0700 0000 00000000 | Length 5096, VEC_READ
			0000010000000000 | Offset
			` + z(8) + ` | DataVa
			0200 0010 | NumPages 2, PageSize 4096
			01000000 0200000000000000 | ImmediateCookie, Cookie
			0000111100000000 21000000 00100000 | Regions[0]
			0000222200000000 22000000 00040000 | Regions[1]`},
		{"VEC_READ 16C", appendOf(NewVecReadRequest(7, 0x10000, 5096, 4096, regions, 2, PollingMode(0x3333, 0x44))), `
			e8130000 02 00 02 ff 0700 0000 00000000 0000010000000000 ` + z(8) + ` 0200 0010
			44000000 3333000000000000
			0000111100000000 21000000 00100000 0000222200000000 22000000 00040000`},
		{"VEC_WRITE 17A", appendOf(NewVecWriteRequest(7, 0, []byte("abcdef"), 4, 1, InterruptMode(0, 9))), `
			06000000 03 80 01 ff 0700 0000 00000000 ` + z(16) + `
			0200 0400 | NumPages 2, PageSize 4
			00000000 0900000000000000 616263646566`},
		{"VEC_WRITE 17B", appendOf(NewCollapsedVecWriteRequest(7, 0x1000, 40, page16, 1, InterruptMode(0, 9))), `
			28000000 03 a0 01 ff | Length 40, INTERRUPT|COLLAPSE
			0700 0000 00000000 0010000000000000 ` + z(8) + `
			0300 1000 | NumPages 3, PageSize 16
			00000000 0900000000000000 ` + strings.Repeat("ab", 16)},
		{"VEC_WRITE 17C", appendOf(NewCollapsedVecWriteRequest(7, 0x1000, 40, page16, 1, PollingMode(0x55, 0x66))), `
			28000000 03 20 01 ff 0700 0000 00000000 0010000000000000 ` + z(8) + ` 0300 1000
			66000000 5500000000000000 ` + strings.Repeat("ab", 16)},
		{"WRITE fragmented", appendOf(fragmentOf(NewWriteRequest(0x0102, 0x200, []byte("hello!"), 3, InterruptMode(0x11, 0x0807060504030201)))), `
			06000000 01 90 03 ff 0201 0000 00000000 | Length 6 (the whole write), WRITE, INTERRUPT|FRAGMENTED
			0002000000000000 ` + z(8+4) + ` 11000000 | Offset, DataVa, DataMh, ImmediateCookie
			0102030405060708 | Cookie
			68656c | the first 3 bytes`},
		{"FRAGMENT", appendOf(continuationOf(NewWriteRequest(0x0102, 0x200, []byte("hello!"), 3, InterruptMode(0x11, 0x0807060504030201)))), `
			03000000 0a 80 03 ff 0201 0000 00000000 | Length 3, FRAGMENT, INTERRUPT
			0302000000000000 | Offset 0x200 + 3
			` + z(8+4) + ` 11000000 | DataVa, DataMh, ImmediateCookie as the first
			0102030405060708 | Cookie as the first
			6c6f21 | the other 3 bytes`},
		{"CLOSE 12A", headerBytes(NewCloseRequest(0x0a0b, 4, 0x0102030405060708)), `
			30000000 04 80 04 00 0b0a 0000 00000000 ` + z(24) + ` 0807060504030201`},
		{"CANCEL 13A", headerBytes(NewCancelRequest(0x0a0b, 4, 0x0102030405060708)), `
			30000000 05 80 04 00 0b0a 0000 00000000 ` + z(24) + ` 0807060504030201`},
		{"INTERRUPT 9A", headerBytes(NewInterruptRequest(2, 0xff)), `
			30000000 09 c0 02 00 ` + z(8+24) + ` ff00000000000000`},
		{"CREDIT 11B", headerBytes(NewCreditRequest(-2, 1, 0x10)), `
			30000000 08 80 01 00 ` + z(8) + `
			00000000 feffffff | Offset: upper 32 bits = -2
			` + z(16) + ` 1000000000000000`},
		{"REGISTER 7A", appendOf(NewRegisterRequest(FidParams{ResumeKey: MakeResumeKey(1, 2, 3), SessionID: 0x0102030405060708, FlagsAndAttributes: 8}, 1, 0x20)), `
			54000000 07 80 01 00 | Length 84, REGISTER
			` + z(8+8+8+4) + ` 00000000 2000000000000000 | Fid..DataMh, IosMh, Cookie
			0100000000000000 0200000000000000 0300000000000000 | ResumeKey
			0807060504030201 | SessionId
			08000000 | FlagsAndAttributes`},
		{"AUTH 6A", appendOf(NewAuthRequest(auth, 0x00007f0000003000, 0x77, 0x30)), `
			73000000 06 80 00 00 | Length 115, AUTH
			` + z(8+8) + `
			0030000000 7f0000 77000000 00000000 3000000000000000
			4c57494f 0110 0800 0010 0000 | 'LWIO', RevId, Endian, PageSize, BaseSequence
			00000100 00040000 10000000 | MaxRdmaWindowSize, MaxSendBufferSize, MaxRecvBufferSize
			3000 2000 0100 | HeaderSize, Credits, RdmaReadSupported
			01 10 000102030405060708090a0b0c0d0e0f | KEY
			03 10 a0a1a2a3a4a5a6a7a8a9aaabacadaeaf | SIGNATURE
			00 | END`},
	} {
		want := unhex(t, c.hex)
		if !bytes.Equal(c.enc, want) {
			t.Errorf("%s:\n got %x\nwant %x", c.name, c.enc, want)
			continue
		}
		r, err := DecodeRequest(want)
		if err != nil {
			t.Errorf("%s: decode golden: %v", c.name, err)
			continue
		}
		if re := r.Append(nil); !bytes.Equal(re, want) {
			t.Errorf("%s: decode+encode of golden:\n got %x\nwant %x", c.name, re, want)
		}
	}
}

func headerBytes(h Header) []byte { return h.Append(nil) }

func appendOf[T any, P interface {
	*T
	Append([]byte) []byte
}](m T) []byte {
	return P(&m).Append(nil)
}

func TestGoldenServerMessages(t *testing.T) {
	srv := AuthParams{
		RevID: 0x1001, Endian: 8, PageSize: 0x2000, BaseSequence: 1, MaxRdmaWindowSize: 0x80000,
		MaxSendBufferSize: 0x10, MaxRecvBufferSize: 0x2000, HeaderSize: 0x30, Credits: 0x40,
		HasKey: true, HasSessionID: true, SessionID: 0x1122334455667788, HasSignature: true,
	}
	copy(srv.Key[:], seq(0, 16))
	copy(srv.Signature[:], seq(0xb0, 16))
	// A sealed session's parameters carry NONCE before SIGNATURE.
	sealed := srv
	sealed.HasNonce = true
	copy(sealed.Nonce[:], seq(0xc0, 16))
	for _, c := range []struct {
		name string
		p    AuthParams
		hex  string
	}{
		{"AUTH_PARAMS 6B", srv, `
		4c57494f 0110 0800 0020 0100 | 'LWIO', RevId, Endian, PageSize 8192, BaseSequence 1
		00000800 10000000 00200000 | 512 KiB, 16, 8 KiB
		3000 4000 0000 | HeaderSize, Credits 64, RdmaReadSupported 0
		01 10 000102030405060708090a0b0c0d0e0f | KEY
		02 08 8877665544332211 | SESSION_ID
		03 10 b0b1b2b3b4b5b6b7b8b9babbbcbdbebf | SIGNATURE
		00 | END`},
		{"AUTH_PARAMS 6B with NONCE", sealed, `
		4c57494f 0110 0800 0020 0100 | 'LWIO', RevId, Endian, PageSize 8192, BaseSequence 1
		00000800 10000000 00200000 | 512 KiB, 16, 8 KiB
		3000 4000 0000 | HeaderSize, Credits 64, RdmaReadSupported 0
		01 10 000102030405060708090a0b0c0d0e0f | KEY
		02 08 8877665544332211 | SESSION_ID
		04 10 c0c1c2c3c4c5c6c7c8c9cacbcccdcecf | NONCE
		03 10 b0b1b2b3b4b5b6b7b8b9babbbcbdbebf | SIGNATURE
		00 | END`},
	} {
		if got, want := c.p.Append(nil), unhex(t, c.hex); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %x\nwant %x", c.name, got, want)
		} else if back, err := DecodeAuthParams(want); err != nil || back != c.p {
			t.Errorf("%s decode: %+v %v", c.name, back, err)
		}
	}

	for _, c := range []struct {
		name string
		r    StatusResponse
		hex  string
	}{
		{"6C", NewAuthResponse(0x30, &srv, StatusSuccess), "3000000000000000 55000000 00000000 | Information = 77 + 8"},
		{"6C denied", NewAuthResponse(0x30, &srv, StatusAccessDenied), "3000000000000000 55000000 220000c0"},
		{"7B", NewRegisterResponse(0x20, 5, StatusSuccess), "2000000000000000 05000000 00000000 | Information = Fid"},
		{"11A", NewDeltaCredit(-2), "0000000000000000 feffffff 01000000 | Cookie 0, -2, LWIO_NOTIFY_CREDIT"},
		{"11C", NewCreditCompletion(0x10, -2), "1000000000000000 00000000 01000000"},
		{"11C ok", NewCreditCompletion(0x10, 0), "1000000000000000 00000000 00000000"},
		{"14B", NewStatusResponse(0x40, 0x1000, StatusSuccess), "4000000000000000 00100000 00000000"},
	} {
		want := unhex(t, c.hex)
		if got := c.r.Append(nil); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %x\nwant %x", c.name, got, want)
		}
		if back, err := DecodeStatusResponse(want); err != nil || back != c.r {
			t.Errorf("%s decode: %+v %v", c.name, back, err)
		}
	}
	ios := NewIOStatusBlock(0x1000, StatusEndOfFile)
	if got, want := ios.Append(nil), unhex(t, "00100000 110000c0"); !bytes.Equal(got, want) {
		t.Errorf("IO_STATUS_BLOCK 14D: got %x want %x", got, want)
	}
}

func TestGoldenSessionMessages(t *testing.T) {
	rk := ResumeKeyResponse{Key: MakeResumeKey(0x0102030405060708, 0x1112131415161718, 0x2122232425262728), Context: `\\s\x`}
	rkHex := `
		0807060504030201 1817161514131211 2827262524232221 | ResumeKey, Timestamp, Pid
		0a00 | ContextLength 10
		5c00 5c00 7300 5c00 7800 | \\s\x in UTF-16LE`
	got, err := rk.Append(nil)
	if want := unhex(t, rkHex); err != nil || !bytes.Equal(got, want) {
		t.Errorf("SRV_REQUEST_RESUME_KEY:\n got %x\nwant %x (%v)", got, want, err)
	} else if back, err := DecodeResumeKeyResponse(want); err != nil || back != rk {
		t.Errorf("SRV_REQUEST_RESUME_KEY decode: %+v %v", back, err)
	}

	provs := []transport.ProviderInfo{{Name: "s", Instances: []transport.Instance{{HostAddress: []byte{10, 0, 0, 1}, Discriminator: []byte{0x12, 0x34}}}}}
	provHex := `
		7300 ` + z(62) + ` | Name "s", zero-padded to 32 WCHARs
		0100 | InstanceCount
		0400 0200 0a000001 1234 | HostAddressLen, DiscriminatorLen, address, discriminator`
	var key [16]byte
	copy(key[:], seq(0, 16))
	nq := NewNegotiateRequest("ab", key, provs)
	nq.ResponseLength = 0x400
	nqHex := `
		4c57494f 01100000 fe00 ec00 | 'LWIO', RevId 0x1001, NEGOTIATE, Length 236
		6100 6200 ` + z(124) + ` | ClientName "ab", zero-padded to 64 WCHARs
		000102030405060708090a0b0c0d0e0f | Key
		0004 0100 | ResponseLength 1024, ProviderCount 1` + provHex
	got, err = nq.Append(nil)
	if want := unhex(t, nqHex); err != nil || !bytes.Equal(got, want) {
		t.Errorf("NEGOTIATE request:\n got %x\nwant %x (%v)", got, want, err)
	} else if back, err := DecodeNegotiateRequest(want); err != nil || !reflect.DeepEqual(back, nq) {
		t.Errorf("NEGOTIATE request decode: %+v %v", back, err)
	}

	var skey [16]byte
	copy(skey[:], seq(0xf0, 16))
	ns := NewNegotiateResponse("srv", skey, provs)
	nsHex := `
		4c57494f 01100000 fe00 ea00 | Length 234
		7300 7200 7600 ` + z(122) + ` | SrvName "srv"
		f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff | Key
		0100 | ProviderCount` + provHex
	got, err = ns.Append(nil)
	if want := unhex(t, nsHex); err != nil || !bytes.Equal(got, want) {
		t.Errorf("NEGOTIATE response:\n got %x\nwant %x (%v)", got, want, err)
	} else if back, err := DecodeNegotiateResponse(want); err != nil || !reflect.DeepEqual(back, ns) {
		t.Errorf("NEGOTIATE response decode: %+v %v", back, err)
	}
}
