package session

import (
	"context"
	"crypto/rand"

	"github.com/lwiofs/lwiofs/protocol"
)

// Durable handles (SMB2 durable handle v2 as the model): an open that
// outlives its connection. The client names it at OPEN with a DurableID of
// its own choosing (SMB2's CreateGuid); when the connection drops the
// server keeps the open — with its locks — for ServerConfig.DurableTimeout,
// and REOPEN on a new session of the same user reclaims it. An OPEN that
// repeats a known DurableID is a replay of an OPEN whose answer was lost,
// answered with the open it made, so that an O_EXCL create is never
// refused with EEXIST because its first answer went missing. When the
// server lost the open (a restart, the timeout), REOPEN re-opens the file
// by its sealed identity (the OPEN answer's FileID; protocol/share,
// durable_linux.go): the same file or ESTALE, never another file under the
// old name — and the locks are gone, which the answer says.

// DurableID names a durable open; all zero asks for none.
type DurableID [16]byte

// NewDurableID returns a random id.
func NewDurableID() DurableID {
	var id DurableID
	rand.Read(id[:])
	return id
}

// IsZero reports whether id asks for no durable handle.
func (id DurableID) IsZero() bool { return id == DurableID{} }

// Flags of a REOPEN answer.
const (
	// reopenReclaimed: the open itself, kept since the connection
	// dropped, with its locks. Clear: the file opened anew by its
	// identity; locks held through the old open are gone.
	reopenReclaimed uint32 = 1 << 0
)

// reopenReq reclaims a durable open, or re-opens its file by identity.
// Flags are open(2) flags (O_CREAT, O_EXCL, O_TRUNC are ignored).
type reopenReq struct {
	DurableID DurableID
	FileID    []byte
	Path      string
	Flags     uint32
}

func (m *reopenReq) code(c coder) {
	c.guid((*[16]byte)(&m.DurableID))
	c.blob(&m.FileID)
	c.str(&m.Path)
	c.u32(&m.Flags)
}

type reopenResp struct {
	Handle Handle
	Attr   Attr
	Flags  uint32
}

func (m *reopenResp) code(c coder) { handle(c, &m.Handle); codeAttr(c, &m.Attr); c.u32(&m.Flags) }

// OpenDurable is Open asking for a durable handle named id (see
// NewDurableID), and also returns the file's sealed identity (nil when the
// server issues none), which Reopen needs after a server restart. Sending
// the same id again — after the connection broke before the answer came —
// returns the open the first request made. As Open, it asks for the LWIO
// registration when RegisterOnOpen is on.
func (t *Tree) OpenDurable(ctx context.Context, path string, flags int, mode uint32, id DurableID) (Handle, Attr, []byte, error) {
	r, err := t.open(ctx, openReq{Path: path, Flags: uint32(flags), Mode: mode, DurableID: id})
	return r.Handle, r.Attr, r.FileID, err
}

// Reopen gets a durable open back on this session after its connection
// was lost: the open itself with its locks (reclaimed true) while the
// server still keeps it, else the file re-opened by its identity fileID
// (reclaimed false: its locks are gone), path being the client's current
// name for it. A file deleted or replaced meanwhile is
// STATUS_FILE_INVALID (ESTALE).
func (t *Tree) Reopen(ctx context.Context, id DurableID, fileID []byte, path string, flags int) (h Handle, a Attr, reclaimed bool, err error) {
	var r reopenResp
	err = t.call(ctx, CmdReopen, &reopenReq{DurableID: id, FileID: fileID, Path: path, Flags: uint32(flags)}, &r)
	return r.Handle, r.Attr, r.Flags&reopenReclaimed != 0, err
}

// Append writes p at the end of h's file as it is at the time of the write
// (WRITE at Offset WriteToEndOfFile: the server places it, atomically with
// every other appender) and returns the bytes written and the end of file
// just past them. More than MaxIOSize goes as several appends, each whole.
func (t *Tree) Append(ctx context.Context, h Handle, p []byte) (int, int64, error) {
	return t.write(ctx, h, p, -1)
}

// WriteToEndOfFile is the WRITE Offset that appends (protocol's, MS-FSA's
// FILE_WRITE_TO_END_OF_FILE).
const WriteToEndOfFile = protocol.WriteToEndOfFile
