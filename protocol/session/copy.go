package session

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// Work done on the server's files without their bytes crossing the
// network (issue 23): COPY_RANGE (copy_file_range), FALLOCATE, SEEK
// (SEEK_DATA / SEEK_HOLE), TMPFILE (an O_TMPFILE open) and LINKAT_HANDLE
// (naming what TMPFILE opened). docs/session.md lists their bodies and
// rules.

// copyRangeReq is COPY_RANGE: copy Length bytes of the source from
// SrcOffset into the destination Handle at DstOffset. The source is the
// handle Source of this session, or, when SourceKey is not zero, the open
// whose resume key (FSCTL_SRV_REQUEST_RESUME_KEY) it is — possibly of
// another session of the same user, as SMB2's FSCTL_SRV_COPYCHUNK names
// its source ([MS-SMB2] 3.3.5.15.6).
type copyRangeReq struct {
	Handle    Handle
	Source    Handle
	SourceKey [24]byte
	SrcOffset uint64
	DstOffset uint64
	Length    uint64
	Flags     uint32 // none defined: must be 0
}

func (m *copyRangeReq) code(c coder) {
	handle(c, &m.Handle)
	handle(c, &m.Source)
	key24(c, &m.SourceKey)
	u64s(c, &m.SrcOffset, &m.DstOffset, &m.Length)
	c.u32(&m.Flags)
}

// copyRangeResp says how many bytes were copied (fewer than asked at the
// source's end of file, or when the request's time ran out) and the
// destination's attributes afterwards.
type copyRangeResp struct {
	Count uint64
	Attr  Attr
}

func (m *copyRangeResp) code(c coder) { c.u64(&m.Count); codeAttr(c, &m.Attr) }

// fallocateReq is FALLOCATE: fallocate(2) Mode on Length bytes at Offset;
// the response is the file's attributes afterwards.
type fallocateReq struct {
	Handle Handle
	Mode   uint32
	Offset uint64
	Length uint64
}

func (m *fallocateReq) code(c coder) {
	handle(c, &m.Handle)
	c.u32(&m.Mode)
	u64s(c, &m.Offset, &m.Length)
}

// seekReq is SEEK: lseek(2) from Offset with Whence SEEK_DATA (3) or
// SEEK_HOLE (4); the response is the offset found.
type seekReq struct {
	Handle Handle
	Offset uint64
	Whence uint32
}

func (m *seekReq) code(c coder) { handle(c, &m.Handle); c.u64(&m.Offset); c.u32(&m.Whence) }

type offsetMsg struct{ Offset uint64 }

func (m *offsetMsg) code(c coder) { c.u64(&m.Offset) }

// linkHandleReq is LINKAT_HANDLE: give the file of Handle the name Path.
type linkHandleReq struct {
	Handle Handle
	Path   string
	Flags  uint32 // none defined: must be 0
}

func (m *linkHandleReq) code(c coder) { handle(c, &m.Handle); c.str(&m.Path); c.u32(&m.Flags) }

// key24 codes a 24-byte resume key as three u64s, which carry its bytes in
// order both ways.
func key24(c coder, k *[24]byte) {
	for i := 0; i < len(k); i += 8 {
		v := binary.LittleEndian.Uint64(k[i:])
		c.u64(&v)
		binary.LittleEndian.PutUint64(k[i:], v)
	}
}

// MaxCopyRange is the most one COPY_RANGE copies, and copyBudget how long
// it may take: a bigger copy is a loop of requests (Tree.CopyRange's
// caller goes on from the count), so that no request holds its connection
// for seconds and a copy the client stops ends within one request.
const (
	MaxCopyRange = 256 << 20
	copyBudget   = 250 * time.Millisecond
)

// maxOffset bounds the offsets and lengths a request may name: the
// server's are signed.
const maxOffset = 1<<63 - 1

// serverSide runs COPY_RANGE, FALLOCATE, SEEK, TMPFILE and LINKAT_HANDLE
// on tree tr of session ss. Each goes through protocol/share, which
// applies the read-only rule and confinement, and changes a file only
// through a handle opened for writing.
func (s *Server) serverSide(ss *serverSession, tr *share.Tree, cmd Command, req message) (message, error) {
	switch r := req.(type) {
	case *copyRangeReq:
		return s.copyRange(ss, tr, r)
	case *fallocateReq:
		of, err := ss.fileIn(tr, r.Handle)
		if err != nil {
			return nil, err
		}
		if r.Offset > maxOffset || r.Length > maxOffset {
			return nil, protocol.StatusInvalidParameter
		}
		a, err := of.file.Allocate(r.Mode, int64(r.Offset), int64(r.Length))
		return &attrMsg{a}, err
	case *seekReq:
		of, err := ss.fileIn(tr, r.Handle)
		if err != nil {
			return nil, err
		}
		if r.Offset > maxOffset {
			return nil, protocol.StatusInvalidParameter
		}
		pos, err := of.file.Seek(int64(r.Offset), int(r.Whence))
		return &offsetMsg{uint64(pos)}, err
	case *openReq: // TMPFILE
		return s.newOpen(ss, r.DurableID, func() (*share.OpenFile, Attr, error) {
			return tr.Tmpfile(r.Path, int(r.Flags), r.Mode)
		})
	case *linkHandleReq:
		of, err := ss.fileIn(tr, r.Handle)
		if err != nil {
			return nil, err
		}
		if r.Flags != 0 {
			return nil, protocol.StatusInvalidParameter
		}
		a, err := of.file.LinkAt(r.Path)
		return &attrMsg{a}, err
	}
	return nil, protocol.StatusInvalidDeviceRequest
}

// copyRange runs one COPY_RANGE: at most MaxCopyRange bytes, for at most
// copyBudget (after its first piece; share.OpenFile.CopyRange).
func (s *Server) copyRange(ss *serverSession, tr *share.Tree, r *copyRangeReq) (message, error) {
	dst, err := ss.fileIn(tr, r.Handle)
	if err != nil {
		return nil, err
	}
	src, err := s.copySource(ss, tr, r)
	if err != nil {
		return nil, err
	}
	if r.Flags != 0 || r.SrcOffset > maxOffset || r.DstOffset > maxOffset {
		return nil, protocol.StatusInvalidParameter
	}
	ctx, cancel := context.WithTimeout(context.Background(), copyBudget)
	defer cancel()
	n, a, err := dst.file.CopyRange(ctx, src.file, int64(r.SrcOffset), int64(r.DstOffset), int64(min(r.Length, MaxCopyRange)))
	return &copyRangeResp{Count: uint64(n), Attr: a}, err
}

// copySource finds a COPY_RANGE's source: a handle of this session on
// the tree's share, or the open a resume key names. A key is honoured
// from any session of the same user on the same share — the user could
// open that file on this session anyway — and refused alike (ACCESS_DENIED,
// as OpenByResumeKey answers) when unknown, closed, of another share or of
// another user, so that probing keys tells nothing.
func (s *Server) copySource(ss *serverSession, tr *share.Tree, r *copyRangeReq) (*openFile, error) {
	if r.SourceKey == ([24]byte{}) {
		return ss.fileIn(tr, r.Source)
	}
	s.mu.Lock()
	of, ok := s.resumeKeys[r.SourceKey]
	s.mu.Unlock()
	if !ok || of.closed.Load() || of.file == nil || of.sess.user != ss.user || of.file.Tree().Share() != tr.Share() {
		return nil, protocol.StatusAccessDenied
	}
	return of, nil
}

// Client side.

// CopyRange asks the server to copy n bytes of the open src from srcOff
// into the open dst at dstOff, both handles of this session and share,
// and returns how many it copied — at most MaxCopyRange, fewer when the
// request's time ran out (go on from there) or at src's end of file (0 at
// or past it) — with dst's attributes afterwards. No byte crosses the
// network.
func (t *Tree) CopyRange(ctx context.Context, src Handle, srcOff int64, dst Handle, dstOff int64, n int64) (int64, Attr, error) {
	return t.copyRange(ctx, &copyRangeReq{Handle: dst, Source: src, SrcOffset: uint64(srcOff), DstOffset: uint64(dstOff), Length: uint64(n)})
}

// CopyRangeFromKey is CopyRange with the source named by its resume key
// (RequestResumeKey), which may be an open of another session of the same
// user on the same share: a copy between two mounts of one server.
func (t *Tree) CopyRangeFromKey(ctx context.Context, key [24]byte, srcOff int64, dst Handle, dstOff int64, n int64) (int64, Attr, error) {
	return t.copyRange(ctx, &copyRangeReq{Handle: dst, SourceKey: key, SrcOffset: uint64(srcOff), DstOffset: uint64(dstOff), Length: uint64(n)})
}

func (t *Tree) copyRange(ctx context.Context, req *copyRangeReq) (int64, Attr, error) {
	if int64(req.SrcOffset) < 0 || int64(req.DstOffset) < 0 || int64(req.Length) < 0 {
		return 0, Attr{}, protocol.StatusInvalidParameter
	}
	var r copyRangeResp
	if err := t.call(ctx, CmdCopyRange, req, &r); err != nil {
		return 0, Attr{}, err
	}
	if r.Count > req.Length || r.Count > MaxCopyRange {
		return 0, Attr{}, protocol.StatusInvalidNetworkResp
	}
	return int64(r.Count), r.Attr, nil
}

// Allocate runs fallocate(2) with mode on n bytes at off of the open h on
// the server and returns the file's attributes afterwards.
func (t *Tree) Allocate(ctx context.Context, h Handle, mode uint32, off, n int64) (Attr, error) {
	var r attrMsg
	err := t.call(ctx, CmdFallocate, &fallocateReq{Handle: h, Mode: mode, Offset: uint64(off), Length: uint64(n)}, &r)
	return r.Attr, err
}

// Seek answers lseek(2) with whence SEEK_DATA or SEEK_HOLE from off on
// the server file; past the last data it fails with ENXIO (through
// ToErrno).
func (t *Tree) Seek(ctx context.Context, h Handle, off int64, whence int) (int64, error) {
	var r offsetMsg
	if err := t.call(ctx, CmdSeek, &seekReq{Handle: h, Offset: uint64(off), Whence: uint32(whence)}, &r); err != nil {
		return 0, err
	}
	if r.Offset > maxOffset {
		return 0, protocol.StatusInvalidNetworkResp
	}
	return int64(r.Offset), nil
}

// Tmpfile opens an unnamed regular file in directory dir (open(2) with
// O_TMPFILE; flags are its access mode and O_EXCL, O_SYNC, O_DSYNC) and
// returns its handle and attributes. LinkHandle names it.
func (t *Tree) Tmpfile(ctx context.Context, dir string, flags int, mode uint32) (Handle, Attr, error) {
	var r openResp
	err := t.call(ctx, CmdTmpfile, &openReq{Path: dir, Flags: uint32(flags), Mode: mode}, &r)
	return r.Handle, r.Attr, err
}

// LinkHandle gives the file open as h the name path (linkat(2) of the
// open file, as a program names its O_TMPFILE file) and returns its
// attributes.
func (t *Tree) LinkHandle(ctx context.Context, h Handle, path string) (Attr, error) {
	var r attrMsg
	err := t.call(ctx, CmdLinkHandle, &linkHandleReq{Handle: h, Path: path}, &r)
	return r.Attr, err
}
