package share

import (
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

// Namespace operations of a share. Each resolves its path beneath the share
// root (confine_linux.go) and acts on (parent dirfd, base name) with *at
// calls that do not follow a final symlink. Paths are relative to the share
// root, slash-separated; "" is the root.

func attrFromStat(st *unix.Stat_t) Attr {
	return Attr{
		Ino:     st.Ino,
		Mode:    st.Mode,
		Nlink:   uint32(st.Nlink),
		Uid:     st.Uid,
		Gid:     st.Gid,
		Rdev:    uint32(st.Rdev),
		Blksize: uint32(st.Blksize),
		Size:    uint64(st.Size),
		Blocks:  uint64(st.Blocks),
		Atime:   time.Unix(st.Atim.Unix()),
		Mtime:   time.Unix(st.Mtim.Unix()),
		Ctime:   time.Unix(st.Ctim.Unix()),
	}
}

// lstatAt is fstatat(dirfd, base, AT_SYMLINK_NOFOLLOW); base "" is dirfd
// itself.
func lstatAt(dirfd int, base string) (Attr, error) {
	var st unix.Stat_t
	var err error
	if base == "" {
		err = unix.Fstat(dirfd, &st)
	} else {
		err = unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return Attr{}, err
	}
	return attrFromStat(&st), nil
}

// at runs fn on the resolved parent of p and its base name, as the tree's
// user (Tree.as: resolution and fn both), and maps what it returns to an
// NTSTATUS.
func (t *Tree) at(p string, fn func(dirfd int, base string) error) error {
	return t.as(func() error { return t.sh.root.at(p, fn) })
}

// at resolves the parent of p and runs fn on it and the base name, on a
// thread already acting as the tree's user.
func (r *root) at(p string, fn func(dirfd int, base string) error) error {
	dirfd, base, err := r.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	return fn(dirfd, base)
}

// change is at for an operation that modifies the share: refused on a
// read-only share (writable) before anything is resolved.
func (t *Tree) change(p string, fn func(dirfd int, base string) error) error {
	if err := t.writable(); err != nil {
		return err
	}
	return t.at(p, fn)
}

// created is change for an operation that makes a new name (mkdir,
// symlink): the root itself already exists, and the new entry's
// attributes are returned.
func (t *Tree) created(p string, fn func(dirfd int, base string) error) (a Attr, err error) {
	err = t.change(p, func(dirfd int, base string) error {
		if base == "" {
			return unix.EEXIST
		}
		if err := fn(dirfd, base); err != nil {
			return err
		}
		t.namesChanged(dirfd, base)
		a, err = lstatAt(dirfd, base)
		return err
	})
	return a, err
}

// GetAttr returns the attributes of p, not following a final symlink.
func (t *Tree) GetAttr(p string) (a Attr, err error) {
	err = t.at(p, func(dirfd int, base string) error {
		st, err := statAt(dirfd, base)
		if err != nil {
			return err
		}
		a = attrFromStat(&st)
		t.recallFor(&st, &a, dirfd, base)
		return nil
	})
	return a, err
}

// Unlink removes a non-directory (a final symlink itself).
func (t *Tree) Unlink(p string) error { return t.remove(p, 0) }

// Rmdir removes an empty directory.
func (t *Tree) Rmdir(p string) error { return t.remove(p, unix.AT_REMOVEDIR) }

func (t *Tree) remove(p string, flags int) error {
	return t.change(p, func(dirfd int, base string) error {
		if base == "" {
			return protocol.StatusAccessDenied // never the share root
		}
		v := t.victim(dirfd, base)
		if err := unix.Unlinkat(dirfd, base, flags); err != nil {
			return err
		}
		t.namesChanged(dirfd, base)
		t.gone(v)
		return nil
	})
}

// Readlink returns a symlink's text.
func (t *Tree) Readlink(p string) (s string, err error) {
	err = t.at(p, func(dirfd int, base string) error {
		if base == "" {
			return unix.EINVAL
		}
		s, err = readlinkat(dirfd, base)
		return err
	})
	return s, err
}

// Mkdir creates directory p with the permission bits of mode, which the
// client's umask has already shaped (see restoreUmaskBits), less the bits
// the share's policy clears (setidBits).
func (t *Tree) Mkdir(p string, mode uint32) (Attr, error) {
	mode = t.sh.setidBits(mode, true)
	return t.created(p, func(dirfd int, base string) error {
		if err := unix.Mkdirat(dirfd, base, mode&07777); err != nil {
			return err
		}
		if lost := mode & 0o777 & t.sh.umask; lost != 0 {
			return restoreUmaskBits(dirfd, base, lost)
		}
		return nil
	})
}

// Symlink creates p as a symlink whose text is target. The target is only
// text: what it points at is resolved, confined, whenever it is followed.
func (t *Tree) Symlink(target, p string) (Attr, error) {
	if target == "" || len(target) > maxPathLen || strings.IndexByte(target, 0) >= 0 {
		return Attr{}, fail(unix.EINVAL)
	}
	return t.created(p, func(dirfd int, base string) error {
		return unix.Symlinkat(target, dirfd, base)
	})
}

// The client's kernel has already applied the caller's umask to the mode of
// a create or mkdir; the server's own umask must not take more bits away.
// When the server runs with a non-zero umask (it should not: lwio-server
// sets 0), the bits it took are put back on what was just created.

// restoreUmaskBits adds lost permission bits to the new inode (dirfd,
// base), through an O_PATH|O_NOFOLLOW descriptor so that a symlink swapped
// in meanwhile is not followed.
func restoreUmaskBits(dirfd int, base string, lost uint32) error {
	fd, err := unix.Openat(dirfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	return unix.Fchmodat(unix.AT_FDCWD, procPath(fd), (st.Mode&07777)|lost, 0)
}

// fchmodFd sets the mode of the inode fd holds: fchmod(2) on a descriptor
// opened for I/O, and through /proc (procPath) on an O_PATH one, which
// fchmod refuses with EBADF. The direct call skips a path walk through
// /proc's magic link for every chmod of an open file (tar's SETATTR of
// the file it just wrote): the same inode, the same owner check.
func fchmodFd(fd int, mode uint32) error {
	err := unix.Fchmod(fd, mode)
	if err == unix.EBADF {
		err = unix.Fchmodat(unix.AT_FDCWD, procPath(fd), mode, 0)
	}
	return err
}

// Umask reads the process umask without changing it (the Umask line of
// /proc/self/status, Linux 4.7+), falling back to setting and restoring
// it. Open reads it once per share.
func Umask() uint32 {
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Umask:"); ok {
				if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
					return uint32(m)
				}
			}
		}
	}
	old := unix.Umask(0)
	unix.Umask(old)
	return uint32(old)
}

// twoAt resolves the parents of two paths for a change that names both.
func (t *Tree) twoAt(oldp, newp string, fn func(od int, ob string, nd int, nb string) error) error {
	return t.change(oldp, func(od int, ob string) error {
		return t.sh.root.at(newp, func(nd int, nb string) error {
			if ob == "" || nb == "" {
				return protocol.StatusAccessDenied
			}
			return fn(od, ob, nd, nb)
		})
	})
}

// Rename renames oldp to newp with renameat2(2) flags (RENAME_NOREPLACE,
// RENAME_EXCHANGE).
func (t *Tree) Rename(oldp, newp string, flags uint32) error {
	if flags&^(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 ||
		flags == unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE {
		return fail(unix.EINVAL)
	}
	return t.twoAt(oldp, newp, func(od int, ob string, nd int, nb string) error {
		moving, replaced := t.victim(od, ob), t.victim(nd, nb)
		if err := unix.Renameat2(od, ob, nd, nb, uint(flags)); err != nil {
			return err
		}
		t.renamed(od, ob, nd, nb, moving, replaced, flags&unix.RENAME_EXCHANGE != 0)
		return nil
	})
}

// Link creates newp as a hard link to oldp. No AT_SYMLINK_FOLLOW: linking
// a symlink links the symlink, so a link can never reach a file outside
// the share.
func (t *Tree) Link(oldp, newp string) (a Attr, err error) {
	err = t.twoAt(oldp, newp, func(od int, ob string, nd int, nb string) error {
		if err := unix.Linkat(od, ob, nd, nb, 0); err != nil {
			return err
		}
		t.namesChanged(nd, nb)
		t.linked(t.victim(nd, nb))
		a, err = lstatAt(nd, nb)
		return err
	})
	return a, err
}

// StatFS returns the statistics of the filesystem holding the share root.
// fstatfs(2) on the root's descriptor checks no permission, so it runs as
// the server: the same answer for everyone, without a credential switch.
func (t *Tree) StatFS() (StatFS, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(t.sh.root.fd, &st); err != nil {
		return StatFS{}, fail(err)
	}
	return StatFS{
		Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail,
		Files: st.Files, Ffree: st.Ffree,
		Bsize: uint32(st.Bsize), Frsize: uint32(st.Frsize), NameLen: uint32(st.Namelen),
	}, nil
}

// final runs fn on an O_PATH descriptor of the final component of p, not
// followed (the root itself for ""), as the tree's user, and maps its
// error.
func (t *Tree) final(p string, fn func(fd int) error) error {
	return t.at(p, func(dirfd int, base string) error {
		var fd int
		var err error
		if base == "" {
			fd, err = unix.FcntlInt(uintptr(dirfd), unix.F_DUPFD_CLOEXEC, 0)
		} else {
			fd, err = unix.Openat(dirfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return fn(fd)
	})
}

// SetAttr changes the attributes in.Valid names on p (a final symlink is
// not followed) and returns them afterwards.
func (t *Tree) SetAttr(p string, in SetAttrIn) (a Attr, err error) {
	if err := t.writable(); err != nil {
		return Attr{}, err
	}
	err = t.final(p, func(fd int) error { return t.setattrBreaking(fd, 0, in, &a) })
	return a, err
}

// setattrFd applies in to the inode fd holds (an O_PATH descriptor or an
// open file) of type typ (S_IFMT bits; 0 when not known: an fstat tells):
// owner first (chown clears set-id bits), then mode (less the bits the
// share's policy clears, setidBits), size and times last so that an
// explicit mtime wins over truncate's. Nothing to change (a client's fstat
// of a handle) is one fstat.
func (s *Share) setattrFd(fd int, typ uint32, in SetAttrIn) (Attr, error) {
	var st unix.Stat_t
	if in.Valid == 0 || typ == 0 {
		if err := unix.Fstat(fd, &st); err != nil {
			return Attr{}, err
		}
		if in.Valid == 0 {
			return attrFromStat(&st), nil
		}
		typ = st.Mode & unix.S_IFMT
	}
	isLink := typ == unix.S_IFLNK
	in.Mode = s.setidBits(in.Mode, typ == unix.S_IFDIR)
	if in.Valid&(SetUid|SetGid) != 0 {
		uid, gid := -1, -1
		if in.Valid&SetUid != 0 {
			uid = int(in.Uid)
		}
		if in.Valid&SetGid != 0 {
			gid = int(in.Gid)
		}
		if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return Attr{}, err
		}
	}
	if in.Valid&SetMode != 0 {
		if isLink {
			return Attr{}, unix.EOPNOTSUPP
		}
		if err := fchmodFd(fd, in.Mode&07777); err != nil {
			return Attr{}, err
		}
	}
	if in.Valid&SetSize != 0 {
		if isLink {
			return Attr{}, unix.EINVAL
		}
		if in.Size > 1<<63-1 {
			return Attr{}, unix.EFBIG
		}
		err := unix.Ftruncate(fd, int64(in.Size))
		if err == unix.EBADF || err == unix.EINVAL {
			// An O_PATH descriptor, or a file opened read-only: truncate
			// by path checks write permission as truncate(2) does.
			err = unix.Truncate(procPath(fd), int64(in.Size))
		}
		if err != nil {
			return Attr{}, err
		}
	}
	if in.Valid&(SetAtime|SetMtime) != 0 {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		set := func(i int, now bool, t time.Time) {
			if now {
				ts[i] = unix.Timespec{Nsec: unix.UTIME_NOW}
			} else {
				ts[i] = unix.NsecToTimespec(t.UnixNano())
			}
		}
		if in.Valid&SetAtime != 0 {
			set(0, in.AtimeNow, in.Atime)
		}
		if in.Valid&SetMtime != 0 {
			set(1, in.MtimeNow, in.Mtime)
		}
		if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return Attr{}, err
		}
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return Attr{}, err
	}
	return attrFromStat(&st), nil
}
