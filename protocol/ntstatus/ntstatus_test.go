package ntstatus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"github.com/lwiofs/lwiofs/protocol"
)

func TestTableRoundTrips(t *testing.T) {
	for _, r := range table {
		if r.Dir != both {
			continue
		}
		st := FromError(r.Errno)
		if st != r.Status {
			t.Errorf("%v → %v, want %v", r.Errno, st, r.Status)
		}
		if got := ToErrno(st); got != r.Errno {
			t.Errorf("%v → %v → %v, want %v back", r.Errno, st, got, r.Errno)
		}
	}
}

func TestToErrno(t *testing.T) {
	lost := &protocol.ConnectionError{Conn: "session 127.0.0.1:1", Err: syscall.ECONNRESET}
	for _, tc := range []struct {
		err  error
		want syscall.Errno
	}{
		{nil, 0},
		{protocol.StatusSuccess, 0},
		{protocol.StatusObjectNameNotFound, syscall.ENOENT},
		{protocol.StatusObjectPathNotFound, syscall.ENOENT},
		{protocol.StatusObjectNameCollision, syscall.EEXIST},
		{protocol.StatusDirectoryNotEmpty, syscall.ENOTEMPTY},
		{protocol.StatusAccessDenied, syscall.EACCES},
		{PrivilegeNotHeld, syscall.EPERM},
		{protocol.StatusFileIsADirectory, syscall.EISDIR},
		{protocol.StatusNotADirectory, syscall.ENOTDIR},
		{protocol.StatusDiskFull, syscall.ENOSPC},
		{protocol.StatusNoEAsOnFile, syscall.ENODATA},
		{protocol.StatusMediaWriteProtected, syscall.EROFS},
		{protocol.StatusLogonFailure, syscall.EACCES},
		{fmt.Errorf("wrapped: %w", protocol.StatusInvalidHandle), syscall.EBADF},
		{protocol.Status(0xC0DEC0DE), syscall.EIO},
		{syscall.EXDEV, syscall.EXDEV},
		// A lost connection is ENOTCONN whatever broke it.
		{lost, syscall.ENOTCONN},
		{fmt.Errorf("read: %w", lost), syscall.ENOTCONN},
		{context.Canceled, syscall.EINTR},
		{errors.New("anything"), syscall.EIO},
	} {
		if got := ToErrno(tc.err); got != tc.want {
			t.Errorf("ToErrno(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	// EPERM and EACCES stay apart end to end.
	if ToErrno(FromError(syscall.EPERM)) != syscall.EPERM || ToErrno(FromError(syscall.EACCES)) != syscall.EACCES {
		t.Error("EPERM and EACCES folded")
	}
}

func TestFromError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want protocol.Status
	}{
		{nil, protocol.StatusSuccess},
		{protocol.StatusCancelled, protocol.StatusCancelled},
		{&fs.PathError{Op: "open", Path: "x", Err: syscall.ENOENT}, protocol.StatusObjectNameNotFound},
		{&fs.PathError{Op: "write", Path: "x", Err: syscall.EDQUOT}, QuotaExceeded},
		{os.ErrExist, protocol.StatusObjectNameCollision},
		{os.ErrClosed, protocol.StatusFileClosed},
		{io.EOF, protocol.StatusEndOfFile},
		{syscall.ETXTBSY, protocol.StatusSharingViolation},
		{syscall.Errno(4000), protocol.StatusUnsuccessful},
		{errors.New("x"), protocol.StatusUnsuccessful},
	} {
		if got := FromError(tc.err); got != tc.want {
			t.Errorf("FromError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestTableConsistent: a status appears once among the rows that map both
// ways, and so does an errno.
func TestTableConsistent(t *testing.T) {
	seenE := map[syscall.Errno]bool{}
	seenS := map[protocol.Status]bool{}
	for _, r := range table {
		if r.Dir != both {
			continue
		}
		if seenE[r.Errno] || seenS[r.Status] {
			t.Errorf("row %v ↔ %v duplicates an earlier two-way row", r.Errno, r.Status)
		}
		seenE[r.Errno], seenS[r.Status] = true, true
	}
}
