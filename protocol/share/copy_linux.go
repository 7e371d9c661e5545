package share

import (
	"context"
	"io"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
)

// Server-side copy (issue 23): a client's copy_file_range(2) between two
// files of one share is carried out here, with the server's own
// copy_file_range — in-kernel on tmpfs and ext4 (splice), a reflink where
// the filesystem can share extents (xfs, btrfs: copy_file_range clones
// first) — so the bytes never cross the network. SMB has the same thing as
// FSCTL_SRV_COPYCHUNK, NFS 4.2 as COPY and CLONE.

// copyPiece is the most one copy_file_range(2) call is asked for: between
// pieces CopyRange looks at its context, so that a cancelled or expired
// request stops within one piece.
const copyPiece = 8 << 20

// CopyRange copies up to n bytes of src, from srcOff, into f at dstOff on
// the server and returns how many it copied: fewer than n at src's end of
// file (0 at or past it), or when ctx ended — CopyRange always copies one
// piece (copyPiece) first, then goes on only while ctx is live, so a
// caller bounds a request's time with a deadline and gets a short count,
// as copy_file_range(2) itself may return — with f's attributes
// afterwards. Both files must be of the same
// share; f must have been opened for writing on a writable share (the
// read-only rule of WriteAt). Where the kernel cannot copy between the two
// files (another filesystem mounted inside the share: EXDEV; a filesystem
// without it) the bytes are copied by pread/pwrite, still on the server.
func (f *OpenFile) CopyRange(ctx context.Context, src *OpenFile, srcOff, dstOff, n int64) (done int64, a Attr, err error) {
	if f.readOnly {
		return 0, Attr{}, protocol.StatusAccessDenied
	}
	if src.tree.sh != f.tree.sh {
		return 0, Attr{}, protocol.StatusNotSameDevice
	}
	if srcOff < 0 || dstOff < 0 || n < 0 {
		return 0, Attr{}, protocol.StatusInvalidParameter
	}
	// As the user: the kernel charges and checks the destination as it
	// would a write of the user's own (quotas, clearing set-id bits).
	err = f.tree.as(func() error {
		return withFds(src, f, func(sfd, dfd int) (err error) {
			done, a, err = copyFds(ctx, sfd, dfd, srcOff, dstOff, n)
			return err
		})
	})
	if err != nil {
		return 0, Attr{}, err
	}
	return done, a, nil
}

// copyFds is CopyRange's loop on the two descriptors: one piece, then
// more while ctx is live; what was copied is reported even if a later
// piece fails, and then dst's attributes.
func copyFds(ctx context.Context, sfd, dfd int, srcOff, dstOff, n int64) (done int64, a Attr, err error) {
	for done < n && (done == 0 || ctx.Err() == nil) {
		var k int64
		k, err = copyOnce(sfd, dfd, srcOff+done, dstOff+done, min(n-done, copyPiece))
		done += k
		if err != nil || k == 0 {
			break
		}
	}
	if done > 0 {
		// What was copied stays copied: report it, as a short
		// copy_file_range(2) does; the caller's next request meets
		// the error again if it persists.
		err = nil
	}
	if err != nil {
		return 0, Attr{}, err
	}
	a, err = lstatAt(dfd, "")
	return done, a, err
}

// copyOnce copies up to n bytes at (so, do) with copy_file_range(2), or
// by hand where the kernel refuses to copy between these two files.
func copyOnce(sfd, dfd int, so, do, n int64) (int64, error) {
	for {
		in, out := so, do
		k, err := unix.CopyFileRange(sfd, &in, dfd, &out, int(n), 0)
		switch err {
		case nil:
			return int64(k), nil
		case unix.EINTR:
			continue
		case unix.EXDEV, unix.EOPNOTSUPP, unix.ENOSYS:
			return copyByHand(sfd, dfd, so, do, n)
		}
		return 0, err
	}
}

// copyByHandBuf is the buffer of a copy the kernel would not do.
const copyByHandBuf = 1 << 20

// copyByHand copies up to n bytes from sfd at so to dfd at do with pread
// and pwrite.
func copyByHand(sfd, dfd int, so, do, n int64) (int64, error) {
	buf := make([]byte, min(n, copyByHandBuf))
	var done int64
	for done < n {
		k, err := unix.Pread(sfd, buf[:min(n-done, int64(len(buf)))], so+done)
		if err == unix.EINTR {
			continue
		}
		if err != nil || k == 0 {
			return done, err
		}
		for w := 0; w < k; {
			m, err := unix.Pwrite(dfd, buf[w:k], do+done+int64(w))
			if err == unix.EINTR {
				continue
			}
			if err == nil && m == 0 {
				err = io.ErrShortWrite
			}
			if err != nil {
				return done + int64(w), err
			}
			w += m
		}
		done += int64(k)
	}
	return done, nil
}

// withFds is withFd on two files at once (they may be the same file).
func withFds(a, b *OpenFile, fn func(afd, bfd int) error) error {
	return a.withFd(func(afd int) error {
		return b.withFd(func(bfd int) error { return fn(afd, bfd) })
	})
}
