// Package fs is the go-fuse node tree of an LWIO mount: namespace operations
// go to a session Tree (the SMB-like channel), file data goes to a DataPath
// (the LWIO engine over RDMA, or the session channel as a fallback).
//
// The package depends on small interfaces rather than on the engines, so
// that *session.Tree and the LWIO client satisfy them directly and tests can
// run the whole node tree over a fake.
package fs

import (
	"context"
	"io"

	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// Tree is what the node tree needs from a connected share: the namespace
// half of the session channel's client API (docs/architecture.md, "protocol/
// session client API"). Paths are relative to the share root, slash
// separated; "" is the root. Errors are protocol.Status values or wrap them.
type Tree interface {
	GetAttr(ctx context.Context, path string) (session.Attr, error)
	// SetAttr applies in to path, or to h when h is non-zero, and returns
	// the attributes afterwards.
	SetAttr(ctx context.Context, path string, h session.Handle, in session.SetAttrIn) (session.Attr, error)
	ReadDir(ctx context.Context, path string) ([]session.DirEntry, error)
	Mkdir(ctx context.Context, path string, mode uint32) (session.Attr, error)
	Rmdir(ctx context.Context, path string) error
	// Open opens (with O_CREAT: creates) path with Linux open(2) flags.
	Open(ctx context.Context, path string, flags int, mode uint32) (session.Handle, session.Attr, error)
	CloseHandle(ctx context.Context, h session.Handle) error
	Unlink(ctx context.Context, path string) error
	// Rename renames with renameat2 flags (RENAME_NOREPLACE, RENAME_EXCHANGE).
	Rename(ctx context.Context, oldPath, newPath string, flags uint32) error
	Symlink(ctx context.Context, target, path string) (session.Attr, error)
	Readlink(ctx context.Context, path string) (string, error)
	Link(ctx context.Context, oldPath, newPath string) (session.Attr, error)
	StatFS(ctx context.Context) (session.StatFS, error)
	Fsync(ctx context.Context, h session.Handle, datasync bool) error
	GetXattr(ctx context.Context, path, name string) ([]byte, error)
	// SetXattr sets name with setxattr(2) flags (XATTR_CREATE, XATTR_REPLACE).
	SetXattr(ctx context.Context, path, name string, value []byte, flags int) error
	ListXattr(ctx context.Context, path string) ([]string, error)
	RemoveXattr(ctx context.Context, path, name string) error
}

// HandleIO is the session channel's own data path on an open handle: the
// fallback when no RDMA provider is common to both ends.
type HandleIO interface {
	ReadAt(ctx context.Context, h session.Handle, p []byte, off int64) (int, error)
	WriteAt(ctx context.Context, h session.Handle, p []byte, off int64) (int, error)
}

// DataPath attaches a data path to a file opened on the session channel.
// For LWIO that is REQUEST_RESUME_KEY on the handle and REGISTER on an RDMA
// connection, which yields a Fid.
type DataPath interface {
	// Attach returns the data file of h, opened with open(2) flags.
	Attach(ctx context.Context, h session.Handle, flags int) (DataFile, error)
	// Name says which path this is ("lwio/softrdma", "session"), for logs.
	Name() string
}

// DataFile moves one open file's bytes. Every method a mount needs is here
// (the LWIO data file and the session-channel fallback both have them all,
// so nothing is probed). Calls take a context: when it ends (a FUSE
// INTERRUPT) the request is cancelled and the call returns an error
// wrapping ctx.Err().
type DataFile interface {
	// ReadAt behaves as io.ReaderAt: a read at or past end of file
	// returns (n < len(p), nil or io.EOF).
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	// ReadBuf reads len(dest) bytes at off and returns them in a Buffer:
	// for LWIO the pooled registered buffer the server's RDMA WRITE landed
	// in, handed on without a copy (a split read's pieces, one buffer per
	// connection: a *client.SplitBuf, replied from its Slices); otherwise
	// dest itself. Fewer bytes at
	// end of file; (nil, io.EOF) at or past it. Release the Buffer once
	// the bytes are used.
	ReadBuf(ctx context.Context, dest []byte, off int64) (Buffer, error)
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	// WriteV writes pages, consecutive pieces of the file at off, in one
	// request where the path can (LWIO VEC_WRITE, COLLAPSE when every page
	// is the same).
	WriteV(ctx context.Context, pages [][]byte, off int64) (int, error)
	// Cancel fails the file's queued requests with STATUS_CANCELLED (LWIO
	// CANCEL on the Fid); a path with no queue returns nil.
	Cancel(ctx context.Context) error
	// Close ends the data path (LWIO CLOSE of the Fid). It does not close
	// the session handle.
	Close(ctx context.Context) error
}

// Buffer is data a DataFile read: the LWIO engine's type, which the
// session path's heapBuf satisfies too. Release returns its memory to the
// engine's pool (a no-op for ordinary memory); Bytes must not be used
// after.
type Buffer = client.Buffer

// heapBuf is a Buffer in ordinary memory.
type heapBuf []byte

func (b heapBuf) Bytes() []byte { return b }
func (b heapBuf) Release()      {}

// readInto is ReadBuf for reads that land in dest: ReadAt, with the end of
// file said as ReadBuf says it.
func readInto(ctx context.Context, f DataFile, dest []byte, off int64) (Buffer, error) {
	n, err := f.ReadAt(ctx, dest, off)
	if n == 0 && (err == nil || isEOF(err)) {
		return nil, io.EOF
	}
	if isEOF(err) {
		err = nil
	}
	return heapBuf(dest[:n]), err
}

// writeEach is WriteV for a path without vectored writes: one WriteAt per
// page.
func writeEach(ctx context.Context, f DataFile, pages [][]byte, off int64) (int, error) {
	total := 0
	for _, p := range pages {
		n, err := f.WriteAt(ctx, p, off+int64(total))
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// sessionData is the fallback DataPath over the session channel.
type sessionData struct{ io HandleIO }

// SessionDataPath returns the DataPath that carries file data over the
// session channel itself (no RDMA).
func SessionDataPath(io HandleIO) DataPath { return sessionData{io} }

func (s sessionData) Name() string { return "session" }

func (s sessionData) Attach(_ context.Context, h session.Handle, _ int) (DataFile, error) {
	return &handleFile{io: s.io, h: h}, nil
}

// handleFile is an open file's data over the session channel: READ and
// WRITE on its handle.
type handleFile struct {
	io HandleIO
	h  session.Handle
}

func (f *handleFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return f.io.ReadAt(ctx, f.h, p, off)
}

func (f *handleFile) ReadBuf(ctx context.Context, dest []byte, off int64) (Buffer, error) {
	return readInto(ctx, f, dest, off)
}

func (f *handleFile) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return f.io.WriteAt(ctx, f.h, p, off)
}

func (f *handleFile) WriteV(ctx context.Context, pages [][]byte, off int64) (int, error) {
	return writeEach(ctx, f, pages, off)
}

func (f *handleFile) Cancel(context.Context) error { return nil }
func (f *handleFile) Close(context.Context) error  { return nil }
