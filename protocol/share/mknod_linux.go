package share

import (
	"golang.org/x/sys/unix"
)

// Mknod creates p as a FIFO, a UNIX-domain socket or a regular file with the
// permission bits of mode (its S_IFMT bits say which), or as a character or
// block device numbered rdev where the share allows device nodes
// (MknodAllowed, the share's allow_devices; otherwise
// STATUS_PRIVILEGE_NOT_HELD, EPERM at the mount). The node is made as the
// tree's account (its owner; the kernel refuses a device to an account
// without CAP_MKNOD).
// A FIFO or socket on the share is only a name with an owner and a mode:
// clients open them locally (their kernel's pipe or socket, as on NFS) and
// OPEN refuses them here, so none ever blocks the server. Set-user-ID and
// set-group-ID bits are dropped: they mean nothing on such a node.
func (t *Tree) Mknod(p string, mode, rdev uint32) (Attr, error) {
	if err := t.writable(); err != nil {
		return Attr{}, err
	}
	if err := t.sh.MknodAllowed(mode); err != nil {
		return Attr{}, err
	}
	typ := mode & unix.S_IFMT
	switch typ {
	case 0: // mknod(2)'s regular file
		typ = unix.S_IFREG
		fallthrough
	case unix.S_IFIFO, unix.S_IFSOCK, unix.S_IFREG:
		rdev = 0
	}
	perm := mode & 0o1777
	return t.created(p, func(dirfd int, base string) error {
		if err := unix.Mknodat(dirfd, base, typ|perm, int(rdev)); err != nil {
			return err
		}
		if lost := perm & 0o777 & t.sh.umask; lost != 0 {
			return restoreUmaskBits(dirfd, base, lost)
		}
		return nil
	})
}
