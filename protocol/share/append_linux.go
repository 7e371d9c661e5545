package share

import (
	"io"

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
	err = f.withFd(func(fd int) error {
		if len(p) == 0 {
			// No write moves the position: the end is the size.
			var st unix.Stat_t
			err := unix.Fstat(fd, &st)
			end = st.Size
			return err
		}
		for n < len(p) {
			k, err := unix.Pwritev2(fd, [][]byte{p[n:]}, -1, unix.RWF_APPEND)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return err
			}
			if k == 0 {
				return io.ErrShortWrite
			}
			n += k
		}
		var err error
		end, err = unix.Seek(fd, 0, io.SeekCurrent)
		return err
	})
	return n, end, err
}
