package fs

import (
	"context"
	"errors"
	"io"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// translateError is the one place an error becomes an errno at the FUSE
// boundary (after rclone's cmd/mount2). Statuses and errnos map through
// session.ToErrno; an error that only maps to EIO is logged with its
// operation and path, since the kernel will only ever see "I/O error".
func translateError(log logrus.FieldLogger, op, path string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	errno := session.ToErrno(err)
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

// isEOF reports whether err is only the end of the file.
func isEOF(err error) bool { return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) }
