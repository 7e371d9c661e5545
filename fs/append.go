package fs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// Appends. For an O_APPEND write the kernel sends WRITE at its own idea of
// the end of file, which another client — or a local process on the server
// host — may have moved since it last looked: a positional write there
// overwrites their data. So an O_APPEND write (rawFS tells which) goes to
// the server as an append, and the server places it at the end of file as
// it is then (docs/session.md, "Appends").

// Appender is the session channel's append on an open handle
// (*session.Tree; the Reconnector): the bytes written and the end of file
// just past them.
type Appender interface {
	Append(ctx context.Context, h session.Handle, p []byte) (int, int64, error)
}

// appendDirect is what an open for appending returns to the kernel:
// FOPEN_DIRECT_IO. Through the page cache the kernel splits a write that
// starts inside a page it has not cached into two WRITEs — that page's
// part, then the rest (fuse_fill_write_pages stops at a folio it must keep
// locked) — and another client's append could land between them. Direct
// I/O sends a write(2) of up to MaxWrite as one WRITE, so each is one
// append on the server. (Shared mappings of such a file still work:
// CAP_DIRECT_IO_ALLOW_MMAP.)
const appendDirect = fuse.FOPEN_DIRECT_IO

// appendInlineMax is the largest append sent over the session channel,
// whose answer says where the data ended (the LWIO completion does not).
const appendInlineMax = 128 << 10

// appendAt is the offset a DataFile's WriteAt appends at (LWIO WRITE at
// FILE_WRITE_TO_END_OF_FILE, or the session channel's append).
const appendAt = -1

// append writes buf at the server's end of file. A small append goes over
// the session channel, whose answer says where the data ended; a larger
// one (or an O_DIRECT one) over the data path, whose completion does not.
// When the end is unknown, or is not where the kernel put the write (kpos,
// its stale end of file), the kernel's cached size and pages of the file
// are wrong — the pages hold the data at kpos — and are dropped, after the
// reply (the kernel holds their locks until then).
func (f *fileHandle) append(ctx context.Context, buf []byte, kpos int64) (uint32, syscall.Errno) {
	f.dirty()
	defer f.dirty()
	end := int64(-1)
	var n int
	var err error
	if ap, ok := f.node.fs.tree.(Appender); ok && len(buf) <= appendInlineMax && f.flags&syscall.O_DIRECT == 0 {
		n, err = f.run(ctx, func(ctx context.Context) (int, error) {
			k, e, err := ap.Append(ctx, f.h, buf)
			end = e
			return k, err
		})
	} else {
		var data DataFile
		if data, err = f.dataFile(ctx); err != nil {
			return 0, f.errno("register", err)
		}
		n, err = f.run(ctx, func(ctx context.Context) (int, error) { return data.WriteAt(ctx, buf, appendAt) })
	}
	if end < 0 || end != kpos+int64(n) {
		go f.node.Invalidate(0, 0)
	}
	if err != nil {
		return uint32(n), f.errno("append", err)
	}
	return uint32(n), 0
}
