package session

import "github.com/lwiofs/lwiofs/protocol/share"

// Handle names an open file (or pipe) on a session. Handles are only
// meaningful on the session that opened them.
type Handle uint64

// The attributes, directory entries, setattr requests and filesystem
// statistics the session channel carries are protocol/share's: what the
// server's disk code returns goes on the wire as it is.
type (
	Attr        = share.Attr
	DirEntry    = share.DirEntry
	SetAttrMask = share.SetAttrMask
	SetAttrIn   = share.SetAttrIn
	StatFS      = share.StatFS
)

// SetAttrIn fields (share's).
const (
	SetMode  = share.SetMode
	SetUid   = share.SetUid
	SetGid   = share.SetGid
	SetSize  = share.SetSize
	SetAtime = share.SetAtime
	SetMtime = share.SetMtime
)

func encodeAttr(e *encoder, a *Attr) {
	e.u64(a.Ino)
	e.u32(a.Mode)
	e.u32(a.Nlink)
	e.u32(a.Uid)
	e.u32(a.Gid)
	e.u32(a.Rdev)
	e.u32(a.Blksize)
	e.u64(a.Size)
	e.u64(a.Blocks)
	e.time(a.Atime)
	e.time(a.Mtime)
	e.time(a.Ctime)
}

func decodeAttr(d *decoder, a *Attr) {
	a.Ino = d.u64()
	a.Mode = d.u32()
	a.Nlink = d.u32()
	a.Uid = d.u32()
	a.Gid = d.u32()
	a.Rdev = d.u32()
	a.Blksize = d.u32()
	a.Size = d.u64()
	a.Blocks = d.u64()
	a.Atime = d.time()
	a.Mtime = d.time()
	a.Ctime = d.time()
}

// attrWireSize is the encoded size of an Attr.
const attrWireSize = 8 + 6*4 + 8 + 8 + 3*12

func encodeSetAttrIn(e *encoder, s *SetAttrIn) {
	e.u32(uint32(s.Valid))
	e.u32(s.Mode)
	e.u32(s.Uid)
	e.u32(s.Gid)
	e.u64(s.Size)
	e.time(s.Atime)
	e.time(s.Mtime)
	e.bool(s.AtimeNow)
	e.bool(s.MtimeNow)
}

func decodeSetAttrIn(d *decoder, s *SetAttrIn) {
	s.Valid = SetAttrMask(d.u32())
	s.Mode = d.u32()
	s.Uid = d.u32()
	s.Gid = d.u32()
	s.Size = d.u64()
	s.Atime = d.time()
	s.Mtime = d.time()
	s.AtimeNow = d.bool()
	s.MtimeNow = d.bool()
}

func encodeStatFS(e *encoder, s *StatFS) {
	e.u64(s.Blocks)
	e.u64(s.Bfree)
	e.u64(s.Bavail)
	e.u64(s.Files)
	e.u64(s.Ffree)
	e.u32(s.Bsize)
	e.u32(s.Frsize)
	e.u32(s.NameLen)
}

func decodeStatFS(d *decoder, s *StatFS) {
	s.Blocks = d.u64()
	s.Bfree = d.u64()
	s.Bavail = d.u64()
	s.Files = d.u64()
	s.Ffree = d.u64()
	s.Bsize = d.u32()
	s.Frsize = d.u32()
	s.NameLen = d.u32()
}
