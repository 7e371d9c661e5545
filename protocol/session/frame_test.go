package session

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/smbauth"
)

// A frame written by hand from the layout in frame.go / docs/session.md.
const goldenFrame = "" +
	"3b000000" + // Length 59
	"4c575343" + // "LWSC"
	"0201000000000000" + // MessageID 0x102
	"0500" + // Command GETATTR
	"0100" + // Flags RESPONSE
	"340000c0" + // Status OBJECT_NAME_NOT_FOUND
	"0807060504030201" + // SessionID
	"07000000" + // TreeID 7
	"00000000" + // Reserved
	"000102030405060708090a0b0c0d0e0f" + // Signature
	"616263" // body "abc"

func goldenHeader() Header {
	return Header{
		Length: 59, MessageID: 0x102, Command: CmdGetAttr, Flags: FlagResponse,
		Status: protocol.StatusObjectNameNotFound, SessionID: 0x0102030405060708, TreeID: 7,
		Signature: [16]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
	}
}

func TestFrameGolden(t *testing.T) {
	raw, _ := hex.DecodeString(goldenFrame)
	h := goldenHeader()
	enc := AppendFrame(nil, h, []byte("abc"))
	copy(enc[sigOffset:], h.Signature[:])
	if !bytes.Equal(enc, raw) {
		t.Errorf("AppendFrame =\n%x\nwant\n%x", enc, raw)
	}
	f, err := DecodeFrame(raw)
	if err != nil {
		t.Fatal(err)
	}
	if f.Header != h || string(f.Body) != "abc" {
		t.Errorf("DecodeFrame = %+v %q", f.Header, f.Body)
	}
	if HeaderSize != 56 || len(AppendFrame(nil, Header{}, nil)) != HeaderSize {
		t.Error("header size is not 56")
	}
}

func TestDecodeFrameErrors(t *testing.T) {
	good, _ := hex.DecodeString(goldenFrame)
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrShortFrame},
		{"short header", good[:HeaderSize-1], ErrShortFrame},
		{"length below header", mut(func(b []byte) []byte { b[0] = 10; return b }), ErrShortFrame},
		{"length mismatch", good[:len(good)-1], ErrShortFrame},
		{"too large", mut(func(b []byte) []byte { b[3] = 0x7f; return b }), ErrFrameTooLarge},
		{"magic", mut(func(b []byte) []byte { b[4] = 'X'; return b }), ErrBadMagic},
		{"flags", mut(func(b []byte) []byte { b[19] = 0x80; return b }), ErrBadFlags},
		{"reserved", mut(func(b []byte) []byte { b[36] = 1; return b }), ErrBadReserved},
	} {
		if _, err := DecodeFrame(tc.in); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestReadFrameLimits(t *testing.T) {
	// An oversized length is refused before anything is allocated or read.
	huge := []byte{0xff, 0xff, 0xff, 0x7f}
	if _, _, err := ReadFrame(bytes.NewReader(huge)); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("huge frame: %v", err)
	}
	good, _ := hex.DecodeString(goldenFrame)
	if _, _, err := ReadFrame(bytes.NewReader(good[:20])); err != io.ErrUnexpectedEOF {
		t.Errorf("truncated frame: %v", err)
	}
	if _, _, err := ReadFrame(bytes.NewReader(nil)); err != io.EOF {
		t.Errorf("no frame: %v", err)
	}
	f, raw, err := ReadFrame(bytes.NewReader(good))
	if err != nil || !bytes.Equal(raw, good) || f.MessageID != 0x102 {
		t.Errorf("ReadFrame: %v", err)
	}
}

func TestSignVerify(t *testing.T) {
	key := []byte("0123456789abcdef")
	raw := AppendFrame(nil, Header{MessageID: 9, Command: CmdEcho}, []byte("body"))
	signFrame(key, raw)
	f, err := DecodeFrame(raw)
	if err != nil || f.Flags&FlagSigned == 0 || f.Signature == ([16]byte{}) {
		t.Fatalf("signed frame: %v %+v", err, f.Header)
	}
	if !verifyFrame(key, raw) {
		t.Fatal("signature does not verify")
	}
	for i := range raw {
		raw[i] ^= 0x20
		if verifyFrame(key, raw) {
			t.Fatalf("flipping byte %d kept the signature valid", i)
		}
		raw[i] ^= 0x20
	}
	if verifyFrame([]byte("another key....."), raw) {
		t.Error("verified with another key")
	}
}

func TestCommandString(t *testing.T) {
	if CmdReadDir.String() != "READDIR" || Command(999).String() != "Command(999)" {
		t.Error(CmdReadDir.String(), Command(999).String())
	}
	for c := Command(1); c < cmdLimit; c++ {
		named, coded := !strings.HasPrefix(c.String(), "Command("), bodies[c].req != nil && bodies[c].resp != nil
		if named != coded || (!named && bodies[c].req != nil) {
			t.Errorf("command %d: named %v, bodies %v (a number is either reserved or has both)", c, named, coded)
		}
	}
}

var tm = time.Unix(1700000000, 123456789)

var fullAttr = Attr{Ino: 1, Mode: 0o100644, Nlink: 2, Uid: 3, Gid: 4, Rdev: 5, Blksize: 4096, Size: 6, Blocks: 8, Atime: tm, Mtime: tm.Add(time.Second), Ctime: tm.Add(2 * time.Second)}

// samples has, for every body type, a value with every field non-zero.
var samples = []message{
	&tokenMsg{Token: []byte("NTLMSSP\x00")},
	&setupReq{Token: []byte("NTLMSSP\x00"), Offer: sealOffer{Flags: sealOfferRequired, Ciphers: []smbauth.Cipher{smbauth.CipherAES256GCM, smbauth.CipherAES128GCM}}},
	&sessionSetupDone{ServerName: "srv", Seal: sealAnswer{Flags: sealAnswerSealed, Cipher: smbauth.CipherAES256GCM, Echo: sealOffer{Flags: 1, Ciphers: []smbauth.Cipher{4}}}},
	&nameMsg{Name: "a/b"},
	&treeConnectResp{TreeID: 3, Flags: treeFlagReadOnly | treeFlagSeal | treeFlagSharedAccount,
		Account: Account{Name: "alice", Uid: 1000, Gid: 100, Groups: []uint32{100, 27}}},
	&attrMsg{Attr: fullAttr},
	&setAttrReq{Path: "p", Handle: 9, In: SetAttrIn{Valid: 63, Mode: 0o755, Uid: 1, Gid: 2, Size: 3, Atime: tm, Mtime: tm, AtimeNow: true, MtimeNow: true}},
	&readDirReq{Path: "d", After: "x", MaxBytes: 100},
	&readDirResp{More: true, Entries: []DirEntry{{Name: "a", Attr: fullAttr}, {Name: "b", Attr: fullAttr}}},
	&mkdirReq{Path: "d", Mode: 0o700},
	&openReq{Path: "f", Flags: 0o102, Mode: 0o600, DurableID: DurableID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, Register: true, FidFlags: 8},
	&openResp{Handle: 7, Attr: fullAttr, FileID: []byte("id"), Registered: true, Fid: 3},
	&openReq{Path: "f", Flags: 0o102, Mode: 0o600, leaseTail: leaseTail{true, 7}, Register: true, FidFlags: 8},
	&openResp{Handle: 7, Attr: fullAttr, FileID: []byte("id"), leaseTail: leaseTail{true, 7}, Registered: true, Fid: 3},
	&handleMsg{Handle: 7},
	&readReq{Handle: 7, Offset: 1 << 40, Length: 4096},
	&dataMsg{Data: []byte("data")},
	&writeReq{Handle: 7, Offset: 5, Data: []byte("data")},
	&writeResp{Count: 4, End: 9},
	&twoPathReq{Old: "a", New: "b", Flags: 1},
	&statFSMsg{StatFS: StatFS{Blocks: 1, Bfree: 2, Bavail: 3, Files: 4, Ffree: 5, Bsize: 6, Frsize: 7, NameLen: 8}},
	&fsyncReq{Handle: 7, Datasync: true},
	&xattrReq{Path: "p", Name: "user.x", Value: []byte("v"), Flags: 1},
	&namesMsg{Names: []string{"user.a", "user.b"}},
	&ioctlReq{Handle: 7, CtlCode: FsctlSrvRequestResumeKey, Input: []byte{1}},
	&pipeTransactReq{Handle: 7, Data: []byte("LWIO")},
	&lockReq{Handle: 7, Owner: 0x1122334455667788, Start: 1, End: LockToEOF, Type: LockWrite, Flags: lockWait | lockFlock},
	&unlockReq{Handle: 7, Owner: 9},
	&lockResp{Type: LockRead, Start: 5, End: 6},
	&cancelReq{MessageID: 42},
	&reopenReq{DurableID: DurableID{9: 1, 15: 2}, FileID: []byte("sealed"), Path: "a/b", Flags: 2},
	&reopenResp{Handle: 8, Attr: fullAttr, Flags: reopenReclaimed},
	// With the lease fields (lease.go), and the lease and batch bodies.
	&openReq{Path: "f", Flags: 0o102, Mode: 0o600, DurableID: DurableID{1: 1}, leaseTail: leaseTail{true, 7}},
	&openResp{Handle: 7, Attr: fullAttr, FileID: []byte("id"), leaseTail: leaseTail{true, 3}},
	&mkdirReq{Path: "d", Mode: 0o700, leaseTail: leaseTail{true, 1}},
	&mkdirResp{Attr: fullAttr},
	&mkdirResp{Attr: fullAttr, leaseTail: leaseTail{true, 1}},
	&readDirReq{Path: "d", After: "x", MaxBytes: 100, leaseTail: leaseTail{true, 1}, EntryWant: 3},
	&readDirResp{More: true, Entries: []DirEntry{{Name: "a", Attr: fullAttr}}, leaseTail: leaseTail{true, 1}, Leases: []uint32{3}},
	&leaseReq{Path: "p", Want: 3, Release: []uint64{1, 2}},
	&leaseResp{Attr: fullAttr, State: 3},
	&leaseBreakMsg{BreakID: 9, Ino: 5, Flags: 1, Current: 7, New: 3, Names: []string{"a", "b"}},
	&leaseAckReq{BreakID: 9, Ino: 5, State: 3},
	&batchReq{Ops: []batchOp{{Command: uint32(CmdClose), Body: []byte{7, 0, 0, 0, 0, 0, 0, 0}}}},
	&batchResp{Results: []batchResult{{Status: 0xC0000008, Body: []byte{1}}}},
}

// shorterForms are the lengths of m's body without its optional trailing
// fields, which decode too (an older peer's): without the lease fields
// (and OPEN's registration after them), and without OPEN's registration
// alone.
func shorterForms(m message) map[int]bool {
	cp := func() message {
		v := reflect.New(reflect.TypeOf(m).Elem())
		v.Elem().Set(reflect.ValueOf(m).Elem())
		return v.Interface().(message)
	}
	noReg := func(c message) bool {
		switch x := c.(type) {
		case *openReq:
			had := x.Register
			x.Register = false
			return had
		case *openResp:
			had := x.Registered
			x.Registered = false
			return had
		}
		return false
	}
	out := map[int]bool{}
	if c := cp(); noReg(c) {
		out[len(marshal(c))] = true
	}
	c := cp()
	noReg(c)
	if l, ok := c.(interface{ tail() *leaseTail }); ok && l.tail().Leased {
		l.tail().Leased = false
		out[len(marshal(c))] = true
	}
	return out
}

func TestBodyRoundTrip(t *testing.T) {
	for _, m := range samples {
		b := marshal(m)
		got := reflect.New(reflect.TypeOf(m).Elem()).Interface().(message)
		if err := unmarshal(b, got); err != nil {
			t.Errorf("%T: %v", m, err)
			continue
		}
		if !reflect.DeepEqual(normalize(got), normalize(m)) {
			t.Errorf("%T round trip:\n got %+v\nwant %+v", m, got, m)
		}
		// Every strict prefix is refused — but the body without its lease
		// fields (or OPEN's registration) — and so is a trailing byte.
		shorter := shorterForms(m)
		for n := range len(b) {
			if shorter[n] {
				continue
			}
			if err := unmarshal(b[:n], reflect.New(reflect.TypeOf(m).Elem()).Interface().(message)); err == nil {
				t.Errorf("%T: %d-byte prefix of %d decoded", m, n, len(b))
				break
			}
		}
		if err := unmarshal(append(b, 0), reflect.New(reflect.TypeOf(m).Elem()).Interface().(message)); !errors.Is(err, ErrMalformedBody) {
			t.Errorf("%T: trailing byte accepted: %v", m, err)
		}
	}
}

// normalize re-encodes times through Unix seconds so that DeepEqual does
// not trip over monotonic readings and locations.
func normalize(m message) []byte { return marshal(m) }

func TestBodyGolden(t *testing.T) {
	// GETATTR request body: u16 length then the path.
	if got := hex.EncodeToString(marshal(&nameMsg{Name: "a/b"})); got != "0300612f62" {
		t.Errorf("nameMsg = %s", got)
	}
	// WRITE: Handle u64, Offset u64, Data u32-counted.
	want := "0700000000000000" + "0500000000000000" + "02000000" + "6869"
	if got := hex.EncodeToString(marshal(&writeReq{Handle: 7, Offset: 5, Data: []byte("hi")})); got != want {
		t.Errorf("writeReq = %s, want %s", got, want)
	}
	// TREE_CONNECT response: TreeID, Flags, then the account (docs/session.md,
	// "Identity": Uid, Gid, u16 group count, the groups, the name).
	want = "03000000" + "05000000" + "e8030000" + "64000000" + "0200" + "64000000" + "1b000000" + "0500" + "616c696365"
	tc := &treeConnectResp{TreeID: 3, Flags: treeFlagReadOnly | treeFlagSharedAccount,
		Account: Account{Name: "alice", Uid: 1000, Gid: 100, Groups: []uint32{100, 27}}}
	if got := hex.EncodeToString(marshal(tc)); got != want {
		t.Errorf("treeConnectResp = %s, want %s", got, want)
	}
	for _, g := range []struct {
		m    message
		want string
	}{
		// WRITE response: Count u32, End u64.
		{&writeResp{Count: 2, End: 0x10}, "02000000" + "1000000000000000"},
		// OPEN request: path, Flags u32, Mode u32, DurableID [16], then
		// the lease fields (Want u32; 0: none) and the registration's
		// FidFlags u32.
		{&openReq{Path: "f", Flags: 0x241, Mode: 0o644, DurableID: DurableID{0: 0xaa, 15: 0xbb}, Register: true, FidFlags: 8},
			"0100" + "66" + "41020000" + "a4010000" + "aa0000000000000000000000000000bb" + "00000000" + "08000000"},
		{&openReq{Path: "f", Flags: 0x241, Mode: 0o644, DurableID: DurableID{0: 0xaa, 15: 0xbb}, leaseTail: leaseTail{true, 7}, Register: true, FidFlags: 8},
			"0100" + "66" + "41020000" + "a4010000" + "aa0000000000000000000000000000bb" + "07000000" + "08000000"},
		// OPEN response: Handle u64, Attr (84 bytes), FileID blob, Lease
		// u32, Fid u32.
		{&openResp{Handle: 3, FileID: []byte{0xf1}, Registered: true, Fid: 0x0305},
			"0300000000000000" + strings.Repeat("00", 84) + "01000000" + "f1" + "00000000" + "05030000"},
		// LOCK / GETLK request: Handle, Owner, Start, End u64; Type, Flags u32.
		{&lockReq{Handle: 1, Owner: 0x0102030405060708, Start: 0x10, End: 0x7fffffffffffffff, Type: 1, Flags: 3},
			"0100000000000000" + "0807060504030201" + "1000000000000000" + "ffffffffffffff7f" + "01000000" + "03000000"},
		// UNLOCK request: Handle u64, Owner u64.
		{&unlockReq{Handle: 2, Owner: 5}, "0200000000000000" + "0500000000000000"},
		// GETLK response: Type u32, Start u64, End u64.
		{&lockResp{Type: 0, Start: 1, End: 2}, "00000000" + "0100000000000000" + "0200000000000000"},
		// CANCEL request: MessageID u64.
		{&cancelReq{MessageID: 0x1234}, "3412000000000000"},
		// REOPEN request: DurableID [16], FileID blob, path, Flags u32.
		{&reopenReq{DurableID: DurableID{0: 1}, FileID: []byte{0xee, 0xff}, Path: "p", Flags: 2},
			"01000000000000000000000000000000" + "02000000eeff" + "010070" + "02000000"},
		// REOPEN response: Handle u64, Attr, Flags u32.
		{&reopenResp{Handle: 4, Flags: 1}, "0400000000000000" + strings.Repeat("00", 84) + "01000000"},
	} {
		if got := hex.EncodeToString(marshal(g.m)); got != g.want {
			t.Errorf("%T = %s, want %s", g.m, got, g.want)
		}
	}
	if n := len(marshal(&attrMsg{})); n != attrWireSize || attrWireSize != 84 {
		t.Errorf("Attr is %d bytes, attrWireSize %d, want 84", n, attrWireSize)
	}
}

// FuzzDecodeFrame: decoding never panics, and what decodes re-encodes to
// the same bytes.
func FuzzDecodeFrame(f *testing.F) {
	good, _ := hex.DecodeString(goldenFrame)
	f.Add(good)
	f.Add(AppendFrame(nil, Header{Command: CmdEcho}, nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := DecodeFrame(b)
		if err != nil {
			return
		}
		enc := AppendFrame(nil, fr.Header, fr.Body)
		copy(enc[sigOffset:], fr.Signature[:])
		if !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded frame differs:\n%x\n%x", enc, b)
		}
		fr2, err := DecodeFrame(enc)
		if err != nil || fr2.Header != fr.Header {
			t.Fatalf("second decode: %v", err)
		}
		if _, _, err := ReadFrame(bytes.NewReader(b)); err != nil {
			t.Fatalf("ReadFrame refuses what DecodeFrame accepts: %v", err)
		}
	})
}

// FuzzBodies feeds every request and response decoder: no panics, and a
// body that decodes re-encodes to bytes that decode to the same message.
func FuzzBodies(f *testing.F) {
	for c := Command(1); c < cmdLimit; c++ {
		if bodies[c].req == nil {
			continue // reserved
		}
		for _, m := range samples {
			if reflect.TypeOf(m) == reflect.TypeOf(bodies[c].req()) || reflect.TypeOf(m) == reflect.TypeOf(bodies[c].resp()) {
				f.Add(uint16(c), false, marshal(m))
				f.Add(uint16(c), true, marshal(m))
			}
		}
	}
	f.Fuzz(func(t *testing.T, cmd uint16, resp bool, b []byte) {
		c := Command(cmd % cmdLimit)
		if bodies[c].req == nil { // 0 and reserved numbers
			return
		}
		mk := bodies[c].req
		if resp {
			mk = bodies[c].resp
		}
		m := mk()
		if err := unmarshal(b, m); err != nil {
			return
		}
		enc := marshal(m)
		m2 := mk()
		if err := unmarshal(enc, m2); err != nil {
			t.Fatalf("%v: re-encoded body does not decode: %v", c, err)
		}
		if !bytes.Equal(marshal(m2), enc) {
			t.Fatalf("%v: body not stable across round trips", c)
		}
	})
}

func TestSizeHints(t *testing.T) {
	for _, m := range samples {
		if h, ok := m.(sizeHinter); ok && h.sizeHint() != len(marshal(m)) {
			t.Errorf("%T: sizeHint %d, encoded %d", m, h.sizeHint(), len(marshal(m)))
		}
	}
}
