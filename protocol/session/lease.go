package session

import (
	"context"
	"errors"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// Leases on the session channel (docs/session.md, "Leases"): a client that
// caches asks for a lease with LEASE (a lookup), or with the lease fields
// at the end of OPEN, MKDIR and READDIR; the server grants what
// protocol/share allows, and sends LEASE_BREAK — unsolicited — when a
// lease no longer holds; the client answers the breaks that ask for it
// with LEASE_ACK. Only a tree whose TREE_CONNECT response says the share
// grants leases may ask, so a client that never asks never receives a
// frame it did not request.

// LeaseState is a set of lease rights (MS-SMB2's lease state bits).
type LeaseState = share.LeaseState

// Lease rights.
const (
	LeaseRead   = share.LeaseRead
	LeaseHandle = share.LeaseHandle
	LeaseWrite  = share.LeaseWrite
)

// LeaseBreak is a LEASE_BREAK the server sent: see share.LeaseBreak.
type LeaseBreak = share.LeaseBreak

// treeFlagLeases in a TREE_CONNECT response: the share grants leases.
const treeFlagLeases uint32 = 8

// leaseBreakAckRequired in a LEASE_BREAK's Flags: the server waits for the
// LEASE_ACK (SMB2_NOTIFY_BREAK_LEASE_FLAG_ACK_REQUIRED).
const leaseBreakAckRequired uint32 = 1

// leaseTail is a lease request (the rights wanted) or grant at the end of
// a body, there only when the client asked: an older peer's body ends
// before it.
type leaseTail struct {
	Leased bool
	Lease  uint32
}

func (l *leaseTail) tail() *leaseTail { return l }

func (l *leaseTail) code(c coder) bool {
	if c.tail(&l.Leased) {
		c.u32(&l.Lease)
		return true
	}
	return false
}

// leaseReq is LEASE: when Want is not 0, the attributes of Path and a
// lease of Want on it; first, the leases on the objects Release names (by
// inode number) are given up.
type leaseReq struct {
	Path    string
	Want    uint32
	Release []uint64
}

func (m *leaseReq) code(c coder) { c.str(&m.Path); c.u32(&m.Want); list(c, &m.Release, 8, c.u64) }

// leaseResp: Path's attributes and the lease granted (zero when Want was).
type leaseResp struct {
	Attr  Attr
	State uint32
}

func (m *leaseResp) code(c coder) { codeAttr(c, &m.Attr); c.u32(&m.State) }

// leaseBreakMsg is LEASE_BREAK's body (server → client).
type leaseBreakMsg struct {
	BreakID uint64
	Ino     uint64
	Flags   uint32
	Current uint32
	New     uint32
	Names   []string
}

func (m *leaseBreakMsg) code(c coder) {
	u64s(c, &m.BreakID, &m.Ino)
	u32s(c, &m.Flags, &m.Current, &m.New)
	list(c, &m.Names, 2, c.str)
}

// leaseAckReq is LEASE_ACK: the break acknowledged and the rights the
// client keeps.
type leaseAckReq struct {
	BreakID uint64
	Ino     uint64
	State   uint32
}

func (m *leaseAckReq) code(c coder) { u64s(c, &m.BreakID, &m.Ino); c.u32(&m.State) }

// Client side.

// Leases reports whether the share grants leases (its TREE_CONNECT flag).
func (t *Tree) Leases() bool { return t.leases }

// OnLeaseBreak sets what handles the breaks of this tree's leases: fn
// drops what the client cached and returns the rights it keeps; the
// client then acknowledges the break when the server waits for it. fn
// runs on a goroutine of its own per break, never on the connection's
// reader. Without a handler, breaks are acknowledged at once.
func (t *Tree) OnLeaseBreak(fn func(LeaseBreak) LeaseState) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.c.breakTo == nil {
		t.c.breakTo = map[uint32]func(LeaseBreak) LeaseState{}
	}
	t.c.breakTo[t.id] = fn
}

// Lease returns the attributes of path (lstat) with a lease of want on
// it, or none (0) when the server grants none.
func (t *Tree) Lease(ctx context.Context, path string, want LeaseState) (Attr, LeaseState, error) {
	var r leaseResp
	err := t.call(ctx, CmdLease, &leaseReq{Path: path, Want: uint32(want)}, &r)
	return r.Attr, LeaseState(r.State), err
}

// ReleaseLeases gives up the leases on the objects with these inode
// numbers.
func (t *Tree) ReleaseLeases(ctx context.Context, inos []uint64) error {
	return t.call(ctx, CmdLease, &leaseReq{Release: inos}, &leaseResp{})
}

// OpenLease is Open with a lease of want on the file.
func (t *Tree) OpenLease(ctx context.Context, path string, flags int, mode uint32, want LeaseState) (Handle, Attr, LeaseState, error) {
	h, a, _, got, err := t.OpenDurableLease(ctx, path, flags, mode, DurableID{}, want)
	return h, a, got, err
}

// OpenDurableLease is OpenDurable with a lease of want on the file. A
// replay of it (the same id) is answered with the first open and no lease:
// a lease granted then went with the session that asked.
func (t *Tree) OpenDurableLease(ctx context.Context, path string, flags int, mode uint32, id DurableID, want LeaseState) (Handle, Attr, []byte, LeaseState, error) {
	r, err := t.open(ctx, openReq{Path: path, Flags: uint32(flags), Mode: mode, DurableID: id, leaseTail: leaseTail{true, uint32(want)}})
	return r.Handle, r.Attr, r.FileID, LeaseState(r.Lease), err
}

// MkdirLease is Mkdir with a lease of want on the new directory.
func (t *Tree) MkdirLease(ctx context.Context, path string, mode uint32, want LeaseState) (Attr, LeaseState, error) {
	var r mkdirResp
	err := t.call(ctx, CmdMkdir, &mkdirReq{Path: path, Mode: mode, leaseTail: leaseTail{true, uint32(want)}}, &r)
	return r.Attr, LeaseState(r.Lease), err
}

// ReadDirLease is ReadDir with a lease of want on the directory and of
// entryWant on each entry: leases[i] is ents[i]'s.
func (t *Tree) ReadDirLease(ctx context.Context, path string, want, entryWant LeaseState) (ents []DirEntry, leases []LeaseState, got LeaseState, err error) {
	after := ""
	for first := true; ; first = false {
		req := &readDirReq{Path: path, After: after, MaxBytes: readDirPage, leaseTail: leaseTail{true, 0}, EntryWant: uint32(entryWant)}
		if first {
			req.Lease = uint32(want)
		}
		var r readDirResp
		if err := t.call(ctx, CmdReadDir, req, &r); err != nil {
			return nil, nil, 0, err
		}
		if len(r.Leases) != len(r.Entries) {
			return nil, nil, 0, protocol.StatusInvalidNetworkResp
		}
		if first {
			got = LeaseState(r.Lease)
		}
		ents = append(ents, r.Entries...)
		for _, l := range r.Leases {
			leases = append(leases, LeaseState(l))
		}
		if !r.More || len(r.Entries) == 0 {
			return ents, leases, got, nil
		}
		after = r.Entries[len(r.Entries)-1].Name
	}
}

// ackTimeout bounds a LEASE_ACK.
const ackTimeout = 30 * time.Second

// onBreak takes a LEASE_BREAK frame off the reader: it is checked (signed,
// its sequence number above every earlier break's — a replay or a forgery
// ends the connection as a bad response does) and handed to the tree's
// handler on a goroutine of its own.
func (c *Client) onBreak(f Frame) error {
	var m leaseBreakMsg
	if err := unmarshal(f.Body, &m); err != nil {
		return err
	}
	c.mu.Lock()
	if f.MessageID <= c.lastBreak {
		c.mu.Unlock()
		return ErrReplay
	}
	c.lastBreak = f.MessageID
	fn := c.breakTo[f.TreeID]
	c.mu.Unlock()
	b := LeaseBreak{ID: m.BreakID, Ino: m.Ino, Ack: m.Flags&leaseBreakAckRequired != 0,
		Current: LeaseState(m.Current), New: LeaseState(m.New), Names: m.Names}
	go func() {
		keep := b.New
		if fn != nil {
			keep = fn(b) & b.New
		}
		if !b.Ack {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
		defer cancel()
		err := c.call(ctx, CmdLeaseAck, f.TreeID, &leaseAckReq{BreakID: b.ID, Ino: b.Ino, State: uint32(keep)}, &empty{})
		if err != nil && !errors.Is(err, ErrClosed) {
			c.log.WithError(err).WithFields(logrus.Fields{"break": b.ID, "ino": b.Ino}).Debug("lease ack failed")
		}
	}()
	return nil
}

// Server side.

// maxQueuedBreaks bounds the breaks waiting to be written to one
// connection; a client that lets more pile up is dropped.
const maxQueuedBreaks = 1 << 16

// sendBreak queues a LEASE_BREAK for tree on the connection: never
// blocking (protocol/share calls it with its table's state decided). One
// writer goroutine numbers and writes them in order.
func (c *serverConn) sendBreak(tree uint32, b share.LeaseBreak) {
	c.breakMu.Lock()
	defer c.breakMu.Unlock()
	if c.breakStop {
		return
	}
	if len(c.breakQ) >= maxQueuedBreaks {
		c.log.WithField("queued", len(c.breakQ)).Warn("dropping connection: lease breaks not read")
		c.nc.Close()
		return
	}
	c.breakQ = append(c.breakQ, queuedBreak{tree, b})
	if !c.breakRun {
		c.breakRun = true
		go c.writeBreaks()
	}
}

type queuedBreak struct {
	tree uint32
	b    share.LeaseBreak
}

// writeBreaks writes the queued breaks, numbering their frames 1, 2, 3…
// (the client refuses a break whose number is not above the last).
func (c *serverConn) writeBreaks() {
	for {
		c.breakMu.Lock()
		q := c.breakQ
		c.breakQ = nil
		if len(q) == 0 {
			c.breakRun = false
			c.breakMu.Unlock()
			return
		}
		c.breakMu.Unlock()
		for _, qb := range q {
			c.breakSeq++
			m := &leaseBreakMsg{BreakID: qb.b.ID, Ino: qb.b.Ino, Current: uint32(qb.b.Current), New: uint32(qb.b.New), Names: qb.b.Names}
			if qb.b.Ack {
				m.Flags |= leaseBreakAckRequired
			}
			h := Header{MessageID: c.breakSeq, Command: CmdLeaseBreak, TreeID: qb.tree}
			if ss := c.sess.Load(); ss != nil && ss.sealed() {
				// A sealing session's client seals everything: so are
				// its breaks (a directory's names are its data).
				h.Flags |= FlagSealed
			}
			c.respond(h, protocol.StatusSuccess, m)
		}
	}
}

// stopBreaks drops the breaks not written yet (the connection is ending).
func (c *serverConn) stopBreaks() {
	c.breakMu.Lock()
	c.breakStop = true
	c.breakQ = nil
	c.breakMu.Unlock()
}

// enableLeases lets tree id hold leases when its share grants them.
func (ss *serverSession) enableLeases(id uint32, tr *share.Tree) {
	if ss.leasing(tr) {
		tr.EnableLeases(func(b share.LeaseBreak) { ss.sendBreak(id, b) })
	}
}

// leasing reports whether tr may hold leases (TREE_CONNECT's flag).
func (ss *serverSession) leasing(tr *share.Tree) bool {
	ok, _ := tr.Share().Leasing()
	return ok && ss.sendBreak != nil
}

// othersHoldLeases reports whether another session holds leases on one of
// this session's shares: its changes may then wait for their
// acknowledgements, so they do not run on the connection's reader (which
// must stay free to read this session's own acknowledgements).
func (ss *serverSession) othersHoldLeases() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, tr := range ss.trees {
		if tr.OthersHold() {
			return true
		}
	}
	return false
}

// endLeases ends every tree's leases (the session is over).
func (ss *serverSession) endLeases() {
	ss.mu.Lock()
	trees := ss.trees
	ss.mu.Unlock()
	for _, tr := range trees {
		tr.Disconnect()
	}
}

// openLease is OPEN with a lease: a new open (durable when r asks) and the
// lease granted with it. A replayed durable OPEN never gets here (open).
func (s *Server) openLease(ss *serverSession, tr *share.Tree, r *openReq) (*openResp, error) {
	var got LeaseState
	resp, err := s.newOpen(ss, r.DurableID, func() (*share.OpenFile, Attr, error) {
		f, a, g, err := tr.OpenLease(r.Path, int(r.Flags), r.Mode, LeaseState(r.Lease))
		got = g
		return f, a, err
	})
	if err != nil {
		return nil, err
	}
	resp.leaseTail = leaseTail{true, uint32(got)}
	return resp, nil
}

// leaseDispatch runs LEASE and LEASE_ACK, and the lease forms of MKDIR and
// READDIR; ok is false for any other request.
func (s *Server) leaseDispatch(ss *serverSession, tr *share.Tree, req message) (resp message, err error, ok bool) {
	switch r := req.(type) {
	case *leaseReq:
		tr.ReleaseLeases(r.Release)
		if r.Want == 0 {
			return &leaseResp{}, nil, true
		}
		a, got, err := tr.Lease(r.Path, LeaseState(r.Want))
		return &leaseResp{Attr: a, State: uint32(got)}, err, true
	case *leaseAckReq:
		tr.AckLease(r.BreakID)
		return &empty{}, nil, true
	case *mkdirReq:
		if !r.Leased {
			return nil, nil, false
		}
		a, got, err := tr.MkdirLease(r.Path, r.Mode, LeaseState(r.Lease))
		return &mkdirResp{Attr: a, leaseTail: leaseTail{true, uint32(got)}}, err, true
	case *readDirReq:
		if !r.Leased {
			return nil, nil, false
		}
		max := int(r.MaxBytes)
		if max <= 0 || max > readDirMaxBytes {
			max = readDirMaxBytes
		}
		// More, Count, the directory's lease, the leases' count; per
		// entry its name, attributes and lease.
		const head = 1 + 4 + 4 + 4
		ents, more, got, leases, err := tr.ReadDirLease(r.Path, r.After, max-head,
			func(name string) int { return 2 + len(name) + attrWireSize + 4 }, LeaseState(r.Lease), LeaseState(r.EntryWant))
		if err != nil {
			return nil, err, true
		}
		ls := make([]uint32, len(leases))
		for i, l := range leases {
			ls[i] = uint32(l)
		}
		return &readDirResp{More: more, Entries: ents, leaseTail: leaseTail{true, uint32(got)}, Leases: ls}, nil, true
	}
	return nil, nil, false
}
