package session

import "time"

// Handle names an open file (or pipe) on a session. Handles are only
// meaningful on the session that opened them.
type Handle uint64

// Attr is a file's attributes as lstat(2) reports them.
type Attr struct {
	Ino     uint64
	Mode    uint32 // unix mode including the S_IFMT type bits
	Nlink   uint32
	Uid     uint32
	Gid     uint32
	Rdev    uint32
	Blksize uint32
	Size    uint64
	Blocks  uint64 // 512-byte blocks
	Atime   time.Time
	Mtime   time.Time
	Ctime   time.Time
}

func (a *Attr) encode(e *encoder) {
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

func (a *Attr) decode(d *decoder) {
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

// DirEntry is one directory entry with its attributes (lstat of the entry).
type DirEntry struct {
	Name string
	Attr Attr
}

// SetAttrMask says which fields of a SetAttrIn apply.
type SetAttrMask uint32

// SetAttrIn fields; the names follow FATTR_* of the FUSE protocol.
const (
	SetMode  SetAttrMask = 1 << 0
	SetUid   SetAttrMask = 1 << 1
	SetGid   SetAttrMask = 1 << 2
	SetSize  SetAttrMask = 1 << 3
	SetAtime SetAttrMask = 1 << 4
	SetMtime SetAttrMask = 1 << 5
)

// SetAttrIn is a setattr request. Only the fields named in Valid are
// applied. With SetAtime (SetMtime), AtimeNow (MtimeNow) means "the
// server's current time" (UTIME_NOW) and Atime (Mtime) is ignored.
type SetAttrIn struct {
	Valid    SetAttrMask
	Mode     uint32 // permission bits (07777); type bits are ignored
	Uid, Gid uint32
	Size     uint64
	Atime    time.Time
	Mtime    time.Time
	AtimeNow bool
	MtimeNow bool
}

func (s *SetAttrIn) encode(e *encoder) {
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

func (s *SetAttrIn) decode(d *decoder) {
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

// StatFS is a filesystem's statistics as statfs(2) reports them for the
// share root.
type StatFS struct {
	Blocks, Bfree, Bavail uint64
	Files, Ffree          uint64
	Bsize, Frsize         uint32
	NameLen               uint32
}

func (s *StatFS) encode(e *encoder) {
	e.u64(s.Blocks)
	e.u64(s.Bfree)
	e.u64(s.Bavail)
	e.u64(s.Files)
	e.u64(s.Ffree)
	e.u32(s.Bsize)
	e.u32(s.Frsize)
	e.u32(s.NameLen)
}

func (s *StatFS) decode(d *decoder) {
	s.Blocks = d.u64()
	s.Bfree = d.u64()
	s.Bavail = d.u64()
	s.Files = d.u64()
	s.Ffree = d.u64()
	s.Bsize = d.u32()
	s.Frsize = d.u32()
	s.NameLen = d.u32()
}
