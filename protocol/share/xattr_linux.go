package share

import (
	"bytes"

	"golang.org/x/sys/unix"
)

// Extended attributes go through /proc/self/fd/N of an O_PATH, no-follow
// descriptor of the final component: Linux has no fgetxattr on O_PATH
// descriptors and no getxattrat before 6.13.

const maxXattrSize = 64 << 10

// xattrBuf calls get with a buffer big enough for what size reports,
// again if the value grew in between, up to maxXattrSize.
func xattrBuf(size func() (int, error), get func([]byte) (int, error)) ([]byte, error) {
	for {
		n, err := size()
		if err != nil {
			return nil, err
		}
		buf := make([]byte, min(n, maxXattrSize))
		n, err = get(buf)
		if err == unix.ERANGE && len(buf) < maxXattrSize {
			continue // grew in between
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// GetXattr returns the value of extended attribute name of p (a final
// symlink is not followed). The security.* and trusted.* namespaces are
// refused (xattrAllowed).
func (t *Tree) GetXattr(p, name string) (v []byte, err error) {
	if err := xattrAllowed(name); err != nil {
		return nil, fail(err)
	}
	err = t.final(p, func(fd int) error {
		pp := procPath(fd)
		v, err = xattrBuf(func() (int, error) { return unix.Getxattr(pp, name, nil) },
			func(b []byte) (int, error) { return unix.Getxattr(pp, name, b) })
		return err
	})
	return v, err
}

// ListXattr returns the names of p's extended attributes, less those in
// the namespaces clients do not see (hiddenXattr).
func (t *Tree) ListXattr(p string) (names []string, err error) {
	err = t.final(p, func(fd int) error {
		pp := procPath(fd)
		buf, err := xattrBuf(func() (int, error) { return unix.Listxattr(pp, nil) },
			func(b []byte) (int, error) { return unix.Listxattr(pp, b) })
		for _, b := range bytes.Split(buf, []byte{0}) {
			if len(b) > 0 && !hiddenXattr(string(b)) {
				names = append(names, string(b))
			}
		}
		return err
	})
	return names, err
}

// SetXattr sets extended attribute name of p with setxattr(2) flags
// (XATTR_CREATE, XATTR_REPLACE). The security.* and trusted.* namespaces
// are refused with EPERM (xattrAllowed).
func (t *Tree) SetXattr(p, name string, value []byte, flags int) error {
	if err := t.writable(); err != nil {
		return err
	}
	if err := xattrAllowed(name); err != nil {
		return fail(err)
	}
	if len(value) > maxXattrSize {
		return fail(unix.E2BIG)
	}
	return t.final(p, func(fd int) error {
		if err := unix.Setxattr(procPath(fd), name, value, flags&(unix.XATTR_CREATE|unix.XATTR_REPLACE)); err != nil {
			return err
		}
		t.changedFd(fd, LeaseRead)
		return nil
	})
}

// RemoveXattr removes extended attribute name of p (not in security.*
// or trusted.*: xattrAllowed).
func (t *Tree) RemoveXattr(p, name string) error {
	if err := t.writable(); err != nil {
		return err
	}
	if err := xattrAllowed(name); err != nil {
		return fail(err)
	}
	return t.final(p, func(fd int) error {
		if err := unix.Removexattr(procPath(fd), name); err != nil {
			return err
		}
		t.changedFd(fd, LeaseRead)
		return nil
	})
}
