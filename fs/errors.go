package fs

import (
	"context"
	"errors"
	"io"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

// translateError is the one place an error becomes an errno at the FUSE
// boundary (after rclone's cmd/mount2). Statuses, errnos and lost
// connections map through the one table, ntstatus.ToErrno; an error that
// only maps to EIO is logged with its operation and path, since the kernel
// will only ever see "I/O error".
func translateError(log logrus.FieldLogger, op, path string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	errno := ntstatus.ToErrno(err)
	if errno == syscall.EIO && !isPlainEIO(err) {
		log.WithFields(logrus.Fields{"op": op, "path": path}).WithError(err).Warn("fs: unmapped error, returning EIO")
	}
	if errno == syscall.EINTR && errors.Is(err, context.DeadlineExceeded) {
		errno = syscall.ETIMEDOUT
	}
	return errno
}

// isPlainEIO reports whether err says "I/O error" in so many words, so
// translating it to EIO loses nothing worth a log line.
func isPlainEIO(err error) bool {
	var st protocol.Status
	if errors.As(err, &st) {
		return st == protocol.StatusIOError || st == protocol.StatusUnsuccessful
	}
	var en syscall.Errno
	return errors.As(err, &en) && en == syscall.EIO
}

// isEOF reports whether err is only the end of the file — not a lost
// connection, whose error wraps the io.EOF its reader got when the server
// closed it: a read on it must be replayed, never answered as empty.
func isEOF(err error) bool {
	return !protocol.IsConnectionLost(err) && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF))
}

// nsTimeout bounds one namespace operation on the session channel.
const nsTimeout = 60 * time.Second

// detach gives a namespace operation a context that a FUSE INTERRUPT does
// not end. Such operations are not idempotent: an interrupted O_EXCL
// create (or mkdir, unlink, rename) may well have happened on the server,
// and the caller's retry after EINTR — Go's runtime retries open(2) on
// EINTR, and its preemption signals cause interrupts — would then fail
// with EEXIST or ENOENT. They are short, so they run to completion,
// bounded by nsTimeout.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), nsTimeout)
}
