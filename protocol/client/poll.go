//go:build !race

package client

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"github.com/lwiofs/lwiofs/protocol"
)

// raceEnabled reports a -race build (see poll_race.go).
const raceEnabled = false

// pollIOS reads a polling request's IO_STATUS_BLOCK, which the server
// RDMA-writes while we look: one 8-byte atomic load, so Information and
// Status are seen together. ok is false while it still holds the
// STATUS_PENDING the client put there.
func pollIOS(b []byte) (result, bool) {
	v := atomic.LoadUint64((*uint64)(unsafe.Pointer(&b[0])))
	var w [8]byte
	binary.NativeEndian.PutUint64(w[:], v)
	st := protocol.Status(binary.LittleEndian.Uint32(w[4:]))
	if st == protocol.StatusPending {
		return result{}, false
	}
	return result{info: binary.LittleEndian.Uint32(w[:4]), st: st}, true
}

// copyRemote copies memory a peer RDMA-wrote without a completion event
// between (polling mode).
func copyRemote(dst, src []byte) int { return copy(dst, src) }

// putPending arms a polling request's status block.
func putPending(b []byte) {
	ios := protocol.IOStatusBlock{Status: protocol.StatusPending}
	ios.Put(b)
}
