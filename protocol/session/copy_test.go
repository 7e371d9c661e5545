package session

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

func init() {
	// Every field non-zero, for the round-trip test and the fuzz seeds.
	var key [24]byte
	for i := range key {
		key[i] = byte(i + 1)
	}
	samples = append(samples,
		&copyRangeReq{Handle: 7, Source: 9, SourceKey: key, SrcOffset: 1, DstOffset: 2, Length: 3, Flags: 1},
		&copyRangeResp{Count: 5, Attr: fullAttr},
		&fallocateReq{Handle: 7, Mode: 3, Offset: 4, Length: 5},
		&seekReq{Handle: 7, Offset: 8, Whence: 3},
		&offsetMsg{Offset: 9},
		&linkHandleReq{Handle: 7, Path: "d/n", Flags: 1},
	)
}

// TestServerSideGolden: the bodies of COPY_RANGE, FALLOCATE, SEEK,
// TMPFILE and LINKAT_HANDLE, written by hand from docs/session.md.
func TestServerSideGolden(t *testing.T) {
	var key [24]byte
	for i := range key {
		key[i] = byte(i + 1)
	}
	for _, tc := range []struct {
		m    message
		want string
	}{
		{&copyRangeReq{Handle: 7, Source: 9, SourceKey: key, SrcOffset: 0x10, DstOffset: 0x20, Length: 0x1000},
			"0700000000000000" + "0900000000000000" +
				"0102030405060708" + "090a0b0c0d0e0f10" + "1112131415161718" +
				"1000000000000000" + "2000000000000000" + "0010000000000000" + "00000000"},
		{&copyRangeResp{Count: 0x1000}, "0010000000000000" + string(bytes.Repeat([]byte("00"), 84))},
		{&fallocateReq{Handle: 7, Mode: 3, Offset: 4096, Length: 65536},
			"0700000000000000" + "03000000" + "0010000000000000" + "0000010000000000"},
		{&seekReq{Handle: 7, Offset: 5 << 30, Whence: 3}, "0700000000000000" + "0000004001000000" + "03000000"},
		{&offsetMsg{Offset: 5 << 30}, "0000004001000000"},
		// TMPFILE's request is OPEN's: directory, Flags O_RDWR|O_EXCL, Mode 0600,
		// DurableID (none); no lease or registration fields.
		{&openReq{Path: "d", Flags: 0x82, Mode: 0o600}, "0100" + "64" + "82000000" + "80010000" + string(bytes.Repeat([]byte("00"), 16))},
		{&linkHandleReq{Handle: 7, Path: "d/n"}, "0700000000000000" + "0300" + "642f6e" + "00000000"},
	} {
		if got := hex.EncodeToString(marshal(tc.m)); got != tc.want {
			t.Errorf("%T:\n got %s\nwant %s", tc.m, got, tc.want)
		}
	}
	for cmd, want := range map[Command]string{CmdCopyRange: "COPY_RANGE", CmdFallocate: "FALLOCATE", CmdSeek: "SEEK",
		CmdTmpfile: "TMPFILE", CmdLinkHandle: "LINKAT_HANDLE"} {
		if cmd.String() != want || uint16(cmd) != map[string]uint16{"COPY_RANGE": 38, "FALLOCATE": 39, "SEEK": 40, "TMPFILE": 41, "LINKAT_HANDLE": 42}[want] {
			t.Errorf("command %d is %s, want %s", cmd, cmd, want)
		}
	}
}

func (e *env) open(tr *Tree, p string, flags int) Handle {
	e.t.Helper()
	h, _, err := tr.Open(ctxT(e.t), p, flags, 0o644)
	if err != nil {
		e.t.Fatalf("open %s: %v", p, err)
	}
	return h
}

func randomData(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCopyRange: the server copies between two handles of a session, and
// from a source named by its resume key from another session of the same
// user (two mounts); another user's key, a read-only destination and a
// handle of another session are refused.
func TestCopyRange(t *testing.T) {
	e := newEnv(t)
	data := randomData(t, 3<<20+5)
	os.WriteFile(filepath.Join(e.share, "src"), data, 0o644)
	tr := e.tree("data")
	ctx := ctxT(t)
	src, dst := e.open(tr, "src", os.O_RDONLY), e.open(tr, "dst", os.O_RDWR|os.O_CREATE)

	n, a, err := tr.CopyRange(ctx, src, 5, dst, 0, 1<<40)
	if err != nil || n != int64(len(data))-5 || a.Size != uint64(n) {
		t.Fatalf("CopyRange = %d (size %d), %v; want %d", n, a.Size, err, len(data)-5)
	}
	if got, _ := os.ReadFile(filepath.Join(e.share, "dst")); !bytes.Equal(got, data[5:]) {
		t.Fatal("the copy differs")
	}

	// Another session of alice (a second mount) names the source by key.
	key, err := tr.RequestResumeKey(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	tr2 := e.tree("data")
	dst2 := e.open(tr2, "dst2", os.O_RDWR|os.O_CREATE)
	if n, _, err := tr2.CopyRangeFromKey(ctx, key.Key, 0, dst2, 0, int64(len(data))); err != nil || n != int64(len(data)) {
		t.Fatalf("copy from another session's key = %d, %v", n, err)
	}
	if got, _ := os.ReadFile(filepath.Join(e.share, "dst2")); !bytes.Equal(got, data) {
		t.Fatal("the copy by key differs")
	}
	// A handle of one session means nothing on another (dst is 2 there;
	// the second session has only handle 1).
	if _, _, err := tr2.CopyRange(ctx, dst, 0, dst2, 0, 1); err != protocol.StatusInvalidHandle {
		t.Errorf("another session's handle: %v, want INVALID_HANDLE", err)
	}

	// Bob never gets at alice's open, key or not.
	bc, err := e.dial("bob", "bob's")
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	btr, err := bc.TreeConnect(ctx, "data")
	if err != nil {
		t.Fatal(err)
	}
	bdst := e.open(btr, "bobs", os.O_RDWR|os.O_CREATE)
	if _, _, err := btr.CopyRangeFromKey(ctx, key.Key, 0, bdst, 0, 4); err != protocol.StatusAccessDenied {
		t.Errorf("another user's key: %v, want ACCESS_DENIED", err)
	}
	if fi, _ := os.Stat(filepath.Join(e.share, "bobs")); fi.Size() != 0 {
		t.Error("bob's file got alice's bytes")
	}
	var zero [24]byte
	zero[0] = 1
	if _, _, err := tr.CopyRangeFromKey(ctx, zero, 0, dst, 0, 4); err != protocol.StatusAccessDenied {
		t.Errorf("unknown key: %v, want ACCESS_DENIED", err)
	}

	// A destination opened read-only is refused like a write.
	ro := e.open(tr, "dst", os.O_RDONLY)
	if _, _, err := tr.CopyRange(ctx, src, 0, ro, 0, 4); err != protocol.StatusAccessDenied {
		t.Errorf("read-only destination: %v, want ACCESS_DENIED", err)
	}
	// A closed source's key dies with it.
	tr.CloseHandle(ctx, src)
	if _, _, err := tr2.CopyRangeFromKey(ctx, key.Key, 0, dst2, 0, 4); err != protocol.StatusAccessDenied {
		t.Errorf("closed source's key: %v, want ACCESS_DENIED", err)
	}
}

// TestCopyRangeBounded: one request copies at most MaxCopyRange; the
// client's loop goes on from the count.
func TestCopyRangeBounded(t *testing.T) {
	e := newEnv(t)
	const size = MaxCopyRange + 1<<20
	f, _ := os.Create(filepath.Join(e.share, "big"))
	f.Truncate(size)
	f.WriteAt([]byte("end"), size-3)
	f.Close()
	tr := e.tree("data")
	ctx := ctxT(t)
	src, dst := e.open(tr, "big", os.O_RDONLY), e.open(tr, "copy", os.O_RDWR|os.O_CREATE)
	var total int64
	for requests := 1; ; requests++ {
		n, _, err := tr.CopyRange(ctx, src, total, dst, total, size-total)
		if err != nil {
			t.Fatal(err)
		}
		if n > MaxCopyRange {
			t.Fatalf("one request copied %d bytes, more than MaxCopyRange", n)
		}
		total += n
		if total == size {
			if requests < 2 {
				t.Errorf("%d bytes in %d request", size, requests)
			}
			break
		}
		if n == 0 || requests > 1000 {
			t.Fatalf("stuck at %d of %d", total, size)
		}
	}
	b := make([]byte, 3)
	g, _ := os.Open(filepath.Join(e.share, "copy"))
	defer g.Close()
	if g.ReadAt(b, size-3); string(b) != "end" {
		t.Errorf("the copy ends with %q", b)
	}
}

// TestFallocateSeek: FALLOCATE and SEEK act on the server file, and
// FALLOCATE is refused through a read-only handle.
func TestFallocateSeek(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("data")
	ctx := ctxT(t)
	h := e.open(tr, "f", os.O_RDWR|os.O_CREATE)
	a, err := tr.Allocate(ctx, h, 0, 0, 8<<20)
	if err != nil || a.Size != 8<<20 || a.Blocks < 8<<20/512 {
		t.Fatalf("Allocate = size %d blocks %d, %v", a.Size, a.Blocks, err)
	}
	if _, err := tr.WriteAt(ctx, h, randomData(t, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Allocate(ctx, h, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 8<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.WriteAt(ctx, h, []byte("x"), 5<<20); err != nil {
		t.Fatal(err)
	}
	if pos, err := tr.Seek(ctx, h, 0, unix.SEEK_DATA); err != nil || pos != 5<<20 {
		t.Errorf("SEEK_DATA = %d, %v; want %d", pos, err, 5<<20)
	}
	if pos, err := tr.Seek(ctx, h, 5<<20, unix.SEEK_HOLE); err != nil || pos <= 5<<20 || pos > 8<<20 {
		t.Errorf("SEEK_HOLE = %d, %v", pos, err)
	}
	if _, err := tr.Seek(ctx, h, 6<<20, unix.SEEK_DATA); ToErrno(err) != syscall.ENXIO {
		t.Errorf("SEEK_DATA past the data: %v, want ENXIO", err)
	}
	ro := e.open(tr, "f", os.O_RDONLY)
	if _, err := tr.Allocate(ctx, ro, 0, 0, 1); err != protocol.StatusAccessDenied {
		t.Errorf("Allocate through a read-only handle: %v, want ACCESS_DENIED", err)
	}
}

// TestTmpfileLink: TMPFILE makes an unnamed file, LINKAT_HANDLE names it,
// confined; a read-only share refuses TMPFILE.
func TestTmpfileLink(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("data")
	ctx := ctxT(t)
	h, a, err := tr.Tmpfile(ctx, "", os.O_RDWR, 0o600)
	if err != nil || a.Mode != syscall.S_IFREG|0o600 {
		t.Fatalf("Tmpfile = mode %o, %v", a.Mode, err)
	}
	tr.WriteAt(ctx, h, []byte("unnamed"), 0)
	if _, err := tr.LinkHandle(ctx, h, "../outside/x"); err != protocol.StatusAccessDenied {
		t.Errorf("link outside the share: %v, want ACCESS_DENIED", err)
	}
	if a, err := tr.LinkHandle(ctx, h, "named"); err != nil || a.Size != 7 {
		t.Fatalf("LinkHandle = %+v, %v", a, err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.share, "named")); string(b) != "unnamed" {
		t.Errorf("named file holds %q", b)
	}
	if _, _, err := e.tree("ro").Tmpfile(ctx, "", os.O_RDWR, 0o600); err != protocol.StatusAccessDenied {
		t.Errorf("Tmpfile on a read-only share: %v, want ACCESS_DENIED", err)
	}
}
