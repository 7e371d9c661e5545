package share

import (
	"strings"

	"golang.org/x/sys/unix"
)

// The share's policies that hold whatever the identity: the kernel's
// permission checks (identity_linux.go) decide what a user may do to the
// files the user may reach; these keep a share from becoming a way into
// the server host itself — a set-user-ID program, a file capability, a
// device node, a FIFO that blocks a server thread.

// setidBits is mode with the set-user-ID bit, and on anything but a
// directory the set-group-ID bit, cleared unless the share allows them
// (Config.AllowSetid): a user must not be able to leave a set-id program
// on the server's disk for a local user (or a server that execs it) to
// run with the user's — or, on a share with allow_root, root's —
// privileges. Samba does not map these bits either. The set-group-ID bit
// of a directory stays: it only makes new entries inherit the directory's
// group, which the kernel already lets only a member of that group set.
func (s *Share) setidBits(mode uint32, dir bool) uint32 {
	if s.AllowSetid {
		return mode
	}
	mode &^= unix.S_ISUID
	if !dir {
		mode &^= unix.S_ISGID
	}
	return mode
}

// xattrAllowed refuses the security.* and trusted.* namespaces with EPERM
// (PRIVILEGE_NOT_HELD on the wire): security.capability would give a
// program file capabilities, security.selinux or security.ima relabel it
// for the server's own security policy, and trusted.* is root's private
// namespace (overlayfs keeps its whiteouts and redirects there). A user's
// own user.* attributes, and system.* (POSIX ACLs, which the kernel
// checks as it does chmod), go through.
func xattrAllowed(name string) error {
	if hiddenXattr(name) {
		return unix.EPERM
	}
	return nil
}

// hiddenXattr reports whether a name is in a namespace clients neither
// read nor write (xattrAllowed); LISTXATTR leaves such names out.
func hiddenXattr(name string) bool {
	return strings.HasPrefix(name, "security.") || strings.HasPrefix(name, "trusted.")
}

// MknodAllowed is the policy for creating a special file of type
// mode&S_IFMT (MKNOD): FIFOs, sockets and regular files may be made —
// they are ordinary objects a client uses locally, as on NFS, and the
// server never opens them for data (Open) — but block and character
// device nodes, a door to the server's hardware, only on a share with
// allow_devices (and then only as an account the kernel lets make them,
// root: CAP_MKNOD). EPERM otherwise, EINVAL for a type that is none of
// these.
func (s *Share) MknodAllowed(mode uint32) error {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO, unix.S_IFSOCK, unix.S_IFREG, 0:
		return nil
	case unix.S_IFCHR, unix.S_IFBLK:
		if s.AllowDevices {
			return nil
		}
		return fail(unix.EPERM)
	}
	return fail(unix.EINVAL)
}
