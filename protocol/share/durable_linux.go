package share

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

// File identities: how a client re-opens a file after the server lost its
// state (a restart), by what the file is rather than by what it is called.
//
// At OPEN the server gives the client a FileID: the file's device, inode
// number and birth time (statx), and its kernel file handle
// (name_to_handle_at; ext4, xfs, btrfs and tmpfs have them), sealed with an
// HMAC-SHA256 under the server's identity key and the share's name. After a
// restart Reopen checks the seal — an id this server (with this key) did
// not issue for this share opens nothing — and then finds the file: at the
// client's current path if the file there is the same one (device, inode,
// birth time), else through open_by_handle_at and the kernel's name for
// the inode, re-resolved beneath the share root. A replaced file (a new
// inode under the old name) and a deleted one answer STATUS_FILE_INVALID
// (ESTALE); a renamed one is found where it went, as long as that is still
// inside the share. Nothing is ever opened that Open could not open by
// path: the last step is always a confined Open.

// IdentityKeySize is the size of the key that seals FileIDs.
const IdentityKeySize = 32

// identityKeyFile is the key's file name in the state directory.
const identityKeyFile = "fileid.key"

// LoadIdentityKey returns the identity key kept in dir, creating dir (mode
// 0700) and the key (mode 0600, from crypto/rand) when they are missing, so
// that FileIDs issued before a restart are still honoured after it. A key
// file of the wrong size is an error rather than replaced: replacing it
// would silently turn every durable handle into ESTALE.
func LoadIdentityKey(dir string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	p := filepath.Join(dir, identityKeyFile)
	key, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return createIdentityKey(dir, p)
	}
	if err != nil {
		return nil, fmt.Errorf("identity key: %w", err)
	}
	if len(key) != IdentityKeySize {
		return nil, fmt.Errorf("identity key %s: %d bytes, want %d (remove it to make a new one; open files of clients then get ESTALE after the next restart)", p, len(key), IdentityKeySize)
	}
	return key, nil
}

// createIdentityKey writes a new key durably: a temporary file, fsync,
// a link to the final name (which fails if another server made one
// meanwhile: that one is then used), fsync of the directory.
func createIdentityKey(dir, p string) ([]byte, error) {
	key := make([]byte, IdentityKeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(dir, identityKeyFile+".new-*")
	if err != nil {
		return nil, fmt.Errorf("identity key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err == nil {
		if _, err = tmp.Write(key); err == nil {
			err = tmp.Sync()
		}
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("identity key: %w", err)
	}
	if err := os.Link(tmp.Name(), p); errors.Is(err, os.ErrExist) {
		return LoadIdentityKey(dir)
	} else if err != nil {
		return nil, fmt.Errorf("identity key: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return key, nil
}

// SetIdentityKey makes the share issue and honour FileIDs sealed with key.
// Without a key OpenFile.FileID returns nil and Reopen finds nothing. Call
// it before the share is used.
func (s *Share) SetIdentityKey(key []byte) {
	s.idKey = append([]byte(nil), key...)
	s.idMACs = sync.Pool{New: func() any { return hmac.New(sha256.New, s.idKey) }}
}

// identity is what a FileID says about a file.
type identity struct {
	dev, ino  uint64
	btimeSec  int64
	btimeNsec uint32 // btime 0,0: the filesystem does not record it
	htype     int32
	handle    []byte // empty: no kernel file handle
}

// fileIDVersion is the first byte of every FileID.
const fileIDVersion = 1

// maxHandleBytes bounds a kernel file handle (MAX_HANDLE_SZ).
const maxHandleBytes = 128

// fileIDMACSize is the seal's size: HMAC-SHA256 truncated, as SMB signs.
const fileIDMACSize = 16

func (id *identity) encode() []byte {
	b := []byte{fileIDVersion}
	b = binary.LittleEndian.AppendUint64(b, id.dev)
	b = binary.LittleEndian.AppendUint64(b, id.ino)
	b = binary.LittleEndian.AppendUint64(b, uint64(id.btimeSec))
	b = binary.LittleEndian.AppendUint32(b, id.btimeNsec)
	b = binary.LittleEndian.AppendUint32(b, uint32(id.htype))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(id.handle)))
	return append(b, id.handle...)
}

// fileIDFixed is the encoded size without the handle.
const fileIDFixed = 1 + 8 + 8 + 8 + 4 + 4 + 2

func decodeIdentity(b []byte) (identity, bool) {
	var id identity
	if len(b) < fileIDFixed || b[0] != fileIDVersion {
		return id, false
	}
	id.dev = binary.LittleEndian.Uint64(b[1:])
	id.ino = binary.LittleEndian.Uint64(b[9:])
	id.btimeSec = int64(binary.LittleEndian.Uint64(b[17:]))
	id.btimeNsec = binary.LittleEndian.Uint32(b[25:])
	id.htype = int32(binary.LittleEndian.Uint32(b[29:]))
	n := int(binary.LittleEndian.Uint16(b[33:]))
	if n > maxHandleBytes || len(b) != fileIDFixed+n {
		return id, false
	}
	id.handle = append([]byte(nil), b[fileIDFixed:]...)
	return id, true
}

// seal is the HMAC of an encoded identity, bound to the share's name. The
// keyed states are pooled: keying one costs more than the rest of a seal,
// and every OPEN seals.
func (s *Share) seal(body []byte) []byte {
	m := s.idMACs.Get().(hash.Hash)
	defer s.idMACs.Put(m)
	m.Reset()
	m.Write([]byte("lwio file id\x00"))
	m.Write([]byte(strings.ToLower(s.Name)))
	m.Write([]byte{0})
	m.Write(body)
	var sum [sha256.Size]byte
	return append([]byte(nil), m.Sum(sum[:0])[:fileIDMACSize]...)
}

// open checks a FileID's seal and decodes it.
func (s *Share) openFileID(b []byte) (identity, bool) {
	if len(s.idKey) == 0 || len(b) < fileIDMACSize {
		return identity{}, false
	}
	body, mac := b[:len(b)-fileIDMACSize], b[len(b)-fileIDMACSize:]
	if !hmac.Equal(mac, s.seal(body)) {
		return identity{}, false
	}
	return decodeIdentity(body)
}

// statxFd is statx(2) of what fd holds: all fstat(2) reports, and the
// btime where the filesystem records one. A test makes it answer as a
// filesystem that records no btime.
var statxFd = func(fd int, stx *unix.Statx_t) error {
	return unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_BTIME, stx)
}

// statxIdentity reads what identifies the file fd holds.
func statxIdentity(fd int) (identity, error) {
	var stx unix.Statx_t
	if err := statxFd(fd, &stx); err != nil {
		return identity{}, err
	}
	return identityOf(&stx), nil
}

// identityOf is the identity (less the kernel handle) a statx describes.
func identityOf(stx *unix.Statx_t) identity {
	id := identity{dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor), ino: stx.Ino}
	if stx.Mask&unix.STATX_BTIME != 0 {
		id.btimeSec, id.btimeNsec = stx.Btime.Sec, stx.Btime.Nsec
	}
	return id
}

// statIdent is fstat(2) and statxIdentity in one statx(2): an open reads
// the attributes it answers with and the identity its FileID seals
// together. A filesystem whose statx lacks a basic field gets fstat(2)'s.
func statIdent(fd int) (st unix.Stat_t, id identity, err error) {
	var stx unix.Statx_t
	if err := statxFd(fd, &stx); err != nil {
		return st, id, err
	}
	id = identityOf(&stx)
	if stx.Mask&unix.STATX_BASIC_STATS != unix.STATX_BASIC_STATS {
		err = unix.Fstat(fd, &st)
		return st, id, err
	}
	st = unix.Stat_t{
		Dev:    unix.Mkdev(stx.Dev_major, stx.Dev_minor),
		Ino:    stx.Ino,
		Mode:   uint32(stx.Mode),
		Uid:    stx.Uid,
		Gid:    stx.Gid,
		Rdev:   unix.Mkdev(stx.Rdev_major, stx.Rdev_minor),
		Size:   int64(stx.Size),
		Blocks: int64(stx.Blocks),
		Atim:   unix.Timespec{Sec: stx.Atime.Sec, Nsec: int64(stx.Atime.Nsec)},
		Mtim:   unix.Timespec{Sec: stx.Mtime.Sec, Nsec: int64(stx.Mtime.Nsec)},
		Ctim:   unix.Timespec{Sec: stx.Ctime.Sec, Nsec: int64(stx.Ctime.Nsec)},
	}
	// Their types differ between architectures (uint32 and int32 on
	// arm64, uint64 and int64 on amd64).
	setInt(&st.Nlink, stx.Nlink)
	setInt(&st.Blksize, stx.Blksize)
	return st, id, nil
}

// setInt stores v in *dst, whatever integer type the architecture gave
// that Stat_t field.
func setInt[T ~int32 | ~int64 | ~uint32 | ~uint64](dst *T, v uint32) { *dst = T(v) }

// sameFile reports whether two identities name one file. The kernel handle
// is not compared: the triple already says it, and a filesystem may encode
// one inode's handle in more than one way.
func (id *identity) sameFile(o *identity) bool {
	return id.dev == o.dev && id.ino == o.ino && id.btimeSec == o.btimeSec && id.btimeNsec == o.btimeNsec
}

// identityOnce is an open file's sealed FileID, made once, from the
// identity its open read (statIdent) and the kernel handle a lease's
// watch took (OpenLease), when they are there.
type identityOnce struct {
	once sync.Once
	b    []byte
	id   identity // the open's statIdent, when read
	read bool
}

// FileID returns the open file's sealed identity for a durable reopen
// after a server restart (Reopen), or nil when the share has no identity
// key or the file cannot be identified. The client keeps it as opaque
// bytes.
func (f *OpenFile) FileID() []byte {
	sh := f.tree.sh
	if len(sh.idKey) == 0 {
		return nil
	}
	f.ident.once.Do(func() {
		f.withFd(func(fd int) error {
			id := f.ident.id
			if !f.ident.read {
				var err error
				if id, err = statxIdentity(fd); err != nil {
					return err
				}
			}
			if id.handle == nil {
				if h, err := fileHandle(fd); err == nil {
					id.htype, id.handle = h.Type(), h.Bytes()
				}
			}
			body := id.encode()
			f.ident.b = append(body, sh.seal(body)...)
			return nil
		})
	})
	return f.ident.b
}

// fileHandle is the kernel handle of the file fd holds, when its
// filesystem has handles and it fits a FileID.
func fileHandle(fd int) (unix.FileHandle, error) {
	h, _, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
	if err == nil && len(h.Bytes()) > maxHandleBytes {
		err = unix.EOVERFLOW
	}
	return h, err
}

// handle is fileHandle of f, kept for its FileID: a lease's watch of the
// file (OpenLease) and the FileID take it once. ok is false when the
// file has none. Before f is shared: at its open.
func (f *OpenFile) handle() (h unix.FileHandle, ok bool) {
	err := f.withFd(func(fd int) (err error) { h, err = fileHandle(fd); return err })
	if err != nil {
		return h, false
	}
	if f.ident.read {
		f.ident.id.htype, f.ident.id.handle = h.Type(), h.Bytes()
	}
	return h, true
}

// Stat returns the open file's attributes (fstat), even on a read-only
// share and for a file unlinked since it was opened.
func (f *OpenFile) Stat() (a Attr, err error) {
	err = f.withFd(func(fd int) error {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		a = attrFromStat(&st)
		return nil
	})
	return a, err
}

// errStale is Reopen's answer for a file that is not there any more as
// the FileID knew it.
var errStale = ntstatus.FileInvalid

// Reopen opens again the file a FileID names, with open(2) flags (O_CREAT,
// O_EXCL and O_TRUNC are dropped: the file exists, or is gone): a durable
// handle's reconnect after the server lost the open. p is the client's
// current name for the file; it is used only if the file there is the one
// the id names. STATUS_FILE_INVALID (ESTALE) when the file was deleted or
// replaced, or (without CAP_DAC_READ_SEARCH, or on a filesystem without
// file handles) renamed where p no longer finds it; STATUS_ACCESS_DENIED
// for an id this share did not issue.
func (t *Tree) Reopen(fileID []byte, p string, flags int) (*OpenFile, Attr, error) {
	want, ok := t.sh.openFileID(fileID)
	if !ok {
		// Forged, of another share, or sealed with a key this server
		// no longer has (its state directory was lost): either way no
		// file can be shown to be the one the client had open.
		return nil, Attr{}, errStale
	}
	flags &^= unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC
	f, a, err := t.openSame(p, flags, &want)
	if !notThere(err) {
		return f, a, err
	}
	// Not (or no longer) at p: ask the kernel where the inode is now.
	rel, found := kernelWhereIs(t.sh, &want)
	searched := false
	switch found {
	case whereNamed:
	case whereUnnamed:
		// The handle opened, so the file exists, but the kernel could
		// not name it: the handle of an inode whose dentries left the
		// cache (memory pressure, drop_caches) opens disconnected,
		// named "/" in /proc. A rename most often keeps the directory:
		// look for the inode there. Never when the handle did not
		// open (ESTALE: deleted): inode numbers are reused at once,
		// and without a btime dev+ino would take a new file for it.
		var ok bool
		if rel, ok = t.findIn(path.Dir(p), &want); !ok {
			return nil, Attr{}, errStale
		}
		searched = true
	default:
		return nil, Attr{}, errStale
	}
	f, a, err = t.openSame(rel, flags, &want)
	if err == nil && searched && !f.isExactly(&want) {
		f.Close()
		return nil, Attr{}, errStale
	}
	if notThere(err) {
		err = errStale
	}
	return f, a, err
}

// isExactly reports whether the open file is the one want names by more
// than its inode number, which a deleted file's successor may reuse: its
// kernel handle (which carries the inode's generation) equals want's. The
// caller has already checked sameFile (and with it the btime, where the
// filesystem records one). Only asked after a directory search, which
// happens only when want's handle opened the file (whereUnnamed: whereIs
// answers whereNot for an identity without a handle), so there is always
// a handle to compare; without one it answers false.
func (f *OpenFile) isExactly(want *identity) bool {
	if len(want.handle) == 0 {
		return false
	}
	same := false
	f.withFd(func(fd int) error {
		h, _, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
		same = err == nil && h.Type() == want.htype && bytes.Equal(h.Bytes(), want.handle)
		return nil
	})
	return same
}

// maxFindEntries bounds the entries findIn looks at.
const maxFindEntries = 1 << 16

// findIn looks for the file want names among the entries of directory
// dir (confined beneath the root, acting as the tree's user) by inode
// number, and returns its path; the caller re-opens it and checks the
// whole identity (openSame, isExactly).
func (t *Tree) findIn(dir string, want *identity) (rel string, ok bool) {
	if dir == "." || dir == "/" {
		dir = ""
	}
	t.as(func() error {
		fd, err := t.sh.root.open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		d := os.NewFile(uintptr(fd), dir)
		defer d.Close()
		names, _ := d.Readdirnames(maxFindEntries)
		for _, name := range names {
			var st unix.Stat_t
			if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || uint64(st.Ino) != want.ino || uint64(st.Dev) != want.dev {
				continue
			}
			rel, ok = path.Join(dir, name), true
			return nil
		}
		return nil
	})
	return rel, ok
}

// notThere reports whether an open by path failed because the name does
// not lead to the file (anymore), rather than for a reason the client
// should see (permissions, the read-only rule).
func notThere(err error) bool {
	switch ntstatus.FromError(err) {
	case errStale, protocol.StatusObjectNameNotFound, protocol.StatusObjectPathNotFound, protocol.StatusNotADirectory:
		return true
	}
	return false
}

// openSame opens p beneath the root (Open's confinement and policies) and
// keeps it only if it is the file want names.
func (t *Tree) openSame(p string, flags int, want *identity) (*OpenFile, Attr, error) {
	f, a, err := t.Open(p, flags, 0)
	if err != nil {
		return nil, Attr{}, err
	}
	var got identity
	if err := f.withFd(func(fd int) (err error) { got, err = statxIdentity(fd); return err }); err != nil || !got.sameFile(want) {
		f.Close()
		return nil, Attr{}, errStale
	}
	return f, a, nil
}

// kernelWhereIs is Share.whereIs; a test makes it answer as it does for
// a handle the kernel opens disconnected, or for a deleted file.
var kernelWhereIs = (*Share).whereIs

// where is what whereIs learnt.
type where int

const (
	whereNot     where = iota // the handle opened nothing (no handle, ESTALE: deleted, EPERM) or another file
	whereNamed                // the kernel named the file beneath the root
	whereUnnamed              // the handle opened the file, but the kernel named it nowhere beneath the root
)

// whereIs finds the file an identity names through its kernel handle and
// returns its path relative to the share root, when the kernel can name
// it and the name is beneath the root. The caller re-opens that path
// confined, so a wrong or stale answer opens nothing outside the share.
func (s *Share) whereIs(id *identity) (string, where) {
	rootID, err := statxIdentity(s.root.fd)
	if len(id.handle) == 0 || err != nil || rootID.dev != id.dev {
		return "", whereNot // the root's filesystem cannot decode it
	}
	// open_by_handle_at wants a real descriptor of the filesystem, not
	// the root's O_PATH one.
	mfd, err := unix.Openat(s.root.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", whereNot
	}
	fd, err := unix.OpenByHandleAt(mfd, unix.NewFileHandle(id.htype, id.handle), unix.O_PATH|unix.O_CLOEXEC)
	unix.Close(mfd)
	if err != nil {
		return "", whereNot // gone (ESTALE), or no CAP_DAC_READ_SEARCH (EPERM)
	}
	defer unix.Close(fd)
	got, err := statxIdentity(fd)
	if err != nil || !got.sameFile(id) {
		return "", whereNot
	}
	// The file exists from here on: what the kernel fails to name
	// (a disconnected dentry reads "/") may still be found by a search.
	at, err1 := os.Readlink(procPath(fd))
	root, err2 := os.Readlink(procPath(s.root.fd))
	if err1 != nil || err2 != nil {
		return "", whereUnnamed
	}
	if root == "/" {
		root = ""
	}
	rel, ok := strings.CutPrefix(at, root+"/")
	if !ok || rel == "" || strings.HasSuffix(rel, " (deleted)") {
		return "", whereUnnamed
	}
	if _, err := splitPath(rel); err != nil {
		return "", whereUnnamed
	}
	return rel, whereNamed
}
