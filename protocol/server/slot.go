package server

import (
	"sync"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/transport"
)

// respSize is a slot's registered area: STATUS_RESPONSE at 0, the
// IO_STATUS_BLOCK of a polling completion at 16, the server's AUTH
// parameters at 32.
const respSize = 128

// slot is the server's state for one request from arrival until the last
// work request of its completion chain completes. Slots are reused: their
// registered response area and slices stay.
type slot struct {
	c    *conn
	idx  int
	resp transport.Region

	// req is the decoded message; its Data and Regions alias recv's
	// buffer and are cleared when it is released (releaseRecv).
	req     protocol.Request
	recv    *recvBuf // the receive buffer still held, or nil
	authn   bool     // the connection's first AUTH: it holds no credit
	fid     *fidEntry
	cancel  <-chan struct{}
	data    transport.Region // read data buffer, back to the pool with the slot
	regions []protocol.RDMARegion
	wrs     []transport.SendWR
	segs    []transport.Segment
	tail    [1]transport.Segment // the completing STATUS_RESPONSE or status block
	inline  bool                 // runs on the reaper: its posts must not wait
	// A fragmented write (fragment.go): the receive buffers of its
	// FRAGMENTs (recv holds the first), the data of every message in
	// order, and how many messages — credits — it took.
	frags    []*recvBuf
	fragData [][]byte
	msgs     int
	start    time.Time // arrival, for the latency count
	// A READ read in place (readInPlace): the file and offset fillFn,
	// bound to fillRead once, reads from.
	fillFile share.File
	fillOff  int64
	fillFn   func([]byte) (int, error)
	// A WRITE written from the mount's memory (lent.go): the pieces
	// and the pins, kept for the next.
	lentPieces [][]byte
	pins       []*recvBuf
}

// sgl returns a one-entry gather list backed by the slot (no allocation).
// Call ensureSegs first when building more than one.
func (sl *slot) sgl(i int, seg transport.Segment) []transport.Segment {
	if i >= len(sl.segs) {
		sl.ensureSegs(i + 1)
	}
	sl.segs[i] = seg
	return sl.segs[i : i+1 : i+1]
}

func (sl *slot) ensureSegs(n int) {
	if n > len(sl.segs) {
		sl.segs = make([]transport.Segment, n)
	}
}

// slotTable owns a connection's slots.
type slotTable struct {
	c       *conn
	dom     transport.Domain
	data    *transport.BufferPool
	mu      sync.Mutex
	all     []*slot
	free    []int
	used    int
	dropped bool
}

func (t *slotTable) init(c *conn, dom transport.Domain) { t.c, t.dom = c, dom }

// get returns a free slot, registering a new one while the table grows
// (under the lock: that happens only until the connection is warm).
func (t *slotTable) get() (*slot, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dropped {
		return nil, transport.ErrClosed
	}
	var sl *slot
	if n := len(t.free); n > 0 {
		sl = t.all[t.free[n-1]]
		t.free = t.free[:n-1]
	} else {
		r, err := t.dom.Alloc(respSize, transport.AccessLocal)
		if err != nil {
			return nil, err
		}
		sl = &slot{c: t.c, idx: len(t.all), resp: r}
		sl.fillFn = sl.fillRead
		t.all = append(t.all, sl)
	}
	t.used++
	return sl, nil
}

func (t *slotTable) put(idx int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if idx >= len(t.all) {
		return
	}
	sl := t.all[idx]
	t.putData(sl)
	sl.fid, sl.cancel, sl.recv, sl.authn, sl.msgs = nil, nil, nil, false, 0
	sl.req = protocol.Request{}
	sl.regions = sl.regions[:0]
	for i := range sl.wrs {
		sl.wrs[i] = transport.SendWR{}
	}
	sl.wrs = sl.wrs[:0]
	t.free = append(t.free, idx)
	t.used--
}

func (t *slotTable) inUse() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.used
}

func (t *slotTable) drop() {
	t.mu.Lock()
	all := t.all
	t.all, t.free, t.dropped = nil, nil, true
	for _, sl := range all {
		t.putData(sl) // a slot whose chain never completed still holds one
	}
	t.mu.Unlock()
	for _, sl := range all {
		sl.resp.Deregister()
	}
}

// putData gives a slot's read buffer back to the pool; under t.mu.
func (t *slotTable) putData(sl *slot) {
	if sl.data != nil && t.data != nil {
		t.data.Put(sl.data)
	}
	sl.data = nil
}
