package fs

import "unsafe"

// addr is the address of b's first byte, for O_DIRECT alignment in tests.
func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
