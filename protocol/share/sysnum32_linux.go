//go:build linux && (386 || arm)

package share

import "golang.org/x/sys/unix"

// The credential system calls that take 32-bit ids: on 386 and arm the
// original ones take 16-bit ids.
const (
	sysSetgroups = unix.SYS_SETGROUPS32
	sysSetfsuid  = unix.SYS_SETFSUID32
	sysGetgroups = unix.SYS_GETGROUPS32
	sysSetfsgid  = unix.SYS_SETFSGID32
)
