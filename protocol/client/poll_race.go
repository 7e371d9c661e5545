//go:build race

package client

import "github.com/lwiofs/lwiofs/protocol"

// raceEnabled reports a -race build. A polling-mode completion is memory
// the provider writes with no synchronisation the race detector can see
// (as a NIC's DMA would be), so under -race the client does not spin (it
// goes straight to the INTERRUPT wakeup) and reads such memory through
// uninstrumented functions.
const raceEnabled = true

//go:norace
//go:noinline
func pollIOS(b []byte) (result, bool) {
	info := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
	st := protocol.Status(uint32(b[4]) | uint32(b[5])<<8 | uint32(b[6])<<16 | uint32(b[7])<<24)
	if st == protocol.StatusPending {
		return result{}, false
	}
	return result{info: info, st: st}, true
}

//go:norace
//go:noinline
func copyRemote(dst, src []byte) int {
	n := min(len(dst), len(src))
	for i := 0; i < n; i++ {
		dst[i] = src[i]
	}
	return n
}

//go:norace
//go:noinline
func putPending(b []byte) {
	st := uint32(protocol.StatusPending)
	b[0], b[1], b[2], b[3] = 0, 0, 0, 0
	b[4], b[5], b[6], b[7] = byte(st), byte(st>>8), byte(st>>16), byte(st>>24)
}
