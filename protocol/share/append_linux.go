package share

import (
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

// Append writes p at the end of the file as it is at the moment of the
// write — after whatever any other client, handle or local process
// appended or wrote before — and returns the bytes written and the file
// offset just past them: the new end of file as this write left it. It is
// what a client's O_APPEND write becomes (session WRITE and LWIO WRITE with
// the offset FILE_WRITE_TO_END_OF_FILE), so that appenders on any number of
// mounts never overwrite each other's data.
//
// The kernel places the bytes: pwritev2(2) with RWF_APPEND and offset −1
// writes at the end of file under the inode's lock, atomically with every
// other append on the host (O_APPEND writers, other handles, other
// clients), and moves this open file description's position to just past
// what it wrote, which lseek(2) then reads. Only that pair needs
// serializing, and only per open file (appendMu): nothing here locks the
// inode across handles, and the offset is exact even when a local process
// appends at the same time. The file need not be open O_APPEND (which would
// make every positional write an append too): RWF_APPEND asks for it per
// write. A short write is continued, so an append larger than the kernel
// takes at once (or interrupted by a signal) is no longer one piece.
func (f *OpenFile) Append(p []byte) (n int, end int64, err error) {
	if f.readOnly {
		return 0, 0, protocol.StatusAccessDenied
	}
	f.appendMu.Lock()
	defer f.appendMu.Unlock()
	// As the tree's user, as WriteAt: the kernel's set-id clearing and
	// quota checks apply to the writer.
	err = f.tree.asFd(f, func(fd int) (err error) {
		n, end, err = appendFD(fd, p)
		return err
	})
	return n, end, err
}

// AppendFile appends p to f as OpenFile.Append does, for files that are
// not a share's (the engines' tests serve plain files). Appends to one f
// must not run at once.
func AppendFile(f *os.File, p []byte) (n int, end int64, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	if cerr := rc.Control(func(fd uintptr) { n, end, err = appendFD(int(fd), p) }); cerr != nil {
		return 0, 0, cerr
	}
	return n, end, err
}

// appendFD appends p to the file fd refers to — at the end of file under
// the inode's lock, continuing a short write — and returns the bytes
// written and the offset just past them. It moves fd's file position: the
// caller keeps other users of that position away meanwhile.
func appendFD(fd int, p []byte) (n int, end int64, err error) {
	if len(p) == 0 {
		// No write moves the position: the end is the size.
		var st unix.Stat_t
		err := unix.Fstat(fd, &st)
		return 0, st.Size, err
	}
	for n < len(p) {
		k, err := unix.Pwritev2(fd, [][]byte{p[n:]}, -1, unix.RWF_APPEND)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, 0, err
		}
		if k == 0 {
			return n, 0, io.ErrShortWrite
		}
		n += k
	}
	end, err = unix.Seek(fd, 0, io.SeekCurrent)
	return n, end, err
}
