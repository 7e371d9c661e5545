package session

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/lwiofs/lwiofs/internal/enum"
	"github.com/lwiofs/lwiofs/protocol"
)

// Frame layout (all little-endian, no padding; docs/session.md):
//
//	@0  Length    u32   bytes in the frame, header included
//	@4  Magic     [4]   "LWSC"
//	@8  MessageID u64   request id; a response carries its request's id
//	@16 Command   u16   Command
//	@18 Flags     u16   FlagResponse | FlagSigned | FlagSealed
//	@20 Status    u32   NTSTATUS of a response; 0 in requests
//	@24 SessionID u64   0 until session setup completes
//	@32 TreeID    u32   tree of a tree-scoped request; 0 otherwise
//	@36 Reserved  u32   must be 0
//	@40 Signature [16]  HMAC-SHA256 over the frame with this field zeroed,
//	                    truncated to 16 bytes; zero when unsigned; the
//	                    AES-GCM tag of a sealed frame (seal.go)
//	@56 body            (sealed: Sequence u64, then the encrypted body)
const (
	HeaderSize = 56
	// MaxFrameSize bounds a frame, header included. A larger Length ends
	// the connection (ErrFrameTooLarge) before anything is allocated.
	MaxFrameSize = MaxIOSize + 64<<10
	// maxSetupFrameSize bounds frames before session setup completes:
	// NTLMSSP tokens are a few hundred bytes.
	maxSetupFrameSize = 64 << 10
	// MaxIOSize is the most data one Read or Write request carries; the
	// client splits larger ReadAt/WriteAt calls.
	MaxIOSize = 1 << 20

	sigOffset = 40
	sigSize   = 16
)

var frameMagic = [4]byte{'L', 'W', 'S', 'C'}

// Flags of a frame header.
const (
	// FlagResponse marks a server-to-client frame: a response, or a
	// LEASE_BREAK (whose MessageID is the server's own sequence).
	FlagResponse uint16 = 1 << 0
	// FlagSigned says the Signature field holds a signature with the
	// session key. After session setup every frame must carry it.
	FlagSigned uint16 = 1 << 1
	// FlagSealed says the body is encrypted and the frame authenticated
	// with the session's sealing key (seal.go); Signature holds the tag.
	// A frame is signed or sealed, never both.
	FlagSealed uint16 = 1 << 2

	knownFlags = FlagResponse | FlagSigned | FlagSealed
)

// Command is the operation a frame carries.
type Command uint16

// Session channel commands. Numbers are this project's own; the names follow
// SMB2 where SMB2 has the operation.
const (
	CmdSessionSetup   Command = 1  // NTLMSSP token exchange (two rounds)
	CmdLogoff         Command = 2  // ends the session
	CmdTreeConnect    Command = 3  // share name → TreeID, read-only flag
	CmdTreeDisconnect Command = 4  // forgets a TreeID
	CmdGetAttr        Command = 5  // lstat
	CmdSetAttr        Command = 6  // chmod/chown/utimens/truncate, by path or handle
	CmdReadDir        Command = 7  // one page of a directory listing
	CmdMkdir          Command = 8  // mkdirat
	CmdRmdir          Command = 9  // unlinkat(AT_REMOVEDIR)
	CmdOpen           Command = 10 // openat2 → Handle
	CmdClose          Command = 11 // closes a Handle (and its resume key)
	CmdRead           Command = 12 // pread on a Handle (fallback data path)
	CmdWrite          Command = 13 // pwrite on a Handle (fallback data path)
	CmdUnlink         Command = 14 // unlinkat
	CmdRename         Command = 15 // renameat2 with RENAME_NOREPLACE / RENAME_EXCHANGE
	CmdSymlink        Command = 16 // symlinkat
	CmdReadlink       Command = 17 // readlinkat
	CmdLink           Command = 18 // linkat
	CmdStatFS         Command = 19 // fstatfs of the share root
	CmdFsync          Command = 20 // fsync / fdatasync on a Handle
	CmdGetXattr       Command = 21
	CmdSetXattr       Command = 22
	CmdListXattr      Command = 23
	CmdRemoveXattr    Command = 24
	CmdIoctl          Command = 25 // FSCTL on a Handle (FSCTL_SRV_REQUEST_RESUME_KEY)
	CmdPipeOpen       Command = 26 // opens a named pipe (\PIPE\LWIO)
	CmdPipeTransact   Command = 27 // one request/response on a pipe handle
	CmdEcho           Command = 28 // keepalive; an empty body both ways
	CmdLock           Command = 29 // byte-range or flock lock/unlock on a Handle, waiting or not (lock.go)
	CmdUnlock         Command = 30 // every lock of one owner on a Handle's file
	CmdGetLk          Command = 31 // the first lock that would conflict (F_GETLK)
	CmdCancel         Command = 32 // cancels a pending request by MessageID (SMB2 CANCEL)
	CmdLeaseBreak     Command = 33 // server → client, unsolicited: a lease no longer holds (lease.go)
	CmdLeaseAck       Command = 34 // the client's acknowledgement of a LEASE_BREAK
	CmdLease          Command = 35 // a lookup with a lease; gives leases up
	CmdReopen         Command = 36 // reclaims a durable handle, or re-opens a file by identity (durable.go)

	// 44, 46 and 47 are reserved for other commands (identity); MKNOD
	// (37) and IDMAP (45) are in mknod.go and idmap.go.
	CmdCopyRange  Command = 38 // copy_file_range between two opens, on the server
	CmdFallocate  Command = 39 // fallocate on a Handle
	CmdSeek       Command = 40 // lseek SEEK_DATA / SEEK_HOLE on a Handle
	CmdTmpfile    Command = 41 // open(dir, O_TMPFILE) → Handle
	CmdLinkHandle Command = 42 // linkat of a Handle's file to a new name
	CmdBatch      Command = 43 // requests on open handles, run in order as one (batch.go)

	// cmdLimit is one past the highest number reserved for the session
	// channel (WAVE2: 29–47, each feature in files of its own — mknod.go,
	// idmap.go, copy.go …); a number without bodies is NOT_IMPLEMENTED.
	cmdLimit = 48
)

var commandNames = [cmdLimit]string{
	CmdSessionSetup: "SESSION_SETUP", CmdLogoff: "LOGOFF", CmdTreeConnect: "TREE_CONNECT",
	CmdTreeDisconnect: "TREE_DISCONNECT", CmdGetAttr: "GETATTR", CmdSetAttr: "SETATTR",
	CmdReadDir: "READDIR", CmdMkdir: "MKDIR", CmdRmdir: "RMDIR", CmdOpen: "OPEN",
	CmdClose: "CLOSE", CmdRead: "READ", CmdWrite: "WRITE", CmdUnlink: "UNLINK",
	CmdRename: "RENAME", CmdSymlink: "SYMLINK", CmdReadlink: "READLINK", CmdLink: "LINK",
	CmdStatFS: "STATFS", CmdFsync: "FSYNC", CmdGetXattr: "GETXATTR", CmdSetXattr: "SETXATTR",
	CmdListXattr: "LISTXATTR", CmdRemoveXattr: "REMOVEXATTR", CmdIoctl: "IOCTL",
	CmdPipeOpen: "PIPE_OPEN", CmdPipeTransact: "PIPE_TRANSACT", CmdEcho: "ECHO",
	CmdLeaseBreak: "LEASE_BREAK", CmdLeaseAck: "LEASE_ACK", CmdLease: "LEASE", CmdBatch: "BATCH",
	CmdLock: "LOCK", CmdUnlock: "UNLOCK", CmdGetLk: "GETLK", CmdCancel: "CANCEL", CmdReopen: "REOPEN",
	CmdCopyRange: "COPY_RANGE", CmdFallocate: "FALLOCATE", CmdSeek: "SEEK", CmdTmpfile: "TMPFILE",
	CmdLinkHandle: "LINKAT_HANDLE",
}

// String returns the command's name, e.g. "READDIR".
func (c Command) String() string { return enum.Name(commandNames[:], c, "Command") }

// Header is a decoded frame header.
type Header struct {
	Length    uint32
	MessageID uint64
	Command   Command
	Flags     uint16
	Status    protocol.Status
	SessionID uint64
	TreeID    uint32
	Signature [16]byte
}

// Frame is a header and its body.
type Frame struct {
	Header
	Body []byte
}

// Errors of the frame decoder. Each ends the connection: after a framing
// error the byte stream cannot be trusted to be at a frame boundary.
var (
	ErrShortFrame    = errors.New("session: frame shorter than its header")
	ErrFrameTooLarge = errors.New("session: frame larger than MaxFrameSize")
	ErrBadMagic      = errors.New("session: bad frame magic")
	ErrBadFlags      = errors.New("session: unknown frame flags")
	ErrBadReserved   = errors.New("session: reserved header field not zero")
	ErrMalformedBody = errors.New("session: malformed message body")
	ErrBadSignature  = errors.New("session: bad frame signature")
	ErrReplay        = errors.New("session: replayed or out-of-window message id")
	ErrUnsigned      = errors.New("session: unsigned frame after session setup")
)

// AppendFrame appends the encoded frame to b with a zero signature and
// returns the extended slice. Length is computed from the body.
func AppendFrame(b []byte, h Header, body []byte) []byte {
	n := HeaderSize + len(body)
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	b = append(b, frameMagic[:]...)
	b = binary.LittleEndian.AppendUint64(b, h.MessageID)
	b = binary.LittleEndian.AppendUint16(b, uint16(h.Command))
	b = binary.LittleEndian.AppendUint16(b, h.Flags)
	b = binary.LittleEndian.AppendUint32(b, uint32(h.Status))
	b = binary.LittleEndian.AppendUint64(b, h.SessionID)
	b = binary.LittleEndian.AppendUint32(b, h.TreeID)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = append(b, h.Signature[:]...)
	return append(b, body...)
}

// DecodeFrame decodes one whole frame from p, which must hold exactly the
// Length the header announces. The body aliases p. It never panics.
func DecodeFrame(p []byte) (Frame, error) {
	var f Frame
	if len(p) < HeaderSize {
		return f, ErrShortFrame
	}
	f.Length = binary.LittleEndian.Uint32(p[0:])
	if f.Length < HeaderSize {
		return f, ErrShortFrame
	}
	if f.Length > MaxFrameSize {
		return f, ErrFrameTooLarge
	}
	if int(f.Length) != len(p) {
		return f, fmt.Errorf("%w: length %d, have %d bytes", ErrShortFrame, f.Length, len(p))
	}
	if [4]byte(p[4:8]) != frameMagic {
		return f, ErrBadMagic
	}
	f.MessageID = binary.LittleEndian.Uint64(p[8:])
	f.Command = Command(binary.LittleEndian.Uint16(p[16:]))
	f.Flags = binary.LittleEndian.Uint16(p[18:])
	if f.Flags&^knownFlags != 0 || f.Flags&(FlagSigned|FlagSealed) == FlagSigned|FlagSealed {
		return f, ErrBadFlags
	}
	f.Status = protocol.Status(binary.LittleEndian.Uint32(p[20:]))
	f.SessionID = binary.LittleEndian.Uint64(p[24:])
	f.TreeID = binary.LittleEndian.Uint32(p[32:])
	if binary.LittleEndian.Uint32(p[36:]) != 0 {
		return f, ErrBadReserved
	}
	copy(f.Signature[:], p[sigOffset:sigOffset+sigSize])
	f.Body = p[HeaderSize:]
	return f, nil
}

// ReadFrame reads one frame from r. The length is checked against
// MaxFrameSize before the body is allocated.
func ReadFrame(r io.Reader) (Frame, []byte, error) { return readFrame(r, MaxFrameSize) }

// readFrame is ReadFrame with a tighter limit (before session setup only
// small NTLM tokens are expected).
func readFrame(r io.Reader, max uint32) (Frame, []byte, error) {
	var lb [4]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return Frame{}, nil, err
	}
	raw, err := incomingFrame(binary.LittleEndian.Uint32(lb[:]), max)
	if err != nil {
		return Frame{}, nil, err
	}
	copy(raw, lb[:])
	if _, err := io.ReadFull(r, raw[4:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, nil, err
	}
	f, err := DecodeFrame(raw)
	return f, raw, err
}

// incomingFrame checks a received frame's Length n against the header
// size and max and returns a buffer for the frame, with room to open a
// sealed frame in place; nothing is allocated for a Length out of bounds.
func incomingFrame(n, max uint32) ([]byte, error) {
	if n < HeaderSize {
		return nil, ErrShortFrame
	}
	if n > max {
		return nil, ErrFrameTooLarge
	}
	return make([]byte, n, n+tagSize), nil
}

// signFrame writes the signature of raw (a whole encoded frame whose
// signature field is zero) into it, and sets FlagSigned.
func signFrame(key, raw []byte) {
	flags := binary.LittleEndian.Uint16(raw[18:]) | FlagSigned
	binary.LittleEndian.PutUint16(raw[18:], flags)
	clear(raw[sigOffset : sigOffset+sigSize])
	sig := sign(key, raw)
	copy(raw[sigOffset:], sig[:])
}

// verifyFrame checks the signature of raw in place (it is zeroed and
// restored) in constant time.
func verifyFrame(key, raw []byte) bool {
	var got [sigSize]byte
	copy(got[:], raw[sigOffset:sigOffset+sigSize])
	clear(raw[sigOffset : sigOffset+sigSize])
	ok := verify(key, got[:], raw)
	copy(raw[sigOffset:], got[:])
	return ok
}

// pooledFrameCap is the capacity of the frame buffers framePool keeps:
// most requests and responses fit, a READ's or WRITE's data does not.
const pooledFrameCap = 4 << 10

// framePool keeps the buffers outgoing frames are encoded in; a frame is
// dead once written (both ends write it whole, under their write lock).
var framePool = sync.Pool{New: func() any { return new([pooledFrameCap]byte) }}

// frameBuf returns an empty buffer with room for n bytes: from the pool
// when n fits.
func frameBuf(n int) []byte {
	if n <= pooledFrameCap {
		return framePool.Get().(*[pooledFrameCap]byte)[:0]
	}
	return make([]byte, 0, n)
}

// freeFrame gives b, a frame buffer no longer used, back to the pool if it
// came from it (an encoding that outgrew it did not).
func freeFrame(b []byte) {
	if cap(b) == pooledFrameCap {
		framePool.Put((*[pooledFrameCap]byte)(b[:pooledFrameCap]))
	}
}

// putLength sets the Length field of an encoded frame to its actual size.
func putLength(raw []byte) { binary.LittleEndian.PutUint32(raw, uint32(len(raw))) }

// putMessageID sets the MessageID field of an encoded frame.
func putMessageID(raw []byte, id uint64) { binary.LittleEndian.PutUint64(raw[8:], id) }
