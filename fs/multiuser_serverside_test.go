package fs

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// The fake tree's ServerSide: the local system calls on its open files.

func (t *dirTree) CopyRange(_ context.Context, src session.Handle, srcOff int64, dst session.Handle, dstOff int64, n int64) (int64, session.Attr, error) {
	s, err := t.file(src)
	if err != nil {
		return 0, session.Attr{}, err
	}
	d, err := t.file(dst)
	if err != nil {
		return 0, session.Attr{}, err
	}
	k, err := unix.CopyFileRange(int(s.Fd()), &srcOff, int(d.Fd()), &dstOff, int(n), 0)
	if err != nil {
		return 0, session.Attr{}, errOf(err)
	}
	a, err := t.fstat(d)
	return int64(k), a, err
}

func (t *dirTree) Allocate(_ context.Context, h session.Handle, mode uint32, off, n int64) (session.Attr, error) {
	f, err := t.file(h)
	if err != nil {
		return session.Attr{}, err
	}
	if err := unix.Fallocate(int(f.Fd()), mode, off, n); err != nil {
		return session.Attr{}, errOf(err)
	}
	return t.fstat(f)
}

func (t *dirTree) Seek(_ context.Context, h session.Handle, off int64, whence int) (int64, error) {
	f, err := t.file(h)
	if err != nil {
		return 0, err
	}
	pos, err := unix.Seek(int(f.Fd()), off, whence)
	return pos, errOf(err)
}

func (t *dirTree) Tmpfile(context.Context, string, int, uint32) (session.Handle, session.Attr, error) {
	return 0, session.Attr{}, syscall.EOPNOTSUPP
}

func (t *dirTree) LinkHandle(context.Context, session.Handle, string) (session.Attr, error) {
	return session.Attr{}, syscall.EOPNOTSUPP
}

func (t *dirTree) fstat(f *os.File) (session.Attr, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return session.Attr{}, errOf(err)
	}
	return attrOf(&st), nil
}

// TestMultiUserServerSide: copies, fallocate and SEEK_DATA go to the
// session that opened the handles; a copy between two users' files is
// left to the kernel (EOPNOTSUPP).
func TestMultiUserServerSide(t *testing.T) {
	f := newFakeUsers()
	for _, uid := range []uint32{1, 2} {
		f.dirs[uid] = t.TempDir()
		mustWriteFile(t, filepath.Join(f.dirs[uid], "src"), "0123456789")
	}
	m := NewMultiUser(MultiUserConfig{Credentials: f.Credentials})
	defer m.Close()
	src1, _, err := m.Open(as(1), "src", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	dst1, _, err := m.Open(as(1), "dst", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	dst2, _, err := m.Open(as(2), "dst", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	// Called without a caller (as a release would be): the handles decide.
	k, a, err := m.CopyRange(context.Background(), src1, 2, dst1, 0, 5)
	if err != nil || k != 5 || a.Size != 5 {
		t.Fatalf("copy within user 1's session: %d %d %v", k, a.Size, err)
	}
	if b, _ := os.ReadFile(filepath.Join(f.dirs[1], "dst")); string(b) != "23456" {
		t.Errorf("user 1's dst: %q", b)
	}
	if _, _, err := m.CopyRange(context.Background(), src1, 0, dst2, 0, 5); err != syscall.EOPNOTSUPP {
		t.Errorf("copy from user 1's file into user 2's: %v, want EOPNOTSUPP (the kernel's fallback)", err)
	}
	if _, _, err := m.CopyRange(context.Background(), 999, 0, dst2, 0, 5); err != syscall.EBADF {
		t.Errorf("copy from an unknown handle: %v, want EBADF", err)
	}
	if a, err := m.Allocate(context.Background(), dst2, 0, 0, 4096); err != nil || a.Size != 4096 {
		t.Errorf("fallocate through user 2's handle: %d %v", a.Size, err)
	}
	if st, _ := os.Stat(filepath.Join(f.dirs[2], "dst")); st == nil || st.Size() != 4096 {
		t.Errorf("user 2's dst after fallocate: %v", st)
	}
	if pos, err := m.Seek(context.Background(), src1, 0, unix.SEEK_DATA); err != nil || pos != 0 {
		t.Errorf("SEEK_DATA through user 1's handle: %d %v", pos, err)
	}
	if _, _, err := m.Tmpfile(as(3), "", os.O_RDWR, 0o600); err != syscall.EACCES {
		t.Errorf("O_TMPFILE by a user without credentials: %v, want EACCES", err)
	}
}
