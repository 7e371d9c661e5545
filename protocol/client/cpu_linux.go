package client

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// currentCPU is the CPU the calling thread runs on (getcpu(2)); 0 if the
// kernel will not say. It is a hint: the goroutine may move at once.
func currentCPU() int {
	var cpu uint32
	if _, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); e != 0 {
		return 0
	}
	return int(cpu)
}
