package share

import (
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

// Unnamed files (issue 23): open(2) with O_TMPFILE makes a regular file
// with no name in a directory; the program writes it and then gives it a
// name with linkat(2) — an atomic "write, then appear" that editors,
// package managers and databases rely on. Here the file is made in the
// share's directory on the server, and LinkAt names it there.

// tmpfileFlags are the open(2) flags a client may pass with O_TMPFILE:
// O_EXCL is O_TMPFILE's own "never to be linked".
const tmpfileFlags = unix.O_ACCMODE | unix.O_EXCL | unix.O_SYNC | unix.O_DSYNC | unix.O_NOATIME

// Tmpfile opens an unnamed regular file in directory dir (open(2) with
// O_TMPFILE) with the permission bits of mode and returns it with its
// attributes. It creates a file, so the share must be writable; the file
// is opened for writing (O_WRONLY or O_RDWR, as O_TMPFILE requires). dir
// is resolved beneath the share root like every path.
func (t *Tree) Tmpfile(dir string, flags int, mode uint32) (*OpenFile, Attr, error) {
	if err := t.writable(); err != nil {
		return nil, Attr{}, err
	}
	flags &= tmpfileFlags
	if acc := flags & unix.O_ACCMODE; acc != unix.O_WRONLY && acc != unix.O_RDWR {
		return nil, Attr{}, fail(unix.EINVAL)
	}
	mode = t.sh.setidBits(mode&07777, false)
	var fd int
	var st unix.Stat_t
	var id identity
	err := t.as(func() error { // as the user: the file is the user's
		var err error
		if fd, err = t.sh.root.open(dir, flags|unix.O_TMPFILE, mode); err != nil {
			return err
		}
		fd, st, id, err = t.opened(fd, true, mode)
		return err
	})
	if err != nil {
		return nil, Attr{}, err
	}
	f := t.newOpenFile(fd, dir+"/#tmpfile", false, &st, id)
	t.leaseOpened(f, flags, &st)
	return f, attrFromStat(&st), nil
}

// LinkAt gives the open file f the name p (linkat(2) of its descriptor
// through /proc/self/fd with AT_SYMLINK_FOLLOW, which needs no
// CAP_DAC_READ_SEARCH as AT_EMPTY_PATH would): how an O_TMPFILE file
// appears in the tree. p is confined beneath the share root like every
// name, and must not exist; an O_TMPFILE file opened with O_EXCL, or a
// named file since unlinked, cannot be linked (ENOENT, as locally). A new
// name is a change: the share must be writable and f opened for writing.
func (f *OpenFile) LinkAt(p string) (a Attr, err error) {
	if f.readOnly {
		return Attr{}, protocol.StatusAccessDenied
	}
	err = f.tree.change(p, func(dirfd int, base string) error {
		if base == "" {
			return unix.EEXIST
		}
		err := f.withFd(func(fd int) error {
			return unix.Linkat(unix.AT_FDCWD, procPath(fd), dirfd, base, unix.AT_SYMLINK_FOLLOW)
		})
		if err != nil {
			return err
		}
		f.tree.namesChanged(dirfd, base)
		a, err = lstatAt(dirfd, base)
		return err
	})
	return a, err
}
