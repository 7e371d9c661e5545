// Package ntstatus is the one mapping between errno and NTSTATUS, both
// ways. The server turns what the disk said (an errno, an os sentinel, end
// of file) into the NTSTATUS a client sees with FromError — protocol/share
// does it for every disk operation, so the session channel and the LWIO
// engine answer alike — and the client turns a status back into the errno a
// program sees with ToErrno, which fs's translateError applies at the FUSE
// boundary. docs/session.md lists the table.
package ntstatus

import (
	"context"
	"errors"
	"io"
	"os"
	"syscall"

	"github.com/lwiofs/lwiofs/protocol"
)

// NTSTATUS codes the table needs beyond protocol's list ([MS-ERREF]
// 2.3.1). They keep errno values distinguishable that Windows folds
// together (EPERM vs EACCES, E2BIG, EDQUOT, ERANGE).
const (
	PrivilegeNotHeld        = protocol.Status(0xC0000061) // EPERM
	EATooLarge              = protocol.Status(0xC0000050) // E2BIG (xattr value)
	QuotaExceeded           = protocol.Status(0xC0000044) // EDQUOT
	ReparsePointNotResolved = protocol.Status(0xC0000280) // ELOOP
	FileInvalid             = protocol.Status(0xC0000098) // ESTALE
	InvalidDevState         = protocol.Status(0xC0000184) // ENXIO/ENODEV
	FileLockConflict        = protocol.Status(0xC0000054) // EAGAIN / EWOULDBLOCK
	// TooManyOpenedFiles is a user over its own handle limit (the server's
	// max_open_files_per_user), which its mount reports as EMFILE while
	// other users go on; the server as a whole out of descriptors is
	// INSUFFICIENT_RESOURCES (ENFILE).
	TooManyOpenedFiles = protocol.Status(0xC000011F)
)

// table is THE mapping between errno and NTSTATUS, both directions.
// Server: the first row whose Errno matches gives the status sent.
// Client: the first row whose Status matches gives the errno returned.
// Rows marked toStatus fold an errno onto a status another row owns; rows
// marked toErrno are statuses the server never sends for that errno but
// another server (or an older one) might.
var table = []struct {
	Errno  syscall.Errno
	Status protocol.Status
	Dir    direction
}{
	{syscall.ENOENT, protocol.StatusObjectNameNotFound, both},
	{syscall.EEXIST, protocol.StatusObjectNameCollision, both},
	{syscall.ENOTEMPTY, protocol.StatusDirectoryNotEmpty, both},
	{syscall.EACCES, protocol.StatusAccessDenied, both},
	{syscall.EPERM, PrivilegeNotHeld, both},
	{syscall.EISDIR, protocol.StatusFileIsADirectory, both},
	{syscall.ENOTDIR, protocol.StatusNotADirectory, both},
	{syscall.ENOSPC, protocol.StatusDiskFull, both},
	{syscall.EDQUOT, QuotaExceeded, both},
	{syscall.ENODATA, protocol.StatusNoEAsOnFile, both},
	{syscall.E2BIG, EATooLarge, both},
	{syscall.ERANGE, protocol.StatusBufferTooSmall, both},
	{syscall.EOPNOTSUPP, protocol.StatusNotSupported, both},
	{syscall.ENOSYS, protocol.StatusNotImplemented, both},
	{syscall.EINVAL, protocol.StatusInvalidParameter, both},
	{syscall.EBADF, protocol.StatusInvalidHandle, both},
	{syscall.ENAMETOOLONG, protocol.StatusNameTooLong, both},
	{syscall.EXDEV, protocol.StatusNotSameDevice, both},
	{syscall.EMLINK, protocol.StatusTooManyLinks, both},
	{syscall.ELOOP, ReparsePointNotResolved, both},
	{syscall.EROFS, protocol.StatusMediaWriteProtected, both},
	{syscall.EFBIG, protocol.StatusFileTooLarge, both},
	{syscall.EIO, protocol.StatusIOError, both},
	{syscall.ENOMEM, protocol.StatusNoMemory, both},
	{syscall.EBUSY, protocol.StatusSharingViolation, both},
	{syscall.ETXTBSY, protocol.StatusSharingViolation, toStatus},
	{syscall.ESTALE, FileInvalid, both},
	{syscall.ENXIO, InvalidDevState, both},
	{syscall.EAGAIN, FileLockConflict, both},
	{syscall.ECANCELED, protocol.StatusCancelled, both},
	{syscall.ETIMEDOUT, protocol.StatusIOTimeout, both},
	{syscall.ECONNRESET, protocol.StatusConnectionReset, both},
	{syscall.ENFILE, protocol.StatusInsufficientResources, both},
	{syscall.EMFILE, protocol.StatusInsufficientResources, toStatus},
	// Status → errno only.
	{syscall.ENOENT, protocol.StatusObjectPathNotFound, toErrno},
	{syscall.ENOENT, protocol.StatusNoSuchFile, toErrno},
	{syscall.ENOENT, protocol.StatusBadNetworkName, toErrno},
	{syscall.EACCES, protocol.StatusLogonFailure, toErrno},
	{syscall.EINVAL, protocol.StatusObjectNameInvalid, toErrno},
	{syscall.EBADF, protocol.StatusFileClosed, toErrno},
	{syscall.EPERM, protocol.StatusCannotDelete, toErrno},
	{syscall.ENODATA, protocol.StatusEASNotSupported, toErrno},
	{syscall.EIO, protocol.StatusUnsuccessful, toErrno},
	{syscall.ELOOP, protocol.StatusStoppedOnSymlink, toErrno},
	{syscall.EMFILE, TooManyOpenedFiles, toErrno},
}

// errnoToStatus and statusToErrno are table indexed once at init.
var (
	errnoToStatus = map[syscall.Errno]protocol.Status{}
	statusToErrno = map[protocol.Status]syscall.Errno{}
)

// direction says which way a row of table translates.
type direction uint8

const (
	both     direction = iota
	toStatus           // errno → status only
	toErrno            // status → errno only
)

func init() {
	for _, r := range table {
		if _, ok := errnoToStatus[r.Errno]; !ok && r.Dir != toErrno {
			errnoToStatus[r.Errno] = r.Status
		}
		if _, ok := statusToErrno[r.Status]; !ok && r.Dir != toStatus {
			statusToErrno[r.Status] = r.Errno
		}
	}
}

// FromError maps a server-side error to the NTSTATUS sent on the wire: a
// protocol.Status as itself, an errno through the table, io.EOF as
// END_OF_FILE, a closed file as FILE_CLOSED, the os sentinels
// (ErrNotExist, ErrExist, ErrPermission) by meaning, and anything else —
// an errno the table lacks included — as STATUS_UNSUCCESSFUL, Samba's
// default too (map_nt_error_from_unix).
func FromError(err error) protocol.Status {
	if err == nil {
		return protocol.StatusSuccess
	}
	var st protocol.Status
	if errors.As(err, &st) {
		return st
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		if s, ok := errnoToStatus[en]; ok {
			return s
		}
		return protocol.StatusUnsuccessful
	}
	switch {
	case errors.Is(err, io.EOF):
		return protocol.StatusEndOfFile
	case errors.Is(err, os.ErrClosed):
		return protocol.StatusFileClosed
	case errors.Is(err, os.ErrNotExist):
		return protocol.StatusObjectNameNotFound
	case errors.Is(err, os.ErrExist):
		return protocol.StatusObjectNameCollision
	case errors.Is(err, os.ErrPermission):
		return protocol.StatusAccessDenied
	}
	return protocol.StatusUnsuccessful
}

// ToErrno maps an error from a client call to the errno a program sees: nil
// → 0, a lost connection (protocol.ConnectionError, whichever channel) →
// ENOTCONN, a protocol.Status through the table (EIO when unknown), a
// syscall.Errno as itself, a cancelled context → EINTR, anything else EIO.
func ToErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if protocol.IsConnectionLost(err) {
		return syscall.ENOTCONN
	}
	var st protocol.Status
	if errors.As(err, &st) {
		if st == protocol.StatusSuccess {
			return 0
		}
		if e, ok := statusToErrno[st]; ok {
			return e
		}
		return syscall.EIO
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return syscall.EINTR
	}
	return syscall.EIO
}
