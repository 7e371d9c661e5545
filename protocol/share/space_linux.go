package share

import (
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

// Space and holes (issue 23): fallocate(2) and lseek(2)'s SEEK_DATA /
// SEEK_HOLE on the server file, so that preallocation, punched holes and
// sparse files are what they would be on the export itself, and no zero
// crosses the network to make them.

// allocModes are the fallocate(2) modes a client may ask for. What the
// filesystem under the share does not support it refuses itself
// (EOPNOTSUPP); the kernel also checks their combinations (PUNCH_HOLE
// only with KEEP_SIZE, COLLAPSE_RANGE and INSERT_RANGE alone).
const allocModes = unix.FALLOC_FL_KEEP_SIZE | unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_ZERO_RANGE |
	unix.FALLOC_FL_COLLAPSE_RANGE | unix.FALLOC_FL_INSERT_RANGE

// Allocate is fallocate(2) on the file: mode 0 allocates (and extends),
// KEEP_SIZE allocates without extending, PUNCH_HOLE deallocates,
// ZERO_RANGE zeroes, COLLAPSE_RANGE and INSERT_RANGE remove or insert a
// range. It changes the file, so f must have been opened for writing on a
// writable share (the read-only rule of WriteAt). It returns the file's
// attributes afterwards.
func (f *OpenFile) Allocate(mode uint32, off, n int64) (a Attr, err error) {
	if f.readOnly {
		return Attr{}, protocol.StatusAccessDenied
	}
	if mode&^allocModes != 0 {
		return Attr{}, protocol.StatusNotSupported
	}
	if off < 0 || n <= 0 {
		return Attr{}, protocol.StatusInvalidParameter
	}
	err = f.tree.asFd(f, func(fd int) error { // as the user: its quota, its space
		for {
			err := unix.Fallocate(fd, mode, off, n)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return err
			}
			a, err = lstatAt(fd, "")
			return err
		}
	})
	return a, err
}

// Seek answers lseek(2) with SEEK_DATA (the first byte of data at or after
// off) or SEEK_HOLE (the first hole at or after off; the end of the file
// counts as one) from the server file. Past the last data it is ENXIO
// (STATUS_INVALID_DEVICE_STATE), as lseek says. Other whence values are
// the client's own business (its kernel knows positions and sizes).
func (f *OpenFile) Seek(off int64, whence int) (pos int64, err error) {
	if whence != unix.SEEK_DATA && whence != unix.SEEK_HOLE {
		return 0, protocol.StatusInvalidParameter
	}
	if off < 0 {
		return 0, protocol.StatusInvalidParameter
	}
	// The descriptor's own offset moves, which nothing else uses: every
	// read and write of an OpenFile is positional. Like ReadAt it checks
	// no permission, so it runs as the server.
	err = f.withFd(func(fd int) error {
		pos, err = unix.Seek(fd, off, whence)
		return err
	})
	return pos, err
}
