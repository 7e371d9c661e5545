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

// DataFile moves one open file's bytes. ReadAt and WriteAt behave as
// io.ReaderAt and io.WriterAt but take a context: when ctx ends (a FUSE
// INTERRUPT) the request is cancelled (LWIO CANCEL) and the call returns
// an error wrapping ctx.Err(). A ReadAt at or past end of file returns
// (n < len(p), nil or io.EOF).
type DataFile interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	// Close ends the data path (LWIO CLOSE of the Fid). It does not close
	// the session handle.
	Close(ctx context.Context) error
}

// VectorWriter is a DataFile that takes a write as several buffers in one
// request (LWIO VEC_WRITE; an engine may send COLLAPSE when all pages are
// identical).
type VectorWriter interface {
	WriteV(ctx context.Context, bufs [][]byte, off int64) (int, error)
}

// Buffer is data an engine read into its own registered memory. Release
// returns the memory to the engine's pool; Bytes must not be used after.
type Buffer interface {
	Bytes() []byte
	Release()
}

// BufReader is a DataFile that can read without a copy: the bytes stay in
// the engine's registered buffer until the kernel has them. ReadBuf of n <=
// MaxBuf bytes returns (nil, io.EOF) at or past end of file.
type BufReader interface {
	ReadBuf(ctx context.Context, off int64, n int) (Buffer, error)
	MaxBuf() int
}

// Canceler is a DataFile whose queued requests can be cancelled (LWIO
// CANCEL on the Fid): they fail with STATUS_CANCELLED.
type Canceler interface {
	Cancel(ctx context.Context) error
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

type handleFile struct {
	io HandleIO
	h  session.Handle
}

func (f *handleFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return f.io.ReadAt(ctx, f.h, p, off)
}

func (f *handleFile) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return f.io.WriteAt(ctx, f.h, p, off)
}

func (f *handleFile) Close(context.Context) error { return nil }
