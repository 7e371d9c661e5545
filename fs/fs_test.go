package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/session"
)

func TestTranslateError(t *testing.T) {
	log, hook := test.NewNullLogger()
	for _, tc := range []struct {
		err    error
		want   syscall.Errno
		logged bool
	}{
		{nil, 0, false},
		{protocol.StatusObjectNameNotFound, syscall.ENOENT, false},
		{fmt.Errorf("open x: %w", protocol.StatusObjectNameCollision), syscall.EEXIST, false},
		{protocol.StatusDirectoryNotEmpty, syscall.ENOTEMPTY, false},
		{protocol.StatusAccessDenied, syscall.EACCES, false},
		{syscall.EXDEV, syscall.EXDEV, false},
		{protocol.StatusIOError, syscall.EIO, false},
		{context.Canceled, syscall.EINTR, false},
		{context.DeadlineExceeded, syscall.ETIMEDOUT, false},
		{&protocol.ConnectionError{Conn: "softrdma 127.0.0.1:1", Err: errors.New("reset")}, syscall.ENOTCONN, false},
		{errors.New("something odd"), syscall.EIO, true},
		{protocol.Status(0xC0001234), syscall.EIO, true},
	} {
		hook.Reset()
		if got := translateError(log, "op", "p", tc.err); got != tc.want {
			t.Errorf("translateError(%v) = %v, want %v", tc.err, got, tc.want)
		}
		if logged := len(hook.Entries) > 0; logged != tc.logged {
			t.Errorf("translateError(%v): logged %v, want %v", tc.err, logged, tc.logged)
		}
	}
}

func TestKeepCache(t *testing.T) {
	t0 := time.Unix(1700000000, 5)
	a := session.Attr{Size: 10, Mtime: t0}
	for _, tc := range []struct {
		name   string
		cached validator
		fresh  session.Attr
		want   bool
	}{
		{"nothing cached", validator{}, a, false},
		{"unchanged", validatorOf(a), a, true},
		{"size changed", validatorOf(a), session.Attr{Size: 11, Mtime: t0}, false},
		{"mtime changed", validatorOf(a), session.Attr{Size: 10, Mtime: t0.Add(time.Nanosecond)}, false},
	} {
		if got := keepCache(tc.cached, tc.fresh); got != tc.want {
			t.Errorf("%s: keepCache = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSetAttrIn(t *testing.T) {
	var in fuse.SetAttrIn
	in.Valid = fuse.FATTR_MODE | fuse.FATTR_SIZE | fuse.FATTR_ATIME | fuse.FATTR_ATIME_NOW | fuse.FATTR_MTIME
	in.Mode = syscall.S_IFREG | 04755
	in.Size = 42
	in.Mtime, in.Mtimensec = 1700000000, 7
	s := setAttrIn(&in)
	want := session.SetAttrIn{Valid: session.SetMode | session.SetSize | session.SetAtime | session.SetMtime,
		Mode: 04755, Size: 42, AtimeNow: true, Mtime: time.Unix(1700000000, 7)}
	if s.Valid != want.Valid || s.Mode != want.Mode || s.Size != want.Size || s.AtimeNow != want.AtimeNow ||
		s.MtimeNow || !s.Mtime.Equal(want.Mtime) {
		t.Errorf("setAttrIn = %+v, want %+v", s, want)
	}
}

func TestMountOptions(t *testing.T) {
	o := Options{AttrTimeout: 2 * time.Second, ReadOnly: true}.MountOptions()
	if o.MaxWrite != 1<<20 || o.MaxReadAhead != 1<<20 || o.MaxBackground < 64 {
		t.Errorf("sizes: MaxWrite %d MaxReadAhead %d MaxBackground %d", o.MaxWrite, o.MaxReadAhead, o.MaxBackground)
	}
	if o.ExtraCapabilities&fuse.CAP_ASYNC_DIO == 0 || o.ExtraCapabilities&fuse.CAP_WRITEBACK_CACHE != 0 {
		t.Errorf("ExtraCapabilities %#x: want ASYNC_DIO and no WRITEBACK_CACHE", o.ExtraCapabilities)
	}
	if o.DisabledCapabilities&fuse.CAP_PASSTHROUGH == 0 || !o.DirectMount || !o.IgnoreSecurityLabels {
		t.Errorf("want passthrough disabled, DirectMount, IgnoreSecurityLabels")
	}
	if *o.AttrTimeout != 2*time.Second || *o.EntryTimeout != 0 {
		t.Errorf("timeouts %v %v", *o.AttrTimeout, *o.EntryTimeout)
	}
	if !slices.Equal(o.Options, []string{"nosuid", "nodev", "ro"}) {
		t.Errorf("Options %v, want [nosuid nodev ro]", o.Options)
	}
	// allow_other alone leaves the checks to the server (as the account
	// each caller acts as); default_permissions is its own option.
	if o := (Options{AllowOther: true, NoExec: true}).MountOptions(); !o.AllowOther ||
		!slices.Equal(o.Options, []string{"nosuid", "nodev", "noexec"}) {
		t.Errorf("allow_other, noexec: AllowOther %v, Options %v; want nosuid nodev noexec, no default_permissions", o.AllowOther, o.Options)
	}
	if o := (Options{DefaultPermissions: true}).MountOptions(); !slices.Equal(o.Options, []string{"nosuid", "nodev", "default_permissions"}) {
		t.Errorf("DefaultPermissions: Options %v; want nosuid nodev default_permissions", o.Options)
	}
}

// mountFake mounts a dirTree over backing at a fresh mountpoint.
func mountFake(t *testing.T, backing string, opts Options) (string, *dirTree, *countingData) {
	t.Helper()
	mnt, tree, data, _ := mountFakeRoot(t, backing, opts)
	return mnt, tree, data
}

// mountFakeRoot is mountFake that also returns the mount's root node.
func mountFakeRoot(t *testing.T, backing string, opts Options) (string, *dirTree, *countingData, *Node) {
	t.Helper()
	if testing.Short() {
		t.Skip("mounts FUSE")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and /dev/fuse")
	}
	mnt := t.TempDir()
	tree := newDirTree(backing)
	data := &countingData{DataPath: SessionDataPath(tree)}
	if opts.Logger == nil {
		l := logrus.New()
		l.SetLevel(logrus.WarnLevel)
		opts.Logger = l
	}
	root := NewRoot(tree, data, opts)
	srv, err := mountRoot(mnt, root, opts)
	mounted(t, srv, err)
	return mnt, tree, data, root
}

// mounted fails the test at once if a mount failed, and unmounts it when
// the test ends; an unmount that fails is an error of the test.
func mounted(t *testing.T, srv *Server, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
}

func TestMountPOSIX(t *testing.T) {
	backing := t.TempDir()
	mnt, tree, data, root := mountFakeRoot(t, backing, Options{AttrTimeout: time.Second, EntryTimeout: time.Second})
	p := func(s string) string { return filepath.Join(mnt, s) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	wantErrno := func(err error, want syscall.Errno) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Fatalf("got %v, want %v", err, want)
		}
	}

	// create / write / read / append
	must(os.WriteFile(p("a"), []byte("hello"), 0o644))
	f, err := os.OpenFile(p("a"), os.O_APPEND|os.O_WRONLY, 0)
	must(err)
	_, err = f.WriteString(" world")
	must(err)
	must(f.Close())
	got, err := os.ReadFile(p("a"))
	must(err)
	if string(got) != "hello world" {
		t.Fatalf("read %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(backing, "a")); string(b) != "hello world" {
		t.Fatalf("backing has %q", b)
	}
	// truncate, chmod, utimens
	must(os.Truncate(p("a"), 5))
	must(os.Chmod(p("a"), 0o600))
	mt := time.Unix(1600000000, 0)
	must(os.Chtimes(p("a"), mt, mt))
	st, err := os.Stat(p("a"))
	must(err)
	if st.Size() != 5 || st.Mode().Perm() != 0o600 || !st.ModTime().Equal(mt) {
		t.Fatalf("stat: size %d mode %v mtime %v", st.Size(), st.Mode(), st.ModTime())
	}
	// rename over an existing file, and RENAME_NOREPLACE
	must(os.WriteFile(p("b"), []byte("bbb"), 0o644))
	must(os.Rename(p("a"), p("b")))
	if b, _ := os.ReadFile(p("b")); string(b) != "hello" {
		t.Fatalf("after rename: %q", b)
	}
	must(os.WriteFile(p("c"), nil, 0o644))
	wantErrno(unix.Renameat2(unix.AT_FDCWD, p("c"), unix.AT_FDCWD, p("b"), unix.RENAME_NOREPLACE), syscall.EEXIST)
	// unlink of an open file: I/O on the handle goes on
	f, err = os.OpenFile(p("c"), os.O_RDWR, 0)
	must(err)
	must(os.Remove(p("c")))
	_, err = f.WriteAt([]byte("still here"), 0)
	must(err)
	buf := make([]byte, 10)
	_, err = f.ReadAt(buf, 0)
	must(err)
	if string(buf) != "still here" {
		t.Fatalf("unlinked read %q", buf)
	}
	fi, err := f.Stat()
	must(err)
	if fi.Size() != 10 {
		t.Fatalf("fstat of unlinked file: size %d", fi.Size())
	}
	must(f.Close())
	// mkdir, rmdir non-empty, readdir
	must(os.Mkdir(p("d"), 0o755))
	must(os.WriteFile(p("d/x"), []byte("x"), 0o644))
	wantErrno(syscall.Rmdir(p("d")), syscall.ENOTEMPTY)
	wantErrno(syscall.Mkdir(p("d"), 0o755), syscall.EEXIST)
	_, err = os.Stat(p("nope"))
	wantErrno(err, syscall.ENOENT)
	// symlink, readlink, hard link
	must(os.Symlink("d/x", p("s")))
	if tgt, err := os.Readlink(p("s")); err != nil || tgt != "d/x" {
		t.Fatalf("readlink %q %v", tgt, err)
	}
	if b, err := os.ReadFile(p("s")); err != nil || string(b) != "x" {
		t.Fatalf("through symlink %q %v", b, err)
	}
	must(os.Link(p("b"), p("hard")))
	st1, _ := os.Stat(p("b"))
	st2, _ := os.Stat(p("hard"))
	if !os.SameFile(st1, st2) || st2.Sys().(*syscall.Stat_t).Nlink != 2 {
		t.Fatalf("hard link: not the same file / nlink")
	}
	// xattrs
	must(unix.Setxattr(p("b"), "user.k", []byte("v1"), 0))
	xb := make([]byte, 16)
	n, err := unix.Getxattr(p("b"), "user.k", xb)
	must(err)
	if string(xb[:n]) != "v1" {
		t.Fatalf("getxattr %q", xb[:n])
	}
	n, err = unix.Listxattr(p("b"), xb)
	must(err)
	if !bytes.Contains(xb[:n], []byte("user.k\x00")) {
		t.Fatalf("listxattr %q", xb[:n])
	}
	// security.* is the server host's policy: not shown, not settable,
	// and no round trip (ls -l asks for security.selinux of every file).
	must(unix.Setxattr(filepath.Join(backing, "b"), "security.lwio-test", []byte("x"), 0))
	_, err = unix.Getxattr(p("b"), "security.lwio-test", xb)
	wantErrno(err, syscall.ENODATA)
	n, err = unix.Listxattr(p("b"), xb)
	must(err)
	if bytes.Contains(xb[:n], []byte("security.")) {
		t.Fatalf("listxattr shows %q", xb[:n])
	}
	wantErrno(unix.Setxattr(p("b"), "security.lwio-test", []byte("y"), 0), syscall.EOPNOTSUPP)
	must(unix.Removexattr(p("b"), "user.k"))
	_, err = unix.Getxattr(p("b"), "user.k", xb)
	wantErrno(err, syscall.ENODATA)
	// statfs
	var sfs syscall.Statfs_t
	must(syscall.Statfs(mnt, &sfs))
	if sfs.Blocks == 0 || sfs.Bsize == 0 {
		t.Fatalf("statfs %+v", sfs)
	}
	// fsync reaches the server
	f, err = os.OpenFile(p("b"), os.O_RDWR, 0)
	must(err)
	must(f.Sync())
	must(f.Close())
	if tree.callCount("fsync") == 0 {
		t.Errorf("fsync did not reach the tree")
	}

	// readdir of many entries, with attributes from the listing
	many := filepath.Join(backing, "many")
	must(os.Mkdir(many, 0o755))
	for i := range 2000 {
		must(os.WriteFile(filepath.Join(many, fmt.Sprintf("f%05d", i)), nil, 0o644))
	}
	// The first 100 entries are stat'ed as soon as they are read, not
	// after the whole listing: under a loaded machine the 2000-entry
	// listing can outlast the attribute timeout of its first entries; a
	// measure is taken again, up to three times, on a fresh listing.
	// Without the listing's attributes every one costs about 100.
	// The tree counts a LOOKUP's stat as a GETATTR: an entry whose dentry
	// the kernel dropped between the listing and its stat (memory
	// pressure, drop_caches) is looked up again, as it would be without
	// a listing. Those are told apart by their node: the kernel forgot
	// the one the listing made, and the stat's lookup made another.
	var dir *os.File
	var ents []os.DirEntry
	var d, dropped int
	for range 3 {
		before := tree.callCount("getattr")
		if dir != nil {
			must(dir.Close())
		}
		dir, err = os.Open(p("many"))
		must(err)
		ents, err = dir.ReadDir(100)
		must(err)
		manyNode := root.GetChild("many") // pinned: dir holds it open
		listed := make([]*gofs.Inode, len(ents))
		for i, e := range ents {
			listed[i] = manyNode.GetChild(e.Name())
		}
		dropped = 0
		for i, e := range ents {
			if _, err := e.Info(); err != nil {
				t.Fatal(err)
			}
			// nil: forgotten again after the stat, which cost
			// nothing more then
			if c := manyNode.GetChild(e.Name()); c != nil && c != listed[i] {
				dropped++
			}
		}
		if d = tree.callCount("getattr") - before - dropped; d <= 50 {
			break
		}
	}
	if d > 50 {
		t.Errorf("readdir + stat of 100 entries cost %d GETATTRs (and %d lookups of entries the kernel dropped); want the listing's attributes used", d, dropped)
	}
	t.Logf("readdir + stat of 100 entries: %d GETATTRs, %d lookups of dropped entries", d, dropped)
	rest, err := dir.ReadDir(-1)
	must(err)
	must(dir.Close())
	if n := len(ents) + len(rest); n != 2000 {
		t.Fatalf("readdir: %d entries", n)
	}

	// An open that moves no data attaches no data path (no REGISTER).
	time.Sleep(100 * time.Millisecond)
	before, _, _, _, _ := data.stats()
	for i := range 20 {
		g, err := os.Create(p(fmt.Sprintf("touched%d", i)))
		must(err)
		must(g.Chmod(0o600))
		must(g.Close())
	}
	if after, _, _, _, _ := data.stats(); after != before {
		t.Errorf("20 opens without I/O attached the data path %d times", after-before)
	}

	// every open was released: data closes match attaches, no handle
	// left. RELEASE is asynchronous (the kernel's, after close(2)
	// returned): wait for it as long as a loaded machine may need.
	released := func() bool {
		attached, closed, _, _, _ := data.stats()
		return attached != 0 && attached == closed && tree.openHandles() == 0
	}
	for deadline := time.Now().Add(10 * time.Second); !released() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	attached, closed, _, _, _ := data.stats()
	if attached == 0 || attached != closed || tree.openHandles() != 0 {
		t.Errorf("attached %d, data closed %d, session handles open %d", attached, closed, tree.openHandles())
	}
}

// TestLargeRequests checks that the kernel sends 1 MiB writes, one per
// request, so an LWIO request carries a whole FUSE request.
func TestLargeRequests(t *testing.T) {
	backing := t.TempDir()
	mnt, _, data := mountFake(t, backing, Options{AttrTimeout: time.Second, EntryTimeout: time.Second})
	big := bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16)
	if err := os.WriteFile(filepath.Join(mnt, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(mnt, "big"))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, big))
	}
	if _, _, _, writes, maxWrite := data.stats(); maxWrite != 1<<20 {
		t.Errorf("largest write %d bytes in %d writes, want 1 MiB", maxWrite, writes)
	}
}

// TestCloseToOpen runs two mounts of one share: a file rewritten and closed
// on one is read whole on the other, though the other had cached the old
// content and its attribute timeout has not run out.
func TestCloseToOpen(t *testing.T) {
	backing := t.TempDir()
	opts := Options{AttrTimeout: time.Minute, EntryTimeout: time.Minute}
	a, _, _ := mountFake(t, backing, opts)
	b, _, _ := mountFake(t, backing, opts)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(a, "f"), []byte("version one"), 0o644))
	for range 2 { // the second read is served from b's page cache
		got, err := os.ReadFile(filepath.Join(b, "f"))
		must(err)
		if string(got) != "version one" {
			t.Fatalf("b reads %q", got)
		}
	}
	must(os.WriteFile(filepath.Join(a, "f"), []byte("version two, longer"), 0o644))
	got, err := os.ReadFile(filepath.Join(b, "f"))
	must(err)
	if string(got) != "version two, longer" {
		t.Fatalf("close-to-open: b reads %q after a rewrote the file", got)
	}
	// The open-time decision: first open and changed file drop the cache,
	// an unchanged reopen keeps it, a local write forgets the validator.
	n := &Node{fs: &filesystem{}}
	fresh := session.Attr{Size: 1, Mtime: time.Unix(1, 0)}
	if n.keepCache(fresh) {
		t.Errorf("first open kept the cache")
	}
	if !n.keepCache(fresh) {
		t.Errorf("unchanged reopen dropped the cache")
	}
	(&fileHandle{node: n}).dirty()
	if n.keepCache(fresh) {
		t.Errorf("reopen after a local write kept the cache")
	}
}
