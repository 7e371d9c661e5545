package share

import (
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

// File is an open file as the servers move its bytes: the LWIO engine
// reads and writes a registered file (a Fid) through it, and the session
// channel's READ and WRITE do too. It is defined here, once; *OpenFile
// implements it, and a test may wrap one (holding requests, counting
// registrations). ReadAt and WriteAt may be called concurrently; their
// errors are protocol.Status values, and ReadAt returns io.EOF at end of
// file as io.ReaderAt does.
type File interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
}

// OpenFile is a file or directory a Tree opened. Its methods are safe for
// concurrent use; after Close they fail with STATUS_FILE_CLOSED.
type OpenFile struct {
	tree     *Tree
	f        *os.File
	readOnly bool // opened O_RDONLY or on a read-only share
}

var _ File = (*OpenFile)(nil)

// openFlagsAllowed are the open(2) flags a client may pass.
const openFlagsAllowed = unix.O_ACCMODE | unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC |
	unix.O_APPEND | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_SYNC | unix.O_DSYNC |
	unix.O_NOATIME | unix.O_NONBLOCK

// Open opens (with O_CREAT, creates) p with open(2) flags and mode and
// returns it with its attributes. A final symlink is followed, confined to
// the share, unless flags has O_NOFOLLOW. Only regular files and
// directories are served: a FIFO, socket or device node in a share must
// not become a door to the server's hardware (STATUS_ACCESS_DENIED).
func (t *Tree) Open(p string, flags int, mode uint32) (*OpenFile, Attr, error) {
	flags &= openFlagsAllowed
	acc := flags & unix.O_ACCMODE
	if acc == unix.O_ACCMODE {
		return nil, Attr{}, fail(unix.EINVAL)
	}
	if acc != unix.O_RDONLY || flags&(unix.O_CREAT|unix.O_TRUNC) != 0 {
		if err := t.writable(); err != nil {
			return nil, Attr{}, err
		}
	}
	fd, a, err := t.open(p, flags, mode&07777)
	if err != nil {
		return nil, Attr{}, fail(err)
	}
	return &OpenFile{tree: t, f: os.NewFile(uintptr(fd), p), readOnly: acc == unix.O_RDONLY || t.sh.ReadOnly}, a, nil
}

// open opens p, puts back the permission bits the server's umask took from
// a file it created, and refuses what is neither a file nor a directory.
func (t *Tree) open(p string, flags int, mode uint32) (int, Attr, error) {
	fd, created, err := t.create(p, flags, mode)
	if err != nil {
		return -1, Attr{}, err
	}
	return t.opened(fd, created, mode)
}

// opened finishes an open of fd: the umask fix-up when it created the
// file, and the refusal of what is neither a file nor a directory. It
// closes fd when it fails.
func (t *Tree) opened(fd int, created bool, mode uint32) (int, Attr, error) {
	var st unix.Stat_t
	err := unix.Fstat(fd, &st)
	if lost := mode & 0o777 & t.sh.umask; err == nil && created && lost != 0 {
		if err = unix.Fchmod(fd, (st.Mode&07777)|lost); err == nil {
			err = unix.Fstat(fd, &st)
		}
	}
	if typ := st.Mode & unix.S_IFMT; err == nil && typ != unix.S_IFREG && typ != unix.S_IFDIR {
		err = unix.EACCES
	}
	if err != nil {
		unix.Close(fd)
		return -1, Attr{}, err
	}
	return fd, attrFromStat(&st), nil
}

// create opens p, telling whether it created the file when that matters
// (O_CREAT with a umask that would take bits from mode): it first tries
// O_EXCL, then opens the existing file without O_CREAT.
func (t *Tree) create(p string, flags int, mode uint32) (fd int, created bool, err error) {
	r := t.sh.root
	if flags&unix.O_CREAT == 0 || mode&0o777&t.sh.umask == 0 {
		fd, err = r.open(p, flags, mode)
		return fd, false, err
	}
	if flags&unix.O_EXCL != 0 {
		fd, err = r.open(p, flags, mode)
		return fd, err == nil, err
	}
	for range 4 {
		fd, err = r.open(p, flags|unix.O_EXCL, mode)
		if err == nil {
			return fd, true, nil
		}
		if err != unix.EEXIST {
			return -1, false, err
		}
		fd, err = r.open(p, flags&^unix.O_CREAT, mode)
		if err != unix.ENOENT {
			return fd, false, err
		}
		// Removed in between, or a dangling symlink: O_CREAT through it
		// as open(2) would, without the umask fix-up.
	}
	fd, err = r.open(p, flags, mode)
	return fd, false, err
}

// Tree is the tree the file was opened on.
func (f *OpenFile) Tree() *Tree { return f.tree }

// ReadAt reads from the file (pread). As io.ReaderAt: fewer bytes than
// asked come with io.EOF.
func (f *OpenFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.f.ReadAt(p, off)
	if err == io.EOF {
		return n, err
	}
	return n, fail(err)
}

// WriteAt writes to the file (pwrite). A file opened read-only refuses
// with STATUS_ACCESS_DENIED, as does every file of a read-only share
// (writable).
func (f *OpenFile) WriteAt(p []byte, off int64) (int, error) {
	if f.readOnly {
		return 0, protocol.StatusAccessDenied
	}
	// Not os.File.WriteAt, which refuses files opened with O_APPEND; on
	// Linux pwrite(2) to such a file appends, which is what the opener
	// asked for.
	n := 0
	err := f.withFd(func(fd int) error {
		for n < len(p) {
			k, err := unix.Pwrite(fd, p[n:], off+int64(n))
			if err != nil {
				return err
			}
			if k == 0 {
				return io.ErrShortWrite
			}
			n += k
		}
		return nil
	})
	return n, err
}

// Fsync flushes the file to stable storage (fsync, or fdatasync when
// datasync) before it returns.
func (f *OpenFile) Fsync(datasync bool) error {
	return f.withFd(func(fd int) error {
		if datasync {
			return unix.Fdatasync(fd)
		}
		return unix.Fsync(fd)
	})
}

// SetAttr is Tree.SetAttr on the open file itself.
func (f *OpenFile) SetAttr(in SetAttrIn) (a Attr, err error) {
	if err := f.tree.writable(); err != nil {
		return Attr{}, err
	}
	err = f.withFd(func(fd int) error {
		a, err = setattrFd(fd, in)
		return err
	})
	return a, err
}

// Close closes the file.
func (f *OpenFile) Close() error { return fail(f.f.Close()) }

// withFd runs fn with the file's descriptor, holding it open for the call
// so that a concurrent Close cannot let the number be reused under fn, and
// maps the error.
func (f *OpenFile) withFd(fn func(fd int) error) error {
	rc, err := f.f.SyscallConn()
	if err != nil {
		return fail(err)
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return protocol.StatusFileClosed // the one way Control fails
	}
	return fail(ferr)
}
