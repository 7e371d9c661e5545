package fs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// dirTree is a fake Tree over a local directory: enough of the session
// server's semantics to run the node tree under a real FUSE mount without
// the session channel. Errors are syscall.Errno, as the real client's map
// back to.
type dirTree struct {
	root string

	mu      sync.Mutex
	next    session.Handle
	handles map[session.Handle]*os.File
	calls   map[string]int
}

func newDirTree(root string) *dirTree {
	return &dirTree{root: root, handles: map[session.Handle]*os.File{}, calls: map[string]int{}}
}

func (t *dirTree) count(op string) {
	t.mu.Lock()
	t.calls[op]++
	t.mu.Unlock()
}

func (t *dirTree) callCount(op string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.calls[op]
}

func (t *dirTree) openHandles() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.handles)
}

func (t *dirTree) abs(p string) string {
	if strings.Contains("/"+p+"/", "/../") {
		panic("path escapes: " + p)
	}
	return filepath.Join(t.root, p)
}

func errOf(err error) error {
	if err == nil {
		return nil
	}
	if pe, ok := err.(*os.PathError); ok {
		err = pe.Err
	}
	if le, ok := err.(*os.LinkError); ok {
		err = le.Err
	}
	if se, ok := err.(*os.SyscallError); ok {
		err = se.Err
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return err
}

func attrOf(st *syscall.Stat_t) session.Attr {
	return session.Attr{
		Ino: st.Ino, Mode: st.Mode, Nlink: uint32(st.Nlink), Uid: st.Uid, Gid: st.Gid,
		Rdev: uint32(st.Rdev), Blksize: uint32(st.Blksize), Size: uint64(st.Size), Blocks: uint64(st.Blocks),
		Atime: time.Unix(st.Atim.Unix()), Mtime: time.Unix(st.Mtim.Unix()), Ctime: time.Unix(st.Ctim.Unix()),
	}
}

func (t *dirTree) lstat(p string) (session.Attr, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(t.abs(p), &st); err != nil {
		return session.Attr{}, errOf(err)
	}
	return attrOf(&st), nil
}

func (t *dirTree) GetAttr(ctx context.Context, p string) (session.Attr, error) {
	t.count("getattr")
	return t.lstat(p)
}

func (t *dirTree) file(h session.Handle) (*os.File, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f, ok := t.handles[h]
	if !ok {
		return nil, syscall.EBADF
	}
	return f, nil
}

func (t *dirTree) SetAttr(ctx context.Context, p string, h session.Handle, in session.SetAttrIn) (session.Attr, error) {
	t.count("setattr")
	name := t.abs(p)
	var f *os.File
	if h != 0 {
		var err error
		if f, err = t.file(h); err != nil {
			return session.Attr{}, err
		}
	}
	var err error
	if in.Valid&session.SetMode != 0 {
		t.count("chmod")
		if f != nil { // by handle, as the server does when given one
			err = syscall.Fchmod(int(f.Fd()), in.Mode&07777)
		} else {
			err = syscall.Chmod(name, in.Mode&07777) // set-id bits too (os.FileMode has its own)
		}
	}
	if err == nil && in.Valid&(session.SetUid|session.SetGid) != 0 {
		uid, gid := -1, -1
		if in.Valid&session.SetUid != 0 {
			uid = int(in.Uid)
		}
		if in.Valid&session.SetGid != 0 {
			gid = int(in.Gid)
		}
		if f != nil {
			err = f.Chown(uid, gid)
		} else {
			err = os.Lchown(name, uid, gid)
		}
	}
	if err == nil && in.Valid&session.SetSize != 0 {
		if f != nil {
			err = f.Truncate(int64(in.Size))
		} else {
			err = os.Truncate(name, int64(in.Size))
		}
	}
	if err == nil && in.Valid&(session.SetAtime|session.SetMtime) != 0 {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if in.Valid&session.SetAtime != 0 {
			ts[0] = timespec(in.Atime, in.AtimeNow)
		}
		if in.Valid&session.SetMtime != 0 {
			ts[1] = timespec(in.Mtime, in.MtimeNow)
		}
		err = unix.UtimesNanoAt(unix.AT_FDCWD, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return session.Attr{}, errOf(err)
	}
	if f != nil {
		var st syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
			return session.Attr{}, errOf(err)
		}
		return attrOf(&st), nil
	}
	return t.lstat(p)
}

func timespec(t time.Time, now bool) unix.Timespec {
	if now {
		return unix.Timespec{Nsec: unix.UTIME_NOW}
	}
	return unix.NsecToTimespec(t.UnixNano())
}

func (t *dirTree) ReadDir(ctx context.Context, p string) ([]session.DirEntry, error) {
	t.count("readdir")
	des, err := os.ReadDir(t.abs(p))
	if err != nil {
		return nil, errOf(err)
	}
	out := make([]session.DirEntry, 0, len(des))
	for _, de := range des {
		a, err := t.lstat(joinPath(p, de.Name()))
		if err != nil {
			continue
		}
		out = append(out, session.DirEntry{Name: de.Name(), Attr: a})
	}
	return out, nil
}

func (t *dirTree) Mkdir(ctx context.Context, p string, mode uint32) (session.Attr, error) {
	if err := syscall.Mkdir(t.abs(p), mode); err != nil {
		return session.Attr{}, errOf(err)
	}
	return t.lstat(p)
}

func (t *dirTree) Rmdir(ctx context.Context, p string) error { return errOf(syscall.Rmdir(t.abs(p))) }

func (t *dirTree) Open(ctx context.Context, p string, flags int, mode uint32) (session.Handle, session.Attr, error) {
	t.count("open")
	f, err := os.OpenFile(t.abs(p), flags|syscall.O_NOFOLLOW, os.FileMode(mode&0777))
	if err != nil {
		return 0, session.Attr{}, errOf(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return 0, session.Attr{}, errOf(err)
	}
	t.mu.Lock()
	t.next++
	h := t.next
	t.handles[h] = f
	t.mu.Unlock()
	return h, attrOf(&st), nil
}

func (t *dirTree) CloseHandle(ctx context.Context, h session.Handle) error {
	t.count("close")
	t.mu.Lock()
	f, ok := t.handles[h]
	delete(t.handles, h)
	t.mu.Unlock()
	if !ok {
		return syscall.EBADF
	}
	return errOf(f.Close())
}

func (t *dirTree) Unlink(ctx context.Context, p string) error { return errOf(syscall.Unlink(t.abs(p))) }

func (t *dirTree) Rename(ctx context.Context, o, n string, flags uint32) error {
	return errOf(unix.Renameat2(unix.AT_FDCWD, t.abs(o), unix.AT_FDCWD, t.abs(n), uint(flags)))
}

func (t *dirTree) Symlink(ctx context.Context, target, p string) (session.Attr, error) {
	if err := os.Symlink(target, t.abs(p)); err != nil {
		return session.Attr{}, errOf(err)
	}
	return t.lstat(p)
}

func (t *dirTree) Readlink(ctx context.Context, p string) (string, error) {
	s, err := os.Readlink(t.abs(p))
	return s, errOf(err)
}

func (t *dirTree) Link(ctx context.Context, o, n string) (session.Attr, error) {
	if err := os.Link(t.abs(o), t.abs(n)); err != nil {
		return session.Attr{}, errOf(err)
	}
	return t.lstat(n)
}

func (t *dirTree) StatFS(ctx context.Context) (session.StatFS, error) {
	var s syscall.Statfs_t
	if err := syscall.Statfs(t.root, &s); err != nil {
		return session.StatFS{}, errOf(err)
	}
	return session.StatFS{Blocks: s.Blocks, Bfree: s.Bfree, Bavail: s.Bavail, Files: s.Files, Ffree: s.Ffree,
		Bsize: uint32(s.Bsize), Frsize: uint32(s.Frsize), NameLen: uint32(s.Namelen)}, nil
}

func (t *dirTree) Fsync(ctx context.Context, h session.Handle, datasync bool) error {
	t.count("fsync")
	f, err := t.file(h)
	if err != nil {
		return err
	}
	return errOf(f.Sync())
}

func (t *dirTree) GetXattr(ctx context.Context, p, name string) ([]byte, error) {
	sz, err := unix.Lgetxattr(t.abs(p), name, nil)
	if err != nil {
		return nil, errOf(err)
	}
	b := make([]byte, sz)
	sz, err = unix.Lgetxattr(t.abs(p), name, b)
	return b[:max(sz, 0)], errOf(err)
}

func (t *dirTree) SetXattr(ctx context.Context, p, name string, v []byte, flags int) error {
	return errOf(unix.Lsetxattr(t.abs(p), name, v, flags))
}

func (t *dirTree) ListXattr(ctx context.Context, p string) ([]string, error) {
	b := make([]byte, 64<<10)
	n, err := unix.Llistxattr(t.abs(p), b)
	if err != nil {
		return nil, errOf(err)
	}
	var names []string
	for _, s := range strings.Split(string(b[:n]), "\x00") {
		if s != "" {
			names = append(names, s)
		}
	}
	return names, nil
}

func (t *dirTree) RemoveXattr(ctx context.Context, p, name string) error {
	return errOf(unix.Lremovexattr(t.abs(p), name))
}

func (t *dirTree) ReadAt(ctx context.Context, h session.Handle, p []byte, off int64) (int, error) {
	f, err := t.file(h)
	if err != nil {
		return 0, err
	}
	n, err := f.ReadAt(p, off)
	if isEOF(err) {
		err = nil
	}
	return n, errOf(err)
}

func (t *dirTree) WriteAt(ctx context.Context, h session.Handle, p []byte, off int64) (int, error) {
	f, err := t.file(h)
	if err != nil {
		return 0, err
	}
	if off < 0 { // an append, as the server places it
		n, err := unix.Pwritev2(int(f.Fd()), [][]byte{p}, -1, unix.RWF_APPEND)
		return n, errOf(err)
	}
	n, err := f.WriteAt(p, off)
	return n, errOf(err)
}

// countingData wraps a DataPath and counts attaches and data closes, as
// LWIO REGISTER and CLOSE would be.
type countingData struct {
	DataPath
	mu              sync.Mutex
	attached, close int
	writes, reads   int
	maxWrite        int
}

func (c *countingData) Attach(ctx context.Context, h session.Handle, flags int) (DataFile, error) {
	d, err := c.DataPath.Attach(ctx, h, flags)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.attached++
	c.mu.Unlock()
	return &countingFile{DataFile: d, c: c}, nil
}

func (c *countingData) stats() (attached, closed, reads, writes, maxWrite int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.attached, c.close, c.reads, c.writes, c.maxWrite
}

type countingFile struct {
	DataFile
	c *countingData
}

func (f *countingFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	f.c.mu.Lock()
	f.c.reads++
	f.c.mu.Unlock()
	return f.DataFile.ReadAt(ctx, p, off)
}

func (f *countingFile) ReadBuf(ctx context.Context, dest []byte, off int64) (Buffer, error) {
	f.c.mu.Lock()
	f.c.reads++
	f.c.mu.Unlock()
	return f.DataFile.ReadBuf(ctx, dest, off)
}

func (f *countingFile) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	f.c.mu.Lock()
	f.c.writes++
	f.c.maxWrite = max(f.c.maxWrite, len(p))
	f.c.mu.Unlock()
	return f.DataFile.WriteAt(ctx, p, off)
}

func (f *countingFile) Close(ctx context.Context) error {
	f.c.mu.Lock()
	f.c.close++
	f.c.mu.Unlock()
	return f.DataFile.Close(ctx)
}
