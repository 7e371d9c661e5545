package share

import (
	"errors"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Confinement: every path a client names is resolved beneath its share's
// root directory file descriptor, never by string concatenation.
//
// The primary resolver is openat2(2) with RESOLVE_BENEATH (no "..", absolute
// symlink or relative symlink chain may leave the root; the kernel answers
// EXDEV) and RESOLVE_NO_MAGICLINKS (no /proc/<pid>/{root,cwd,fd/N} jumps;
// ELOOP). Where openat2 is missing (ENOSYS, kernels before 5.6) the fallback
// walks one component at a time with O_PATH|O_NOFOLLOW, expands symlinks
// itself, keeps a stack of directory descriptors so that ".." pops to an
// already-resolved parent (never the on-disk ".." entry, which a concurrent
// rename could move), refuses absolute symlink targets (which is also what
// defeats magic links: their text is absolute) and ".." above the root,
// and stops after maxSymlinks expansions.
//
// Operations on the final component (lstat, unlink, rename, link, symlink
// creation, readlink, chown, utimens, xattrs) work on (directory fd of the
// resolved parent, base name) with the *at(2) calls and no-follow flags, so
// a final symlink is never followed out of the share.

const (
	maxSymlinks = 40 // Linux's MAXSYMLINKS
	maxPathLen  = 4096
	resolveHow  = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS
)

// errEscape is what a resolution that would leave the share returns. It
// maps to STATUS_ACCESS_DENIED.
var errEscape = unix.EACCES

// root is an open share root.
type root struct {
	fd   int  // O_PATH|O_DIRECTORY descriptor of the root
	walk bool // openat2 unavailable (or disabled): use the walking resolver
}

func openRoot(path string, noOpenat2 bool) (*root, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	r := &root{fd: fd, walk: noOpenat2}
	if !r.walk {
		// Probe once: seccomp profiles and old kernels answer ENOSYS.
		pfd, err := unix.Openat2(fd, ".", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: resolveHow})
		if errors.Is(err, unix.ENOSYS) {
			r.walk = true
		} else if err == nil {
			unix.Close(pfd)
		}
	}
	return r, nil
}

func (r *root) close() error { return unix.Close(r.fd) }

// splitPath validates a client path and splits it into components. The
// path is relative, slash-separated, "" for the root; empty components,
// ".", "..", NUL bytes and absolute paths are refused.
func splitPath(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if len(p) > maxPathLen {
		return nil, unix.ENAMETOOLONG
	}
	if strings.HasPrefix(p, "/") || strings.IndexByte(p, 0) >= 0 {
		return nil, errEscape
	}
	comps := strings.Split(p, "/")
	for _, c := range comps {
		switch c {
		case "", ".":
			return nil, unix.EINVAL
		case "..":
			return nil, errEscape
		}
		if len(c) > 255 {
			return nil, unix.ENAMETOOLONG
		}
	}
	return comps, nil
}

func openat2(dirfd int, p string, flags int, mode uint32) (int, error) {
	if flags&unix.O_CREAT == 0 && flags&unix.O_TMPFILE != unix.O_TMPFILE {
		mode = 0 // openat2 refuses a mode without O_CREAT or O_TMPFILE (EINVAL)
	}
	how := &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolveHow}
	for range 8 {
		fd, err := unix.Openat2(dirfd, p, how)
		switch err {
		case nil:
			return fd, nil
		case unix.EAGAIN: // a concurrent rename raced a ".." step; retry
			continue
		case unix.EXDEV:
			return -1, errEscape
		}
		return -1, err
	}
	return -1, unix.EAGAIN
}

// parent resolves all components of p but the last and returns a directory
// descriptor (the caller closes it) and the last component. For the root
// ("") base is "" and dirfd is a duplicate of the root.
func (r *root) parent(p string) (dirfd int, base string, err error) {
	comps, err := splitPath(p)
	if err != nil {
		return -1, "", err
	}
	if len(comps) == 0 {
		fd, err := unix.FcntlInt(uintptr(r.fd), unix.F_DUPFD_CLOEXEC, 0)
		return fd, "", err
	}
	base = comps[len(comps)-1]
	dir := comps[:len(comps)-1]
	if !r.walk {
		dp := "."
		if len(dir) > 0 {
			dp = strings.Join(dir, "/")
		}
		fd, err := openat2(r.fd, dp, unix.O_PATH|unix.O_DIRECTORY, 0)
		return fd, base, err
	}
	w, err := newWalker(r.fd)
	if err != nil {
		return -1, "", err
	}
	defer w.close()
	if _, err := w.run(append(dir, "."), true); err != nil {
		return -1, "", err
	}
	fd, err := w.takeTop()
	return fd, base, err
}

// open opens p beneath the root with open(2) flags. A final symlink is
// followed (confined) unless flags has O_NOFOLLOW.
func (r *root) open(p string, flags int, mode uint32) (int, error) {
	comps, err := splitPath(p)
	if err != nil {
		return -1, err
	}
	if !r.walk {
		q := "."
		if len(comps) > 0 {
			q = strings.Join(comps, "/")
		}
		return openat2(r.fd, q, flags, mode)
	}
	w, err := newWalker(r.fd)
	if err != nil {
		return -1, err
	}
	defer w.close()
	if len(comps) == 0 {
		comps = []string{"."}
	}
	follow := flags&unix.O_NOFOLLOW == 0 && flags&(unix.O_CREAT|unix.O_EXCL) != unix.O_CREAT|unix.O_EXCL
	base, err := w.run(comps, follow)
	if err != nil {
		return -1, err
	}
	return unix.Openat(w.top(), base, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
}

// walker is the fallback resolver's state: a stack of directory
// descriptors, the root at the bottom.
type walker struct {
	stack []int
	links int
}

func newWalker(root int) (*walker, error) {
	fd, err := unix.FcntlInt(uintptr(root), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &walker{stack: []int{fd}}, nil
}

func (w *walker) top() int { return w.stack[len(w.stack)-1] }

// takeTop hands the top descriptor to the caller.
func (w *walker) takeTop() (int, error) {
	fd := w.top()
	w.stack = w.stack[:len(w.stack)-1]
	return fd, nil
}

func (w *walker) close() {
	for _, fd := range w.stack {
		unix.Close(fd)
	}
	w.stack = nil
}

// run resolves queue from the top of the stack. Every component but the
// last must be a directory (after symlink expansion); the last is returned
// unopened as a name in the top directory: "." when the path ends at a
// directory already on the stack. With followLast a final symlink is
// expanded too; a missing final component is returned as is (for O_CREAT).
func (w *walker) run(queue []string, followLast bool) (string, error) {
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		last := len(queue) == 0
		switch c {
		case "", ".":
			if last {
				return ".", nil
			}
			continue
		case "..":
			if len(w.stack) == 1 {
				return "", errEscape
			}
			unix.Close(w.top())
			w.stack = w.stack[:len(w.stack)-1]
			if last {
				return ".", nil
			}
			continue
		}
		if last && !followLast {
			return c, nil
		}
		var st unix.Stat_t
		err := unix.Fstatat(w.top(), c, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			if last && err == unix.ENOENT {
				return c, nil
			}
			return "", err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			w.links++
			if w.links > maxSymlinks {
				return "", unix.ELOOP
			}
			target, err := readlinkat(w.top(), c)
			if err != nil {
				return "", err
			}
			if target == "" || strings.HasPrefix(target, "/") {
				return "", errEscape // absolute (and so every magic link)
			}
			queue = append(strings.Split(target, "/"), queue...)
			continue
		}
		if last {
			return c, nil
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return "", unix.ENOTDIR
		}
		fd, err := unix.Openat(w.top(), c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", err // a symlink swapped in since the lstat: ENOTDIR
		}
		w.stack = append(w.stack, fd)
	}
	return ".", nil
}

// readlinkat returns a symlink's target, growing the buffer as needed.
func readlinkat(dirfd int, name string) (string, error) {
	for n := 256; n <= 1<<16; n *= 2 {
		buf := make([]byte, n)
		k, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if k < n {
			return string(buf[:k]), nil
		}
	}
	return "", unix.ENAMETOOLONG
}

// procPath names an open descriptor through /proc so that path-only system
// calls (getxattr, chmod, truncate, utimensat) act on exactly the inode the
// descriptor holds, an O_PATH one included.
func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }
