package server

import (
	"errors"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
	"github.com/lwiofs/lwiofs/transport"
)

// WRITE data taken by reference (docs/engine.md, "WRITE data lent"): the
// mount marks a WRITE's and its FRAGMENTs' SENDs lent (transport.SendWR
// Lend: it keeps the data until the answer), and softrdma to a mount on
// this host leaves the data in the mount's memory: the receive completes
// with the header placed and the data's place (transport.Lent). A plain
// WRITE, VEC_WRITE or FRAGMENT to a file keeps it so and is written
// straight from the mount's memory (writeLent: one copy, the pwrite,
// where placing it first made two); anything else — an append, COLLAPSE,
// any other opcode, a pin refused — has the bytes placed behind the header
// in the receive buffer first, as before (placeLent).
//
// The receive buffer past the placed bytes holds what it held (on a
// shared receive queue, another connection's message): a request's Data
// never covers it. received hands DecodeRequest the message's full length
// only for the opcodes whose decoding reads no data byte, and assemble
// keeps only the placed bytes as Data.

// received returns the message a receive completion wc delivered into rb:
// its placed bytes and, when the sender lent a tail, the bytes up to the
// message's full length, which decoding reads only the length of (a
// lendable header), or placed now (anything else).
func (c *conn) received(rb *recvBuf, wc *transport.Completion) ([]byte, error) {
	b := rb.seg.Bytes()
	l := wc.Lent
	rb.lent, rb.lender = transport.Lent{}, nil
	if l.Length == 0 {
		return b[:wc.Len], nil
	}
	lr := c.lend
	if r, ok := wc.Conn.(transport.LentReader); ok {
		lr = r // the provider's own connection, under any wrapper of tc
	}
	if lr == nil || l.Length < 0 || wc.Len+l.Length > len(b) {
		return nil, errors.New("protocol violation: a lent message the connection cannot read")
	}
	full := b[:wc.Len+l.Length]
	if lendable(b[:wc.Len]) {
		rb.lent, rb.lender = l, lr
		return full, nil
	}
	if err := lr.PlaceLent(l, full[wc.Len:]); err != nil {
		return nil, err
	}
	return full, nil
}

// lendable reports whether msg's bytes placed so far are a whole header
// whose data may stay lent: a WRITE that does not append, a VEC_WRITE,
// neither COLLAPSE, or a FRAGMENT. DecodeRequest reads none of their
// data, only its length.
func lendable(msg []byte) bool {
	if len(msg) != protocol.HeaderSize {
		return false
	}
	h, err := protocol.DecodeHeader(msg)
	if err != nil || h.Flags&protocol.FlagCollapse != 0 {
		return false
	}
	switch h.Opcode {
	case protocol.OpWrite:
		return h.Offset != protocol.WriteToEndOfFile
	case protocol.OpVecWrite, protocol.OpFragment:
		return true
	}
	return false
}

// placed is the part of data, a message's Data as decoded from rb, that
// is in rb: all of it unless rb's tail is lent.
func (rb *recvBuf) placed(data []byte) []byte {
	return data[:len(data)-rb.lent.Length]
}

// hasLent reports whether a message of sl's write left its data lent.
func (sl *slot) hasLent() bool {
	if sl.recv != nil && sl.recv.lent.Length > 0 {
		return true
	}
	for _, rb := range sl.frags {
		if rb.lent.Length > 0 {
			return true
		}
	}
	return false
}

// placeLent copies every lent tail of sl's write into its receive buffer
// behind the bytes placed there, and makes Data cover them: the write is
// then as if nothing had been lent. An error (the mount retired the
// memory before the answer: a broken promise) fails the connection.
func (c *conn) placeLent(sl *slot) error {
	if rb := sl.recv; rb != nil && rb.lent.Length > 0 {
		d, err := c.placeOne(rb, sl.req.Data)
		if err != nil {
			return err
		}
		sl.req.Data = d
		if len(sl.fragData) > 0 {
			sl.fragData[0] = d
		}
	}
	for i, rb := range sl.frags {
		if rb.lent.Length > 0 {
			d, err := c.placeOne(rb, sl.fragData[i+1])
			if err != nil {
				return err
			}
			sl.fragData[i+1] = d
		}
	}
	return nil
}

// placeOne places rb's lent tail behind data, the placed data of its
// message (which follows the header: every lendable message's does).
func (c *conn) placeOne(rb *recvBuf, data []byte) ([]byte, error) {
	b := rb.seg.Bytes()
	end := protocol.HeaderSize + len(data)
	full := b[protocol.HeaderSize : end+rb.lent.Length]
	if err := rb.lender.PlaceLent(rb.lent, full[len(data):]); err != nil {
		c.fail(err)
		return nil, err
	}
	rb.lent, rb.lender = transport.Lent{}, nil
	return full, nil
}

// writeLent writes sl's write at off from where its data is, the lent
// tails read in the mount's memory (PinLent: region held, pages there).
// ok false: a pin was refused, nothing was written, nothing stays pinned;
// the caller places the data and writes from the receive buffers.
//
// The pwrite runs as WriteAt always does (share: as the account, on its
// identity thread or io_uring personality): the source is memory of this
// process either way.
func (c *conn) writeLent(sl *slot, fe *fidEntry, off int64) (got int, err error, ok bool) {
	pieces, pins := sl.lentPieces[:0], sl.pins[:0]
	add := func(rb *recvBuf, data []byte) bool {
		if len(data) > 0 {
			pieces = append(pieces, data)
		}
		if rb.lent.Length == 0 {
			return true
		}
		src, ok := rb.lender.PinLent(rb.lent)
		if !ok {
			return false
		}
		pins = append(pins, rb)
		pieces = append(pieces, src)
		return true
	}
	ok = add(sl.recv, sl.req.Data)
	if len(sl.fragData) > 0 {
		for i := 0; ok && i < len(sl.frags); i++ {
			ok = add(sl.frags[i], sl.fragData[i+1])
		}
	}
	if ok {
		got, err = writeFragments(fe.file, pieces, off)
		c.s.ctr.writesInPlace.Add(1)
	}
	for _, rb := range pins {
		rb.lender.UnpinLent(rb.lent)
	}
	clear(pieces)
	clear(pins)
	sl.lentPieces, sl.pins = pieces[:0], pins[:0]
	return got, err, ok
}

// writeFromLent serves a plain WRITE whose data was lent: in place, or
// placed and written from the receive buffers. done false: nothing was
// lent, the caller writes as usual.
func (c *conn) writeFromLent(sl *slot, fe *fidEntry, off int64) (protocol.Status, uint32, bool) {
	if !sl.hasLent() {
		return 0, 0, false
	}
	if got, err, ok := c.writeLent(sl, fe, off); ok {
		return ntstatus.FromError(err), uint32(got), true
	}
	if err := c.placeLent(sl); err != nil {
		return protocol.StatusInvalidParameter, 0, true
	}
	return 0, 0, false
}
