// Package share is the server's view of a share on local disk: its root,
// opened once; every path a client names resolved beneath that root
// (openat2 RESOLVE_BENEATH, or a component-by-component walk where openat2
// is missing: confine_linux.go); the namespace operations (ops_linux.go),
// directory listings (readdir_linux.go), extended attributes
// (xattr_linux.go) and open files (file_linux.go); and the share's
// policies — who may connect, and the read-only rule (writable).
//
// It is the only code of the server that touches the disk. The session
// channel (protocol/session) speaks the wire and calls a Tree for every
// namespace operation; the LWIO engine (protocol/server) reads and writes
// registered files through File. Errors come back as protocol.Status
// values, mapped once here through protocol/ntstatus, so that both
// channels answer a failure with the same NTSTATUS; ReadAt alone also
// returns io.EOF, as io.ReaderAt does.
//
// Every disk operation of a session goes through its Tree, the share as
// one logged-on user sees it (SMB's tree connect), and runs with the
// user's Unix account — fsuid, fsgid and supplementary groups set on the
// OS thread doing it (identity_linux.go) — so that the kernel's own
// permission checks decide. Accounts resolves logon names to accounts
// (account_linux.go); the share's policies whatever the identity (no
// set-id bits, no security.* or trusted.* xattrs, no device nodes, no
// data opens of anything but files and directories) are in
// policy_linux.go.
package share

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

// Config is a directory served under a name.
type Config struct {
	// Name is what clients tree-connect to; matched case-insensitively.
	Name string
	// Path is the directory on the server's disk. Nothing outside it is
	// reachable through the share.
	Path string
	// ReadOnly refuses every modifying operation with STATUS_ACCESS_DENIED
	// (see writable).
	ReadOnly bool
	// Users may tree-connect; empty means every authenticated user.
	Users []string
	// NoLeases grants no leases on the share: clients cache only for
	// their attribute and entry timeouts (lease_linux.go).
	NoLeases bool
	// LeaseBreakTimeout bounds how long a change waits for a lease
	// holder's acknowledgement; zero means DefaultLeaseBreakTimeout.
	LeaseBreakTimeout time.Duration
	// AllowRoot lets a user whose account is uid 0 connect (and act as
	// root); by default such a tree connect is refused (RootRefused).
	AllowRoot bool
	// AllowSetid lets set-user-ID and set-group-ID bits reach the disk
	// through chmod, create and mkdir; by default they are cleared
	// (policy_linux.go).
	AllowSetid bool
	// AllowDevices lets clients create device nodes (MknodAllowed); by
	// default only FIFOs and sockets may be created.
	AllowDevices bool
}

// Share is an open share: its root directory descriptor and its policies.
// Safe for concurrent use; Close it when the server stops.
type Share struct {
	Config
	root   *root
	users  map[string]bool // lower-cased; nil = everyone
	umask  uint32          // the process umask at Open
	idKey  []byte          // seals FileIDs (durable_linux.go); nil: none issued
	idMACs sync.Pool       // of HMAC-SHA256 states keyed with idKey

	leases   *leaseTable // nil: no leases (lease_linux.go)
	leaseErr error       // why not, when the kernel could not watch
}

// Open opens the share's root. noOpenat2 forces the walking resolver (for
// tests and kernels whose openat2 misbehaves); otherwise openat2 is used
// when the kernel has it. The process umask is read here: see Umask.
func Open(c Config, noOpenat2 bool) (*Share, error) {
	if c.Name == "" || strings.ContainsAny(c.Name, `\/`) {
		return nil, fmt.Errorf("share: bad share name %q", c.Name)
	}
	r, err := openRoot(c.Path, noOpenat2)
	if err != nil {
		return nil, fmt.Errorf("share %q: %w", c.Name, err)
	}
	s := &Share{Config: c, root: r, umask: Umask()}
	if !c.NoLeases {
		s.openLeases(c.LeaseBreakTimeout)
	}
	if len(c.Users) > 0 {
		s.users = map[string]bool{}
		for _, u := range c.Users {
			s.users[strings.ToLower(u)] = true
		}
	}
	return s, nil
}

// Close closes the root. Trees and open files of the share must not be
// used after.
func (s *Share) Close() error {
	s.closeLeases()
	return s.root.close()
}

// Resolver names the path resolver in use, for logs: "openat2" or "walk".
func (s *Share) Resolver() string {
	if s.root.walk {
		return "walk"
	}
	return "openat2"
}

// Identity is who a Tree acts for: the logged-on name, and the Unix
// account whose credentials its disk operations run with
// (identity_linux.go).
type Identity struct {
	// User is the logged-on user name, matched case-insensitively.
	User string
	// Account is the Unix account the user acts as.
	Account Account

	// src is the resolver the identity came from (Accounts.Identity), for
	// looking the account up again once its TTL has passed; nil keeps
	// Account as it is.
	src *Accounts
}

// Account is a Unix account on the server host: what a Tree's disk
// operations run as (fsuid Uid, fsgid Gid, supplementary groups Groups).
// The session channel sends it to the client at tree connect, so that the
// client can map owners.
type Account struct {
	// Name is the account's name in the server's passwd database.
	Name string
	Uid  uint32
	Gid  uint32
	// Groups are the supplementary group ids, as the group database lists
	// them (the primary group may be among them).
	Groups []uint32
}

// Tree is the share as one logged-on user acts on it (SMB's tree connect;
// Samba's connection_struct): every disk operation of a session goes
// through one of its methods, so that they are the one place that takes on
// the user's identity. Safe for concurrent use.
type Tree struct {
	sh      *Share
	id      Identity
	acct    atomic.Pointer[accountEntry] // what the next operation runs as (treeCred)
	listing dirListing                   // READDIR continuation cache
	lease   *treeLeases                  // set by EnableLeases
}

// Connect returns the share as id sees it: STATUS_ACCESS_DENIED when the
// share lists its users and id is not one of them, a RootRefused (which
// is ACCESS_DENIED) when id acts as root and the share does not allow it.
// Every disk operation of the tree runs as id.Account (identity_linux.go).
func (s *Share) Connect(id Identity) (*Tree, error) {
	if s.users != nil && !s.users[strings.ToLower(id.User)] {
		return nil, protocol.StatusAccessDenied
	}
	if err := s.rootAllowed(id.User, id.Account); err != nil {
		return nil, err
	}
	t := &Tree{sh: s, id: id}
	expires := farFuture
	if id.src != nil {
		expires = id.src.now().Add(id.src.cfg.TTL)
	}
	t.acct.Store(&accountEntry{acct: id.Account, cred: newCred(id.Account), expires: expires})
	return t, nil
}

// Share is the share the tree acts on.
func (t *Tree) Share() *Share { return t.sh }

// Identity is who the tree acts for.
func (t *Tree) Identity() Identity { return t.id }

// writable is the read-only policy, the one place it is decided: on a
// read-only share every operation that would change the disk — OPEN for
// writing (or with O_CREAT or O_TRUNC), WRITE through any handle or Fid,
// SETATTR, MKDIR, RMDIR, UNLINK, RENAME, SYMLINK, LINK, SETXATTR,
// REMOVEXATTR — fails with STATUS_ACCESS_DENIED. That is Samba's answer
// for a share that is not writeable (its CAN_WRITE check in open and
// mkdir) and Windows' for a share whose permissions do not grant write;
// MEDIA_WRITE_PROTECTED (EROFS) stays what it means on the wire: the
// filesystem under the share is itself read-only.
func (t *Tree) writable() error {
	if t.sh.ReadOnly {
		return protocol.StatusAccessDenied
	}
	return nil
}

// fail maps a disk error to the NTSTATUS the client sees; nil stays nil.
func fail(err error) error {
	if err == nil {
		return nil
	}
	return ntstatus.FromError(err)
}

// Handle-less types of the share's operations. The session channel carries
// them as they are (protocol/session's Attr, SetAttrIn, StatFS and DirEntry
// are these).

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

// StatFS is a filesystem's statistics as statfs(2) reports them for the
// share root.
type StatFS struct {
	Blocks, Bfree, Bavail uint64
	Files, Ffree          uint64
	Bsize, Frsize         uint32
	NameLen               uint32
}
