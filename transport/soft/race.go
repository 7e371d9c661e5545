//go:build race

package soft

import "sync/atomic"

// raceSeq tells the race detector what the kernel knows: bytes written to
// a socket were produced before they are read at the other end. The
// provider reads payloads with raw read(2) calls, unseen by the detector,
// as a NIC's DMA is unseen; without this edge the detector would blame the
// placement on whatever goroutine last touched the target memory (say, the
// test goroutine that filled a region before telling the peer its handle).
// It mirrors syscall's own ioSync; it exists only in race builds and holds
// no program state.
var raceSeq atomic.Uint64

func raceRelease() { raceSeq.Add(1) }
func raceAcquire() { raceSeq.Load() }
