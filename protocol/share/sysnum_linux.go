//go:build linux && !386 && !arm

package share

import "golang.org/x/sys/unix"

// The credential system calls that take 32-bit ids.
const (
	sysSetgroups = unix.SYS_SETGROUPS
	sysSetfsuid  = unix.SYS_SETFSUID
	sysGetgroups = unix.SYS_GETGROUPS
	sysSetfsgid  = unix.SYS_SETFSGID
)
