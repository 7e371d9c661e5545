package protocol

// Fragmented writes (docs/wire.md, "Fragmented writes"): a WRITE or
// VEC_WRITE too long for one of the receiver's buffers goes as a first
// message with FlagFragmented and FRAGMENT messages after it, each filling
// a receive buffer, in a row on the connection — SMB Direct's data
// transfer sequences (seed 004) in LWIO's shape. This file holds the
// rules alone, with no I/O: FragmentPlan for the sender, Assembly for the
// receiver. A broken rule is a *FieldError: the connection ends.

// FragmentData is how many data bytes each message of a fragmented write
// carries (the last may carry fewer): a receive buffer of recvBufferSize
// bytes less the header.
func FragmentData(recvBufferSize int) int { return recvBufferSize - HeaderSize }

// Fragments is how many messages a write of n data bytes takes with
// receive buffers of recvBufferSize bytes: 1 when it fits one.
func Fragments(n, recvBufferSize int) int {
	per := FragmentData(recvBufferSize)
	if per <= 0 || n <= per {
		return 1
	}
	return (n + per - 1) / per
}

// Assembly is a receiver's account of the fragmented write open on one
// connection. The zero value has none open.
type Assembly struct {
	first Header
	open  bool
	per   uint32 // data bytes a message carries (FragmentData)
	got   uint32 // data bytes arrived
	msgs  int    // messages arrived, the first included
}

// Open reports whether a fragmented write is being received: every
// message until it is complete must be its next FRAGMENT.
func (a *Assembly) Open() bool { return a.open }

// Messages is how many messages the open (or just completed) write came in.
func (a *Assembly) Messages() int { return a.msgs }

// First is the header of the open (or just completed) write.
func (a *Assembly) First() *Header { return &a.first }

// Start opens a fragmented write from its first message r (FlagFragmented
// set, already decoded): its data must fill a receive buffer of
// recvBufferSize bytes exactly, and its Length must need more than one and
// be at most maxWrite.
func (a *Assembly) Start(r *Request, recvBufferSize, maxWrite int) error {
	msg := r.Header.Opcode.String()
	per := FragmentData(recvBufferSize)
	switch {
	case a.open:
		return fieldErr(msg, "Flags", "a fragmented write while another is open")
	case len(r.Data) != per:
		return fieldErr(msg, "Length", "first fragment carries %d data bytes, want %d (a receive buffer's worth)", len(r.Data), per)
	case int64(r.Header.Length) > int64(maxWrite):
		return fieldErr(msg, "Length", "fragmented write of %d bytes exceeds %d", r.Header.Length, maxWrite)
	}
	*a = Assembly{first: r.Header, open: true, per: uint32(per), got: uint32(per), msgs: 1}
	return nil
}

// Next accounts r, the next message on the connection while a write is
// open: it must be a FRAGMENT continuing it (Header.Continues) that fills
// a receive buffer or, the last, carries what remains. done reports the
// write complete (Assembly is then closed; First and Messages still
// describe it).
func (a *Assembly) Next(r *Request) (done bool, err error) {
	if r.Header.Opcode != OpFragment {
		return false, fieldErr("FRAGMENT", "Opcode", "%v while a fragmented write of %d bytes has %d to come", r.Header.Opcode, a.first.Length, a.first.Length-a.got)
	}
	if !r.Header.Continues(&a.first, a.got) {
		return false, fieldErr("FRAGMENT", "Offset", "does not continue the open write (Fid %d, Offset %d, cookie %#x)", a.first.Fid, a.first.Offset+uint64(a.got), a.first.IosVa)
	}
	left := a.first.Length - a.got
	if want := min(left, a.per); r.Header.Length != want {
		return false, fieldErr("FRAGMENT", "Length", "%d data bytes, want %d", r.Header.Length, want)
	}
	a.got += r.Header.Length
	a.msgs++
	if a.got == a.first.Length {
		a.open = false
		return true, nil
	}
	return false, nil
}

// Unexpected is the error for a FRAGMENT arriving with no write open.
func (a *Assembly) Unexpected() error {
	return fieldErr("FRAGMENT", "Opcode", "no fragmented write is open")
}
