package share

import (
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

// Mknod creates p as a FIFO, a UNIX-domain socket or a regular file with the
// permission bits of mode (its S_IFMT bits say which), or as a character or
// block device numbered rdev where the share allows device nodes
// (devicesAllowed; otherwise STATUS_PRIVILEGE_NOT_HELD, EPERM at the mount).
// A FIFO or socket on the share is only a name with an owner and a mode:
// clients open them locally (their kernel's pipe or socket, as on NFS) and
// OPEN refuses them here, so none ever blocks the server. Set-user-ID and
// set-group-ID bits are dropped: they mean nothing on such a node.
func (t *Tree) Mknod(p string, mode, rdev uint32) (Attr, error) {
	typ := mode & unix.S_IFMT
	switch typ {
	case unix.S_IFIFO, unix.S_IFSOCK, unix.S_IFREG:
		rdev = 0
	case unix.S_IFCHR, unix.S_IFBLK:
		if err := t.writable(); err != nil {
			return Attr{}, err
		}
		if err := t.devicesAllowed(); err != nil {
			return Attr{}, err
		}
	default:
		return Attr{}, fail(unix.EINVAL)
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

// devicesAllowed is the device-node policy: none unless the share allows
// them. Issue 14's per-share allow_devices decides it once it lands; until
// then no share does.
func (t *Tree) devicesAllowed() error { return ntstatus.PrivilegeNotHeld }
