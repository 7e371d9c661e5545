package session

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

// resolvers runs a test with openat2 and with the walking fallback.
func resolvers(t *testing.T, fn func(t *testing.T, e *env)) {
	for _, walk := range []bool{false, true} {
		name := "openat2"
		if walk {
			name = "walk"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, func(c *ServerConfig) { c.DisableOpenat2 = walk })
			fn(t, e)
		})
	}
}

// treeAs connects a session of user's own to share; the session closes
// with the test.
func (e *env) treeAs(user, password, share string) *Tree {
	e.t.Helper()
	c, err := e.dial(user, password)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	tr, err := c.TreeConnect(ctxT(e.t), share)
	if err != nil {
		e.t.Fatal(err)
	}
	return tr
}

func wantErrno(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if got := ToErrno(err); got != want {
		t.Errorf("%s: error %v → %v, want %v", what, err, got, want)
	}
}

func TestNamespaceOps(t *testing.T) {
	resolvers(t, func(t *testing.T, e *env) {
		tr := e.tree("data")
		ctx := ctxT(t)
		a, err := tr.Mkdir(ctx, "d", 0o750)
		if err != nil || a.Mode != unix.S_IFDIR|0o750 {
			t.Fatalf("Mkdir: %v mode %o", err, a.Mode)
		}
		_, err = tr.Mkdir(ctx, "d", 0o750)
		wantErrno(t, "Mkdir twice", err, syscall.EEXIST)

		h, a, err := tr.Open(ctx, "d/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640)
		if err != nil || a.Mode != unix.S_IFREG|0o640 || a.Size != 0 {
			t.Fatalf("Open O_CREAT: %v %+v", err, a)
		}
		_, _, err = tr.Open(ctx, "d/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640)
		wantErrno(t, "O_EXCL on existing", err, syscall.EEXIST)
		data := bytes.Repeat([]byte("0123456789"), 300_000) // 3 MB: several pieces
		if n, err := tr.WriteAt(ctx, h, data, 5); err != nil || n != len(data) {
			t.Fatalf("WriteAt: %d %v", n, err)
		}
		if err := tr.Fsync(ctx, h, false); err != nil {
			t.Errorf("Fsync: %v", err)
		}
		if err := tr.Fsync(ctx, h, true); err != nil {
			t.Errorf("Fdatasync: %v", err)
		}
		got := make([]byte, len(data)+100)
		n, err := tr.ReadAt(ctx, h, got, 5)
		if err != io.EOF || n != len(data) || !bytes.Equal(got[:n], data) {
			t.Fatalf("ReadAt: %d %v equal=%v", n, err, bytes.Equal(got[:n], data))
		}
		if n, err := tr.ReadAt(ctx, h, got[:10], 1<<40); n != 0 || err != io.EOF {
			t.Errorf("ReadAt past EOF: %d %v", n, err)
		}
		a, err = tr.GetAttr(ctx, "d/f")
		if err != nil || a.Size != uint64(len(data)+5) || a.Nlink != 1 {
			t.Errorf("GetAttr: %v %+v", err, a)
		}
		onDisk, _ := os.ReadFile(filepath.Join(e.share, "d", "f"))
		if !bytes.Equal(onDisk[5:], data) {
			t.Error("file on disk differs")
		}

		// SetAttr by path and by handle.
		mt := time.Date(2001, 2, 3, 4, 5, 6, 7000, time.UTC)
		a, err = tr.SetAttr(ctx, "d/f", 0, SetAttrIn{Valid: SetMode | SetSize | SetMtime | SetAtime, Mode: 0o604, Size: 10, Mtime: mt, AtimeNow: true})
		if err != nil || a.Mode != unix.S_IFREG|0o604 || a.Size != 10 || !a.Mtime.Equal(mt) || time.Since(a.Atime) > time.Minute {
			t.Errorf("SetAttr by path: %v %+v", err, a)
		}
		a, err = tr.SetAttr(ctx, "", h, SetAttrIn{Valid: SetSize | SetUid | SetGid | SetMtime, Size: 3, Uid: 1234, Gid: 4321, MtimeNow: true})
		if err != nil || a.Size != 3 || a.Uid != 1234 || a.Gid != 4321 || time.Since(a.Mtime) > time.Minute {
			t.Errorf("SetAttr by handle: %v %+v", err, a)
		}
		if err := tr.CloseHandle(ctx, h); err != nil {
			t.Errorf("CloseHandle: %v", err)
		}
		_, err = tr.ReadAt(ctx, h, got[:1], 0)
		wantErrno(t, "ReadAt on closed handle", err, syscall.EBADF)
		wantErrno(t, "CloseHandle twice", tr.CloseHandle(ctx, h), syscall.EBADF)

		// Symlinks, hard links, readdir.
		if a, err := tr.Symlink(ctx, "f", "d/l"); err != nil || a.Mode&unix.S_IFMT != unix.S_IFLNK {
			t.Errorf("Symlink: %v %o", err, a.Mode)
		}
		if s, err := tr.Readlink(ctx, "d/l"); err != nil || s != "f" {
			t.Errorf("Readlink: %q %v", s, err)
		}
		_, err = tr.Readlink(ctx, "d/f")
		wantErrno(t, "Readlink of a file", err, syscall.EINVAL)
		if a, err := tr.Link(ctx, "d/f", "d/hard"); err != nil || a.Nlink != 2 {
			t.Errorf("Link: %v nlink %d", err, a.Nlink)
		}
		ents, err := tr.ReadDir(ctx, "d")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, de := range ents {
			names = append(names, fmt.Sprintf("%s:%o", de.Name, de.Attr.Mode&unix.S_IFMT))
		}
		if want := fmt.Sprintf("[f:%o hard:%o l:%o]", unix.S_IFREG, unix.S_IFREG, unix.S_IFLNK); fmt.Sprint(names) != want {
			t.Errorf("ReadDir = %v, want %s", names, want)
		}

		// Rename and its flags.
		if err := tr.Rename(ctx, "d/hard", "d/h2", 0); err != nil {
			t.Errorf("Rename: %v", err)
		}
		wantErrno(t, "RENAME_NOREPLACE onto existing", tr.Rename(ctx, "d/h2", "d/f", unix.RENAME_NOREPLACE), syscall.EEXIST)
		e.writeFile("x", "X")
		e.writeFile("y", "Y")
		if err := tr.Rename(ctx, "x", "y", unix.RENAME_EXCHANGE); err != nil {
			t.Errorf("RENAME_EXCHANGE: %v", err)
		}
		if b, _ := os.ReadFile(filepath.Join(e.share, "x")); string(b) != "Y" {
			t.Errorf("after exchange x = %q", b)
		}
		wantErrno(t, "Rename with bad flags", tr.Rename(ctx, "x", "y", 1<<7), syscall.EINVAL)

		// Removal.
		wantErrno(t, "Rmdir non-empty", tr.Rmdir(ctx, "d"), syscall.ENOTEMPTY)
		wantErrno(t, "Unlink a dir", tr.Unlink(ctx, "d"), syscall.EISDIR)
		wantErrno(t, "Rmdir a file", tr.Rmdir(ctx, "x"), syscall.ENOTDIR)
		for _, p := range []string{"d/f", "d/h2", "d/l"} {
			if err := tr.Unlink(ctx, p); err != nil {
				t.Errorf("Unlink %s: %v", p, err)
			}
		}
		if err := tr.Rmdir(ctx, "d"); err != nil {
			t.Errorf("Rmdir: %v", err)
		}
		_, err = tr.GetAttr(ctx, "d")
		wantErrno(t, "GetAttr removed", err, syscall.ENOENT)
		_, err = tr.GetAttr(ctx, "x/y")
		wantErrno(t, "GetAttr through a file", err, syscall.ENOTDIR)
		wantErrno(t, "Rmdir root", tr.Rmdir(ctx, ""), syscall.EACCES)

		// Paths that are not canonical.
		for _, p := range []string{"a//b", "./x", "x/", "x/."} {
			_, err := tr.GetAttr(ctx, p)
			wantErrno(t, "GetAttr "+p, err, syscall.EINVAL)
		}

		st, err := tr.StatFS(ctx)
		if err != nil || st.Blocks == 0 || st.Bsize == 0 || st.NameLen == 0 {
			t.Errorf("StatFS: %v %+v", err, st)
		}
	})
}

func TestXattrs(t *testing.T) {
	resolvers(t, func(t *testing.T, e *env) {
		tr := e.tree("data")
		ctx := ctxT(t)
		e.writeFile("f", "")
		if err := tr.SetXattr(ctx, "f", "user.k", []byte("v1"), 0); err != nil {
			if ToErrno(err) == syscall.EOPNOTSUPP {
				t.Skip("no user xattrs on this filesystem")
			}
			t.Fatal(err)
		}
		wantErrno(t, "XATTR_CREATE on existing", tr.SetXattr(ctx, "f", "user.k", []byte("v2"), unix.XATTR_CREATE), syscall.EEXIST)
		if v, err := tr.GetXattr(ctx, "f", "user.k"); err != nil || string(v) != "v1" {
			t.Errorf("GetXattr: %q %v", v, err)
		}
		_, err := tr.GetXattr(ctx, "f", "user.none")
		wantErrno(t, "GetXattr missing", err, syscall.ENODATA)
		if names, err := tr.ListXattr(ctx, "f"); err != nil || fmt.Sprint(names) != "[user.k]" {
			t.Errorf("ListXattr: %v %v", names, err)
		}
		if err := tr.RemoveXattr(ctx, "f", "user.k"); err != nil {
			t.Errorf("RemoveXattr: %v", err)
		}
		wantErrno(t, "RemoveXattr missing", tr.RemoveXattr(ctx, "f", "user.k"), syscall.ENODATA)
		// On the root, too.
		if err := tr.SetXattr(ctx, "", "user.root", []byte("r"), 0); err != nil {
			t.Errorf("SetXattr on root: %v", err)
		}
	})
}

func TestConcurrentRequests(t *testing.T) {
	tr := newEnv(t).tree("data")
	ctx := ctxT(t)
	const n = 64
	errs := each(n, func(i int) error {
		name := fmt.Sprintf("f%02d", i)
		want := bytes.Repeat([]byte{byte(i)}, 1000+i*37)
		h, _, err := tr.Open(ctx, name, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		if _, err := tr.WriteAt(ctx, h, want, 0); err != nil {
			return err
		}
		got := make([]byte, len(want))
		if _, err := tr.ReadAt(ctx, h, got, 0); err != nil || !bytes.Equal(got, want) {
			return fmt.Errorf("%s: read back %v, equal %v", name, err, bytes.Equal(got, want))
		}
		a, err := tr.GetAttr(ctx, name)
		if err != nil || a.Size != uint64(len(want)) {
			return fmt.Errorf("%s: GetAttr %v size %d want %d", name, err, a.Size, len(want))
		}
		return tr.CloseHandle(ctx, h)
	})
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestReadDirLarge(t *testing.T) {
	e := newEnv(t)
	const n = 10_000
	dir := filepath.Join(e.share, "big")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	want := make([]string, n)
	for i := range n {
		want[i] = fmt.Sprintf("entry-with-a-longish-name-%05d", i)
		f, err := os.Create(filepath.Join(dir, want[i]))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	sort.Strings(want)
	tr := e.tree("data")
	ents, err := tr.ReadDir(ctxT(t), "big")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != n {
		t.Fatalf("ReadDir returned %d entries, want %d", len(ents), n)
	}
	for i, de := range ents {
		if de.Name != want[i] || de.Attr.Mode&unix.S_IFMT != unix.S_IFREG {
			t.Fatalf("entry %d = %q mode %o, want %q", i, de.Name, de.Attr.Mode, want[i])
		}
	}
	// It took several pages: one page cannot hold 10,000 entries.
	if n*(2+attrWireSize) <= readDirPage {
		t.Fatal("test does not exercise paging")
	}
}

// TestReadOnlyShare: a read-only share says so at tree connect and refuses
// every change with ACCESS_DENIED (protocol/share's read-only rule), over
// the session channel and through a resume key alike.
func TestReadOnlyShare(t *testing.T) {
	e := newEnv(t)
	tr := e.tree("ro")
	ctx := ctxT(t)
	if !tr.ReadOnly() {
		t.Fatal("tree not read-only")
	}
	denied := func(what string, err error) {
		t.Helper()
		if err != protocol.StatusAccessDenied {
			t.Errorf("%s on a read-only share: %v, want ACCESS_DENIED", what, err)
		}
		wantErrno(t, what, err, syscall.EACCES)
	}
	_, _, err := tr.Open(ctx, "file", os.O_WRONLY, 0)
	denied("Open O_WRONLY", err)
	_, err = tr.Mkdir(ctx, "d", 0o755)
	denied("Mkdir", err)
	denied("Unlink", tr.Unlink(ctx, "file"))
	denied("Rename", tr.Rename(ctx, "file", "g", 0))
	_, err = tr.SetAttr(ctx, "file", 0, SetAttrIn{Valid: SetMode, Mode: 0o777})
	denied("SetAttr", err)
	denied("SetXattr", tr.SetXattr(ctx, "file", "user.x", []byte("1"), 0))

	h, _, err := tr.Open(ctx, "file", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	if n, _ := tr.ReadAt(ctx, h, buf, 0); string(buf[:n]) != "read only" {
		t.Errorf("read %q", buf[:n])
	}
	_, err = tr.WriteAt(ctx, h, []byte("x"), 0)
	denied("WriteAt", err)
	_, err = tr.SetAttr(ctx, "", h, SetAttrIn{Valid: SetSize})
	denied("SetAttr by handle", err)
	rk, err := tr.RequestResumeKey(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	f, err := e.srv.OpenByResumeKey(tr.c.SessionID(), rk.Key)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt([]byte("x"), 0)
	denied("WriteAt through the resume key", err)
	if b, _ := os.ReadFile(filepath.Join(e.dir, "ro", "file")); string(b) != "read only" {
		t.Errorf("read-only file changed: %q", b)
	}
}

func TestOpenRefusesSpecialFiles(t *testing.T) {
	e := newEnv(t)
	if err := unix.Mkfifo(filepath.Join(e.share, "fifo"), 0o644); err != nil {
		t.Skip(err)
	}
	tr := e.tree("data")
	_, _, err := tr.Open(ctxT(t), "fifo", os.O_RDONLY|unix.O_NONBLOCK, 0)
	wantErrno(t, "Open a FIFO", err, syscall.EACCES)
}

// TestReadDirPagingSeesChanges: a continuation page reflects entries added
// after the first page (the listing cache notices the directory changed).
func TestReadDirPagingSeesChanges(t *testing.T) {
	e := newEnv(t)
	for i := range 50 {
		e.writeFile(fmt.Sprintf("f%03d", i), "")
	}
	tr := e.tree("data")
	ctx := ctxT(t)
	page := func(after string) readDirResp {
		var r readDirResp
		if err := tr.call(ctx, CmdReadDir, &readDirReq{After: after, MaxBytes: 10 * (2 + 4 + attrWireSize)}, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	p1 := page("")
	if !p1.More || len(p1.Entries) != 9 {
		t.Fatalf("first page: %d entries, more %v", len(p1.Entries), p1.More)
	}
	last := p1.Entries[len(p1.Entries)-1].Name
	p2 := page(last)
	if p2.Entries[0].Name != "f009" {
		t.Errorf("second page starts at %s", p2.Entries[0].Name)
	}
	e.writeFile("f0095", "") // sorts right after f009
	p3 := page("f009")
	if p3.Entries[0].Name != "f0095" {
		t.Errorf("page after a change starts at %s, want f0095", p3.Entries[0].Name)
	}
}

// TestCreateModeIgnoresServerUmask: modes arrive already masked by the
// client's umask; the server's umask must not take more bits.
func TestCreateModeIgnoresServerUmask(t *testing.T) {
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	e := newEnv(t)
	unix.Umask(old) // the server read it at NewServer
	tr := e.tree("data")
	ctx := ctxT(t)
	if a, err := tr.Mkdir(ctx, "d", 0o775); err != nil || a.Mode&07777 != 0o775 {
		t.Errorf("Mkdir 0775: %v %o", err, a.Mode&07777)
	}
	h, a, err := tr.Open(ctx, "f", os.O_WRONLY|os.O_CREATE, 0o664)
	if err != nil || a.Mode&07777 != 0o664 {
		t.Errorf("create 0664: %v %o", err, a.Mode&07777)
	}
	tr.CloseHandle(ctx, h)
	// Opening the existing file with O_CREAT leaves its mode alone.
	os.Chmod(filepath.Join(e.share, "f"), 0o600)
	h, a, err = tr.Open(ctx, "f", os.O_WRONLY|os.O_CREATE, 0o664)
	if err != nil || a.Mode&07777 != 0o600 {
		t.Errorf("O_CREAT on existing: %v %o", err, a.Mode&07777)
	}
	tr.CloseHandle(ctx, h)
	h, a, err = tr.Open(ctx, "g", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
	if err != nil || a.Mode&07777 != 0o666 {
		t.Errorf("O_EXCL create 0666: %v %o", err, a.Mode&07777)
	}
	tr.CloseHandle(ctx, h)
}

func TestMaxHandles(t *testing.T) {
	e := newEnv(t, func(c *ServerConfig) { c.MaxHandles = 3 })
	e.writeFile("f", "")
	tr := e.tree("data")
	ctx := ctxT(t)
	var hs []Handle
	for range 3 {
		hs = append(hs, e.open(tr, "f", os.O_RDONLY))
	}
	_, _, err := tr.Open(ctx, "f", os.O_RDONLY, 0)
	if err != ntstatus.TooManyOpenedFiles || ToErrno(err) != syscall.EMFILE {
		t.Errorf("open beyond MaxHandles: %v, want TOO_MANY_OPENED_FILES (EMFILE)", err)
	}
	tr.CloseHandle(ctx, hs[0])
	if _, _, err := tr.Open(ctx, "f", os.O_RDONLY, 0); err != nil {
		t.Errorf("open after a close: %v", err)
	}
}

// TestHandleLimits: a user over its own limit, over all its sessions, gets
// EMFILE while another user goes on; the server's limit for everyone gives
// ENFILE; closing, or ending a session, gives the handles back.
func TestHandleLimits(t *testing.T) {
	e := newEnv(t, func(c *ServerConfig) { c.MaxUserHandles = 4; c.MaxOpenFiles = 6 })
	e.writeFile("f", "")
	ctx := ctxT(t)
	open := func(tr *Tree) error {
		_, _, err := tr.Open(ctx, "f", os.O_RDONLY, 0)
		return err
	}
	alice1, alice2 := e.tree("data"), e.tree("data")
	for i, tr := range []*Tree{alice1, alice1, alice2, alice2} {
		if err := open(tr); err != nil {
			t.Fatalf("alice's open %d: %v", i, err)
		}
	}
	if err := open(alice2); ToErrno(err) != syscall.EMFILE {
		t.Errorf("alice's fifth open over two sessions: %v, want EMFILE", err)
	}
	if !e.waitLogged("open refused: handle limit reached") {
		t.Error("no log line for the limit")
	}
	bobs := e.treeAs("bob", "bob's", "data")
	for i := range 2 {
		if err := open(bobs); err != nil {
			t.Errorf("bob's open %d while alice is at her limit: %v", i, err)
		}
	}
	if err := open(bobs); ToErrno(err) != syscall.ENFILE {
		t.Errorf("an open beyond the server's limit: %v, want ENFILE", err)
	}
	alice1.Client().Close()
	deadline := time.Now().Add(10 * time.Second)
	for open(bobs) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the handles of alice's ended session did not come back")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWriteAppend(t *testing.T) {
	e := newEnv(t)
	e.writeFile("log", "one\n")
	tr := e.tree("data")
	ctx := ctxT(t)
	h, _, err := tr.Open(ctx, "log", os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.WriteAt(ctx, h, []byte("two\n"), 0); err != nil {
		t.Fatalf("write to an O_APPEND handle: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.share, "log")); string(b) != "one\ntwo\n" {
		t.Errorf("log = %q", b)
	}
}

// BenchmarkFallbackRead measures 1 MiB reads over the session channel on
// loopback, signing both ways included.
func BenchmarkFallbackRead(b *testing.B) {
	e := newEnv(b)
	e.writeFile("big", string(make([]byte, 1<<20)))
	tr := e.tree("data")
	ctx := ctxT(b)
	h, _, err := tr.Open(ctx, "big", os.O_RDONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	b.SetBytes(1 << 20)
	b.ResetTimer()
	for range b.N {
		if _, err := tr.ReadAt(ctx, h, buf, 0); err != nil {
			b.Fatal(err)
		}
	}
}
