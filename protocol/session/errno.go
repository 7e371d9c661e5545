package session

import (
	"context"
	"errors"
	"os"
	"syscall"

	"github.com/lwiofs/lwiofs/protocol"
)

// NTSTATUS codes the session channel needs beyond protocol's list
// ([MS-ERREF] 2.3.1). They keep errno values distinguishable that Windows
// folds together (EPERM vs EACCES, E2BIG, EDQUOT, ERANGE).
const (
	StatusPrivilegeNotHeld        = protocol.Status(0xC0000061) // EPERM
	StatusEATooLarge              = protocol.Status(0xC0000050) // E2BIG (xattr value)
	StatusQuotaExceeded           = protocol.Status(0xC0000044) // EDQUOT
	StatusReparsePointNotResolved = protocol.Status(0xC0000280) // ELOOP
	StatusFileInvalid             = protocol.Status(0xC0000098) // ESTALE
	StatusInvalidDevState         = protocol.Status(0xC0000184) // ENXIO/ENODEV
	StatusFileLockConflict        = protocol.Status(0xC0000054) // EAGAIN / EWOULDBLOCK
)

// errnoTable is THE mapping between errno and NTSTATUS, both directions.
// Server: the first row whose Errno matches gives the status sent.
// Client: the first row whose Status matches gives the errno returned.
// Rows marked toStatus fold an errno onto a status another row owns; rows
// marked toErrno are statuses the server never sends for that errno but
// another server (or an older one) might.
var errnoTable = []struct {
	Errno  syscall.Errno
	Status protocol.Status
	Dir    direction
}{
	{syscall.ENOENT, protocol.StatusObjectNameNotFound, both},
	{syscall.EEXIST, protocol.StatusObjectNameCollision, both},
	{syscall.ENOTEMPTY, protocol.StatusDirectoryNotEmpty, both},
	{syscall.EACCES, protocol.StatusAccessDenied, both},
	{syscall.EPERM, StatusPrivilegeNotHeld, both},
	{syscall.EISDIR, protocol.StatusFileIsADirectory, both},
	{syscall.ENOTDIR, protocol.StatusNotADirectory, both},
	{syscall.ENOSPC, protocol.StatusDiskFull, both},
	{syscall.EDQUOT, StatusQuotaExceeded, both},
	{syscall.ENODATA, protocol.StatusNoEAsOnFile, both},
	{syscall.E2BIG, StatusEATooLarge, both},
	{syscall.ERANGE, protocol.StatusBufferTooSmall, both},
	{syscall.EOPNOTSUPP, protocol.StatusNotSupported, both},
	{syscall.ENOSYS, protocol.StatusNotImplemented, both},
	{syscall.EINVAL, protocol.StatusInvalidParameter, both},
	{syscall.EBADF, protocol.StatusInvalidHandle, both},
	{syscall.ENAMETOOLONG, protocol.StatusNameTooLong, both},
	{syscall.EXDEV, protocol.StatusNotSameDevice, both},
	{syscall.EMLINK, protocol.StatusTooManyLinks, both},
	{syscall.ELOOP, StatusReparsePointNotResolved, both},
	{syscall.EROFS, protocol.StatusMediaWriteProtected, both},
	{syscall.EFBIG, protocol.StatusFileTooLarge, both},
	{syscall.EIO, protocol.StatusIOError, both},
	{syscall.ENOMEM, protocol.StatusNoMemory, both},
	{syscall.EBUSY, protocol.StatusSharingViolation, both},
	{syscall.ETXTBSY, protocol.StatusSharingViolation, toStatus},
	{syscall.ESTALE, StatusFileInvalid, both},
	{syscall.ENXIO, StatusInvalidDevState, both},
	{syscall.EAGAIN, StatusFileLockConflict, both},
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
}

// errnoToStatus and statusToErrno are errnoTable indexed once at init.
var (
	errnoToStatus = map[syscall.Errno]protocol.Status{}
	statusToErrno = map[protocol.Status]syscall.Errno{}
)

// direction says which way a row of errnoTable translates.
type direction uint8

const (
	both     direction = iota
	toStatus           // errno → status only
	toErrno            // status → errno only
)

func init() {
	for _, r := range errnoTable {
		if _, ok := errnoToStatus[r.Errno]; !ok && r.Dir != toErrno {
			errnoToStatus[r.Errno] = r.Status
		}
		if _, ok := statusToErrno[r.Status]; !ok && r.Dir != toStatus {
			statusToErrno[r.Status] = r.Errno
		}
	}
}

// StatusFromError maps a server-side error to the NTSTATUS sent on the
// wire: a protocol.Status as itself, an errno through errnoTable, the os
// sentinels (ErrNotExist, ErrExist, ErrPermission) by meaning, anything else
// STATUS_UNSUCCESSFUL.
func StatusFromError(err error) protocol.Status {
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
	case errors.Is(err, os.ErrNotExist):
		return protocol.StatusObjectNameNotFound
	case errors.Is(err, os.ErrExist):
		return protocol.StatusObjectNameCollision
	case errors.Is(err, os.ErrPermission):
		return protocol.StatusAccessDenied
	}
	return protocol.StatusUnsuccessful
}

// ToErrno maps an error from a client call to the errno the FUSE layer
// returns: nil → 0, a protocol.Status through errnoTable, a syscall.Errno
// as itself, a dead connection → ENOTCONN, a cancelled context → EINTR,
// anything else EIO.
func ToErrno(err error) syscall.Errno {
	if err == nil {
		return 0
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
	switch {
	case errors.Is(err, ErrClosed):
		return syscall.ENOTCONN
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return syscall.EINTR
	}
	return syscall.EIO
}
