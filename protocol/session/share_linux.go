package session

import (
	"bytes"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

// Namespace operations of a share. Each resolves its path beneath the share
// root (confine_linux.go) and acts on (parent dirfd, base name) with *at
// calls that do not follow a final symlink.

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

// at runs fn on the resolved parent of p and its base name.
func (sh *share) at(p string, fn func(dirfd int, base string) error) error {
	dirfd, base, err := sh.root.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	return fn(dirfd, base)
}

// notRoot refuses operations that would act on the share root itself.
func notRoot(base string) error {
	if base == "" {
		return protocol.StatusAccessDenied
	}
	return nil
}

func (sh *share) getattr(p string) (a Attr, err error) {
	err = sh.at(p, func(dirfd int, base string) error {
		a, err = lstatAt(dirfd, base)
		return err
	})
	return a, err
}

func (sh *share) remove(p string, flags int) error {
	return sh.at(p, func(dirfd int, base string) error {
		if err := notRoot(base); err != nil {
			return err
		}
		return unix.Unlinkat(dirfd, base, flags)
	})
}

func (sh *share) readlink(p string) (t string, err error) {
	err = sh.at(p, func(dirfd int, base string) error {
		if base == "" {
			return unix.EINVAL
		}
		t, err = readlinkat(dirfd, base)
		return err
	})
	return t, err
}

func (sh *share) mkdir(p string, mode uint32) (a Attr, err error) {
	err = sh.at(p, func(dirfd int, base string) error {
		if base == "" {
			return unix.EEXIST
		}
		if err := unix.Mkdirat(dirfd, base, mode&07777); err != nil {
			return err
		}
		if lost := mode & 0o777 & sh.umask; lost != 0 {
			if err := restoreUmaskBits(dirfd, base, lost); err != nil {
				return err
			}
		}
		a, err = lstatAt(dirfd, base)
		return err
	})
	return a, err
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

// processUmask reads the process umask without changing it (the Umask
// line of /proc/self/status, Linux 4.7+), falling back to setting and
// restoring it.
func processUmask() uint32 {
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

func (sh *share) symlink(target, p string) (a Attr, err error) {
	if target == "" || len(target) > maxPathLen || strings.IndexByte(target, 0) >= 0 {
		return Attr{}, unix.EINVAL
	}
	// The target is only text: what it points at is resolved, confined,
	// whenever it is followed.
	err = sh.at(p, func(dirfd int, base string) error {
		if base == "" {
			return unix.EEXIST
		}
		if err := unix.Symlinkat(target, dirfd, base); err != nil {
			return err
		}
		a, err = lstatAt(dirfd, base)
		return err
	})
	return a, err
}

// twoAt resolves the parents of two paths.
func (sh *share) twoAt(oldp, newp string, fn func(od int, ob string, nd int, nb string) error) error {
	return sh.at(oldp, func(od int, ob string) error {
		return sh.at(newp, func(nd int, nb string) error {
			if ob == "" || nb == "" {
				return protocol.StatusAccessDenied
			}
			return fn(od, ob, nd, nb)
		})
	})
}

func (sh *share) rename(oldp, newp string, flags uint32) error {
	if flags&^(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 ||
		flags == unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE {
		return unix.EINVAL
	}
	return sh.twoAt(oldp, newp, func(od int, ob string, nd int, nb string) error {
		return unix.Renameat2(od, ob, nd, nb, uint(flags))
	})
}

func (sh *share) link(oldp, newp string) (a Attr, err error) {
	err = sh.twoAt(oldp, newp, func(od int, ob string, nd int, nb string) error {
		// No AT_SYMLINK_FOLLOW: linking a symlink links the symlink, so a
		// link can never reach a file outside the share.
		if err := unix.Linkat(od, ob, nd, nb, 0); err != nil {
			return err
		}
		a, err = lstatAt(nd, nb)
		return err
	})
	return a, err
}

func (sh *share) statfs() (StatFS, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(sh.root.fd, &st); err != nil {
		return StatFS{}, err
	}
	return StatFS{
		Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail,
		Files: st.Files, Ffree: st.Ffree,
		Bsize: uint32(st.Bsize), Frsize: uint32(st.Frsize), NameLen: uint32(st.Namelen),
	}, nil
}

// openFlagsAllowed are the open(2) flags a client may pass.
const openFlagsAllowed = unix.O_ACCMODE | unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC |
	unix.O_APPEND | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_SYNC | unix.O_DSYNC |
	unix.O_NOATIME | unix.O_NONBLOCK

func (sh *share) open(p string, flags int, mode uint32) (*openFile, Attr, error) {
	flags &= openFlagsAllowed
	acc := flags & unix.O_ACCMODE
	if acc == unix.O_ACCMODE {
		return nil, Attr{}, unix.EINVAL
	}
	writes := acc != unix.O_RDONLY || flags&(unix.O_CREAT|unix.O_TRUNC) != 0
	if sh.ReadOnly && writes {
		return nil, Attr{}, protocol.StatusMediaWriteProtected
	}
	fd, created, err := sh.create(p, flags, mode&07777)
	if err != nil {
		return nil, Attr{}, err
	}
	if lost := mode & 0o777 & sh.umask; created && lost != 0 {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err == nil {
			err = unix.Fchmod(fd, (st.Mode&07777)|lost)
		}
		if err != nil {
			unix.Close(fd)
			return nil, Attr{}, err
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, Attr{}, err
	}
	t := st.Mode & unix.S_IFMT
	if t != unix.S_IFREG && t != unix.S_IFDIR {
		// FIFOs, sockets and devices are not served: a device node in a
		// share must not become a door to the server's hardware.
		unix.Close(fd)
		return nil, Attr{}, unix.EACCES
	}
	of := &openFile{
		share:    sh,
		f:        os.NewFile(uintptr(fd), p),
		readOnly: acc == unix.O_RDONLY || sh.ReadOnly,
	}
	return of, attrFromStat(&st), nil
}

// create opens p, telling whether it created the file when that matters
// (O_CREAT with a umask that would take bits from mode): it first tries
// O_EXCL, then opens the existing file without O_CREAT.
func (sh *share) create(p string, flags int, mode uint32) (fd int, created bool, err error) {
	if flags&unix.O_CREAT == 0 || mode&0o777&sh.umask == 0 {
		fd, err = sh.root.open(p, flags, mode)
		return fd, false, err
	}
	if flags&unix.O_EXCL != 0 {
		fd, err = sh.root.open(p, flags, mode)
		return fd, err == nil, err
	}
	for range 4 {
		fd, err = sh.root.open(p, flags|unix.O_EXCL, mode)
		if err == nil {
			return fd, true, nil
		}
		if err != unix.EEXIST {
			return -1, false, err
		}
		fd, err = sh.root.open(p, flags&^unix.O_CREAT, mode)
		if err != unix.ENOENT {
			return fd, false, err
		}
		// Removed in between, or a dangling symlink: O_CREAT through it
		// as open(2) would, without the umask fix-up.
	}
	fd, err = sh.root.open(p, flags, mode)
	return fd, false, err
}

// readdirMaxBytes bounds one READDIR page when the client asks for more.
const readdirMaxBytes = 512 << 10

// dirListing is a session's most recent sorted directory listing, reused
// for the continuation pages of the same directory while it is unchanged
// (same inode, mtime and ctime), so that paging a big directory does not
// re-read and re-sort it for every page. A listing taken within
// racyWindow of the directory's last change is not trusted: timestamps
// are as coarse as a clock tick, so a change in the same tick would not
// show (git's "racy clean" problem).
type dirListing struct {
	mu sync.Mutex
	dirListingData
}

type dirListingData struct {
	share *share
	path  string
	dev   uint64
	ino   uint64
	mtime unix.Timespec
	ctime unix.Timespec
	racy  bool
	names []string
}

const racyWindow = 100 * time.Millisecond

// list returns the sorted names of the directory open at fd, from the
// cache when r continues a listing of an unchanged directory.
func (l *dirListing) list(sh *share, r *readDirReq, f *os.File) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.After != "" && !l.racy && l.share == sh && l.path == r.Path && l.dev == st.Dev && l.ino == st.Ino &&
		l.mtime == st.Mtim && l.ctime == st.Ctim {
		return l.names, nil
	}
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	changed := time.Unix(st.Ctim.Unix())
	if m := time.Unix(st.Mtim.Unix()); m.After(changed) {
		changed = m
	}
	l.dirListingData = dirListingData{share: sh, path: r.Path, dev: st.Dev, ino: st.Ino, mtime: st.Mtim, ctime: st.Ctim,
		racy: time.Since(changed) < racyWindow, names: names}
	return names, nil
}

func (sh *share) readdir(r *readDirReq, cache *dirListing) (*readDirResp, error) {
	fd, err := sh.root.open(r.Path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), r.Path)
	defer f.Close()
	names, err := cache.list(sh, r, f)
	if err != nil {
		return nil, err
	}
	i := sort.SearchStrings(names, r.After)
	if r.After != "" && i < len(names) && names[i] == r.After {
		i++
	}
	max := int(r.MaxBytes)
	if max <= 0 || max > readdirMaxBytes {
		max = readdirMaxBytes
	}
	resp := &readDirResp{}
	used := 5
	for ; i < len(names); i++ {
		n := names[i]
		if used+2+len(n)+attrWireSize > max && len(resp.Entries) > 0 {
			resp.More = true
			break
		}
		a, err := lstatAt(fd, n)
		if err != nil {
			continue // removed since the listing
		}
		resp.Entries = append(resp.Entries, DirEntry{Name: n, Attr: a})
		used += 2 + len(n) + attrWireSize
	}
	return resp, nil
}

// finalFd opens the final component of p as O_PATH without following it;
// the root itself for "".
func (sh *share) finalFd(p string) (int, error) {
	var fd int
	err := sh.at(p, func(dirfd int, base string) error {
		var err error
		if base == "" {
			fd, err = unix.FcntlInt(uintptr(dirfd), unix.F_DUPFD_CLOEXEC, 0)
		} else {
			fd, err = unix.Openat(dirfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		return err
	})
	return fd, err
}

func (sh *share) setattr(p string, in SetAttrIn) (Attr, error) {
	fd, err := sh.finalFd(p)
	if err != nil {
		return Attr{}, err
	}
	defer unix.Close(fd)
	return sh.setattrFd(fd, in)
}

// setattrFd applies in to the inode fd holds (an O_PATH descriptor or an
// open file): owner first (chown clears set-id bits), then mode, size and
// times last so that an explicit mtime wins over truncate's.
func (sh *share) setattrFd(fd int, in SetAttrIn) (Attr, error) {
	if sh.ReadOnly && in.Valid != 0 {
		return Attr{}, protocol.StatusMediaWriteProtected
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Attr{}, err
	}
	isLink := st.Mode&unix.S_IFMT == unix.S_IFLNK
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
		if err := unix.Fchmodat(unix.AT_FDCWD, procPath(fd), in.Mode&07777, 0); err != nil {
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

// Extended attributes go through /proc/self/fd/N of an O_PATH, no-follow
// descriptor of the final component: Linux has no fgetxattr on O_PATH
// descriptors and no getxattrat before 6.13.

const maxXattrSize = 64 << 10

func (sh *share) getxattr(p, name string) ([]byte, error) {
	fd, err := sh.finalFd(p)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	pp := procPath(fd)
	for {
		n, err := unix.Getxattr(pp, name, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, min(n, maxXattrSize))
		n, err = unix.Getxattr(pp, name, buf)
		if err == unix.ERANGE && len(buf) < maxXattrSize {
			continue // grew in between
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

func (sh *share) listxattr(p string) ([]string, error) {
	fd, err := sh.finalFd(p)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	pp := procPath(fd)
	for {
		n, err := unix.Listxattr(pp, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, min(n, maxXattrSize))
		n, err = unix.Listxattr(pp, buf)
		if err == unix.ERANGE && len(buf) < maxXattrSize {
			continue
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, b := range bytes.Split(buf[:n], []byte{0}) {
			if len(b) > 0 {
				names = append(names, string(b))
			}
		}
		return names, nil
	}
}

func (sh *share) setxattr(p, name string, value []byte, flags int) error {
	if len(value) > maxXattrSize {
		return unix.E2BIG
	}
	fd, err := sh.finalFd(p)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Setxattr(procPath(fd), name, value, flags&(unix.XATTR_CREATE|unix.XATTR_REPLACE))
}

func (sh *share) removexattr(p, name string) error {
	fd, err := sh.finalFd(p)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Removexattr(procPath(fd), name)
}
