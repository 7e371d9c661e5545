package soft

import (
	"errors"

	"github.com/lwiofs/lwiofs/transport"
)

// Filling the dialer's memory in place (transport.RemoteFiller): a
// listener that maps the dialer's arena lets its user write an RDMA
// WRITE's bytes straight into the target, under the guards of a copy
// (peerArena.take: the slot held, handle, access, bounds, the pages
// there), and posts a WRITE whose SGL is the token below. gather frames it
// as a shared-memory notice (flagShm, no payload), as if shmRun had copied
// it; the dialer's reader completes it in stream order as before.

// placedRegion is the token a filled WRITE's segment carries: its bytes
// are in the peer's memory already. Each connection has one (conn.fillTok);
// Post accepts it only on that connection, alone in an OpWrite's SGL.
type placedRegion struct{}

var _ transport.Region = (*placedRegion)(nil)

func (*placedRegion) Bytes() []byte            { return nil }
func (*placedRegion) Addr() uint64             { return 0 }
func (*placedRegion) Handle() uint32           { return 0 }
func (*placedRegion) Access() transport.Access { return transport.AccessLocal }
func (*placedRegion) Deregister() error {
	return errors.New("softrdma: a filled WRITE's token is not a region")
}

var _ transport.RemoteFiller = (*conn)(nil)

// FillRemote is transport.RemoteFiller's: it refuses unless the WRITE
// would go by shared memory (a listener mapping the dialer's arena, at
// least shmMinCopy bytes, not sealed: a sealed connection carries its data
// on the carrier, encrypted) and the target resolves (take). A connection
// with faults refuses too: a WRITE its faults drop must not land.
//
// So does a connection that has left stateOpen, and one whose mapping is
// being unmapped (finish, waiting for a fill in progress: a pread can take
// as long as its file does): the fill never queues behind the unmap, which
// would hold the caller (a disk worker) for as long.
func (c *conn) FillRemote(rkey uint32, addr uint64, n int, fill func([]byte) (int, error)) (transport.Segment, bool, error) {
	pa := c.peer
	if pa == nil || n < c.p.shmMinCopy || n > c.limits.MaxMessageSize || c.faults != nil || c.sealk.Load() != nil {
		return transport.Segment{}, false, nil
	}
	select {
	case <-c.closing:
		return transport.Segment{}, false, nil
	default:
	}
	if !pa.mu.TryRLock() {
		return transport.Segment{}, false, nil
	}
	defer pa.mu.RUnlock()
	start, slot, ok := pa.take(rkey, addr, n, true)
	if !ok {
		return transport.Segment{}, false, nil
	}
	if pa.hook != nil {
		pa.hook()
	}
	got, err := fill(pa.mem[start : start+uint64(n) : start+uint64(n)])
	release(pa.mem, slot)
	got = min(max(got, 0), n)
	c.p.shmFills.Add(1)
	return transport.Segment{Region: &c.fillTok, Length: got}, true, err
}

// checkPlaced checks a WRITE carrying a fill's token: the token alone,
// and this connection's.
func (c *conn) checkPlaced(wr *transport.SendWR) (placed bool, err error) {
	for _, s := range wr.SGL {
		if _, ok := s.Region.(*placedRegion); !ok {
			continue
		}
		if s.Region != &c.fillTok || wr.Op != transport.OpWrite || len(wr.SGL) != 1 || s.Offset != 0 || s.Length < 0 || s.Length > c.limits.MaxMessageSize {
			return false, errors.New("softrdma: a filled WRITE's token must be the whole SGL of a WRITE on the connection that filled")
		}
		return true, nil
	}
	return false, nil
}

// isPlaced reports whether e is a filled WRITE.
func (e *sendEntry) isPlaced() bool {
	if e.op != transport.OpWrite || len(e.segs) != 1 {
		return false
	}
	_, ok := e.segs[0].Region.(*placedRegion)
	return ok
}

// errPlacedSealed fails a connection whose peer turned sealing on
// between a fill and its WRITE's turn to go: the bytes are in the peer's
// memory, and a sealed frame cannot say so.
var errPlacedSealed = errors.New("a filled WRITE met a sealed connection")

// placedFrame frames a filled WRITE in the batch: its header alone, with
// flagShm, as shmRun leaves a WRITE it copied. On a sealed connection
// (sealed: the peer turned sealing on after the fill) the frame is left
// out and the connection fails. c.mu is held.
func (c *conn) placedFrame(sealed bool, h *frameHeader, hb []byte) {
	if sealed {
		go c.fail(failure{why: "protocol violation", err: errPlacedSealed})
		return
	}
	h.Flags |= flagShm
	h.encode(hb)
	c.wr.iov = append(c.wr.iov, hb)
}
