package soft

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/lwiofs/lwiofs/transport"
)

// The frames of shared memory (shm.go; wire.go's flagShm).
//
// A listener's RDMA WRITE of at least shmMinCopy bytes into a dialer
// whose arena it mapped is copied into the arena by the transmitting
// goroutine, outside c.mu, just before the batch is written; its frame
// then goes as a header with flagShm and no payload. A copy that cannot be
// made (no such region, out of bounds, not open to remote write,
// deregistered) leaves the frame as it was: its payload crosses the carrier
// and the dialer's own checks refuse it, so protection errors come out as
// before.
//
// A dialer's SEND of at least shmMinCopy bytes on such a connection
// carries, instead of its payload, one entry per segment: a reference
// (handle, address, length) for a segment of an arena region of at least
// shmMinRef bytes, else the segment's bytes inline. A SEND its user lent
// (SendWR.Lend) marks its last reference shmLent instead: the listener
// may leave those bytes in the arena (shmlend.go).
//
//	0  kind   u32  shmInline | shmRef | shmLent (the last entry only)
//	4  length u32  the segment's bytes
//	8  handle u32  shmRef: the region's handle
//	12 -      u32  zero
//	16 addr   u64  shmRef: the address of its first byte
const (
	shmEntrySize = 24
	shmInline    = 1
	shmRef       = 2
	shmLent      = 3
	shmMinCopy   = 16 << 10
	shmMinRef    = 4 << 10
)

// shmBuf is the writer's part of shared memory: entries of the batch's
// SENDs (desc; its capacity is fixed, so the batch's vector may point
// into it) and the copies run does.
type shmBuf struct {
	desc []byte
	jobs []shmJob
	src  [][]byte
}

// shmJob is a WRITE gather framed for the socket, to be copied instead.
type shmJob struct {
	hdr        []byte // its encoded header, in frameWriter.hdrs
	h          frameHeader
	iov0, iov1 int // its payload in frameWriter.iov
}

// shmWrite reports whether gather should try a WRITE of e by copy (a
// sealed frame never gets this far: sealed connections keep their data on
// the socket).
func (c *conn) shmWrite(e *sendEntry) bool {
	return c.peer != nil && e.op == transport.OpWrite && e.length >= c.p.shmMinCopy
}

// appendRefs frames the SEND e by reference when it may go so: its entries
// go into w.iov after the header h, which it marks. It returns false, and
// appends nothing, when e goes as usual.
func (w *frameWriter) appendRefs(e *sendEntry, h *frameHeader, hb []byte, minRef int) bool {
	refs := 0
	for _, s := range e.segs {
		if r, ok := s.Region.(*region); ok && r.slot != 0 && s.Length >= minRef {
			refs++
		}
	}
	d := &w.shm
	if refs == 0 || cap(d.desc)-len(d.desc) < len(e.segs)*shmEntrySize {
		return false
	}
	h.Flags |= flagShm
	h.Wire = 0
	w.iov = append(w.iov, hb)
	first := len(d.desc)
	for _, s := range e.segs {
		if s.Length == 0 {
			continue
		}
		ent := d.desc[len(d.desc) : len(d.desc)+shmEntrySize]
		d.desc = d.desc[:len(d.desc)+shmEntrySize]
		clear(ent)
		binary.LittleEndian.PutUint32(ent[4:], uint32(s.Length))
		h.Wire += shmEntrySize
		w.iov = append(w.iov, ent)
		if r, ok := s.Region.(*region); ok && r.slot != 0 && s.Length >= minRef {
			binary.LittleEndian.PutUint32(ent, shmRef)
			binary.LittleEndian.PutUint32(ent[8:], r.handle)
			binary.LittleEndian.PutUint64(ent[16:], r.addr+uint64(s.Offset))
			continue
		}
		binary.LittleEndian.PutUint32(ent, shmInline)
		h.Wire += uint32(s.Length)
		w.iov = append(w.iov, s.Bytes())
	}
	if e.lend {
		lendLast(d.desc[first:])
	}
	h.encode(hb)
	return true
}

// shmRun makes the batch's copies, outside c.mu, and drops the payload of
// each frame it copied from the vector.
func (c *conn) shmRun() {
	w := &c.wr
	d := &w.shm
	if len(d.jobs) == 0 {
		return
	}
	for i := range d.jobs {
		j := &d.jobs[i]
		d.src = append(d.src[:0], w.iov[j.iov0:j.iov1]...)
		if !c.peer.copyTo(j.h.RKey, j.h.Addr, int(j.h.Length), d.src) {
			continue // the payload goes on the socket; the peer refuses it
		}
		c.p.shmCopies.Add(1)
		j.h.Flags |= flagShm
		j.h.encode(j.hdr)
		clear(w.iov[j.iov0:j.iov1])
	}
	clear(d.src)
	clear(d.jobs)
	d.jobs = d.jobs[:0]
	w.iov = slices.DeleteFunc(w.iov, func(b []byte) bool { return b == nil })
}

// shmRefError is a SEND entry that names no region of the arena, or does
// not add up.
type shmRefError struct{ why string }

func (e shmRefError) Error() string { return "softrdma: shared-memory SEND refused: " + e.why }

// readRefs places a SEND carried by reference (flagShm) into dst, which
// is h.Length bytes: its entries are read from the socket, its references
// copied out of the dialer's arena (c.peer). A lent last entry is checked
// (it resolves now) and returned rather than copied: dst[:len(dst)-lent.Length]
// is placed, the rest is not.
func (c *conn) readRefs(h *frameHeader, dst []byte) (lent transport.Lent, err error) {
	wire, pos := int(h.Wire), 0
	for n := 0; wire > 0; n++ {
		if n == c.limits.MaxSGE || wire < shmEntrySize {
			return lent, shmRefError{fmt.Sprintf("more than %d entries or a short one", c.limits.MaxSGE)}
		}
		if err := c.rd.fill(shmEntrySize); err != nil {
			return lent, err
		}
		ent := c.rd.buf[c.rd.r : c.rd.r+shmEntrySize]
		kind, ln := binary.LittleEndian.Uint32(ent), int(binary.LittleEndian.Uint32(ent[4:]))
		handle, addr := binary.LittleEndian.Uint32(ent[8:]), binary.LittleEndian.Uint64(ent[16:])
		c.rd.r += shmEntrySize
		wire -= shmEntrySize
		if ln > len(dst)-pos {
			return lent, shmRefError{"entries longer than the message"}
		}
		switch kind {
		case shmInline:
			if ln > wire {
				return lent, shmRefError{"inline bytes past the frame"}
			}
			if err := c.rd.readInto(dst[pos : pos+ln]); err != nil {
				return lent, err
			}
			wire -= ln
		case shmRef:
			if !c.peer.copyFrom(dst[pos:pos+ln], handle, addr) {
				return lent, shmRefError{fmt.Sprintf("%d bytes at %#x of region %#x are not in the shared memory", ln, addr, handle)}
			}
			c.p.shmRefs.Add(1)
		case shmLent:
			if !c.takeLent {
				// The user takes no lent tails (Config.TakeLent), so
				// the hello did not offer it: placed as a reference.
				if !c.peer.copyFrom(dst[pos:pos+ln], handle, addr) {
					return lent, shmRefError{fmt.Sprintf("%d bytes at %#x of region %#x are not in the shared memory", ln, addr, handle)}
				}
				c.p.shmRefs.Add(1)
				break
			}
			if wire != 0 || pos+ln != len(dst) || ln == 0 {
				return lent, shmRefError{"a lent entry that is not the message's tail"}
			}
			if !c.peer.check(handle, addr, ln) {
				return lent, shmRefError{fmt.Sprintf("%d lent bytes at %#x of region %#x are not in the shared memory", ln, addr, handle)}
			}
			lent = transport.Lent{Handle: handle, Addr: addr, Length: ln}
			c.p.shmLent.Add(1)
		default:
			return lent, shmRefError{fmt.Sprintf("entry kind %d", kind)}
		}
		pos += ln
	}
	if pos != len(dst) {
		return lent, shmRefError{fmt.Sprintf("entries make %d bytes, the message %d", pos, len(dst))}
	}
	return lent, nil
}
