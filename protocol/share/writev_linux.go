package share

import (
	"io"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

// maxWriteV is the most pieces WriteVAt passes to one pwritev(2); more are
// written in several calls.
const maxWriteV = 64

// WriteVAt writes bufs one after another at off with pwritev(2): the
// pieces of a fragmented LWIO write, straight from the receive buffers
// they landed in, in one system call, with no copy and no allocation. As
// WriteAt, a file opened read-only refuses with STATUS_ACCESS_DENIED, and
// the write runs as the tree's user (the set-user-ID bit cleared, quotas
// charged as for WriteAt).
func (f *OpenFile) WriteVAt(bufs [][]byte, off int64) (int, error) {
	if f.readOnly {
		return 0, protocol.StatusAccessDenied
	}
	n := 0
	err := f.tree.writeAs(f, func(fd int, wr userWriter) error {
		skip := 0 // bytes of bufs[0] written already
		for len(bufs) > 0 {
			var iov [maxWriteV]unix.Iovec
			k := 0
			for i := 0; i < len(bufs) && k < maxWriteV; i++ {
				b := bufs[i]
				if i == 0 {
					b = b[skip:]
				}
				if len(b) == 0 {
					continue
				}
				iov[k].Base = &b[0]
				iov[k].SetLen(len(b))
				k++
			}
			if k == 0 {
				return nil
			}
			w, err := wr.pwritev(fd, iov[:k], off+int64(n))
			if err != nil {
				return err
			}
			if w == 0 {
				return io.ErrShortWrite
			}
			n += w
			for left := w; left > 0 && len(bufs) > 0; {
				if r := len(bufs[0]) - skip; left >= r {
					left -= r
					bufs, skip = bufs[1:], 0
				} else {
					skip += left
					left = 0
				}
			}
		}
		return nil
	})
	return n, err
}
