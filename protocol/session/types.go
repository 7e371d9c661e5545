package session

import (
	"time"

	"github.com/lwiofs/lwiofs/protocol/share"
)

// Handle names an open file (or pipe) on a session. Handles are only
// meaningful on the session that opened them.
type Handle uint64

// The attributes, directory entries, setattr requests and filesystem
// statistics the session channel carries are protocol/share's: what the
// server's disk code returns goes on the wire as it is.
type (
	Attr      = share.Attr
	DirEntry  = share.DirEntry
	SetAttrIn = share.SetAttrIn
	StatFS    = share.StatFS
	Account   = share.Account
)

// SetAttrIn.Valid bits (share's).
const (
	SetMode, SetUid, SetGid     = share.SetMode, share.SetUid, share.SetGid
	SetSize, SetAtime, SetMtime = share.SetSize, share.SetAtime, share.SetMtime
)

func codeAttr(c coder, a *Attr) {
	c.u64(&a.Ino)
	u32s(c, &a.Mode, &a.Nlink, &a.Uid, &a.Gid, &a.Rdev, &a.Blksize)
	u64s(c, &a.Size, &a.Blocks)
	times(c, &a.Atime, &a.Mtime, &a.Ctime)
}

// attrWireSize is the encoded size of an Attr.
const attrWireSize = 8 + 6*4 + 8 + 8 + 3*12

func codeSetAttrIn(c coder, s *SetAttrIn) {
	u32s(c, (*uint32)(&s.Valid), &s.Mode, &s.Uid, &s.Gid)
	c.u64(&s.Size)
	times(c, &s.Atime, &s.Mtime)
	c.bool(&s.AtimeNow)
	c.bool(&s.MtimeNow)
}

// codeAccount codes the account a tree acts as (docs/session.md,
// "Identity"): Uid, Gid, a u16-counted list of group ids, the name.
func codeAccount(c coder, a *Account) {
	u32s(c, &a.Uid, &a.Gid)
	list16(c, &a.Groups, 4, c.u32)
	c.str(&a.Name)
}

func codeStatFS(c coder, s *StatFS) {
	u64s(c, &s.Blocks, &s.Bfree, &s.Bavail, &s.Files, &s.Ffree)
	u32s(c, &s.Bsize, &s.Frsize, &s.NameLen)
}

// u32s, u64s and times code runs of fields of one kind.
func u32s(c coder, fs ...*uint32) {
	for _, f := range fs {
		c.u32(f)
	}
}

func u64s(c coder, fs ...*uint64) {
	for _, f := range fs {
		c.u64(f)
	}
}

func times(c coder, fs ...*time.Time) {
	for _, f := range fs {
		c.time(f)
	}
}
