package protocol

import (
	"errors"
	"fmt"
)

// FieldError is a malformed LWIO or pipe message: a protocol error that ends
// the connection (docs/wire.md, "Error scope": a malformed message ends that
// connection, and nothing else). It is a different kind from Status, which fails one request
// and leaves the connection up. Every error a Decode function returns is a
// *FieldError.
type FieldError struct {
	// Msg names the message or structure, e.g. "VEC_READ", "AUTH_PARAMS".
	Msg string
	// Field names the offending field, e.g. "Regions[3].Length".
	Field string
	// Reason says what is wrong with it.
	Reason string
}

// Error implements error.
func (e *FieldError) Error() string {
	return fmt.Sprintf("lwio: malformed %s: %s: %s", e.Msg, e.Field, e.Reason)
}

// IsProtocolError reports whether err is, or wraps, a malformed-message error
// that must end the connection.
func IsProtocolError(err error) bool {
	var fe *FieldError
	return errors.As(err, &fe)
}

func fieldErr(msg, field, format string, args ...any) *FieldError {
	return &FieldError{Msg: msg, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func truncated(msg, field string, need, have int) *FieldError {
	return fieldErr(msg, field, "truncated: need %d bytes, have %d", need, have)
}

// exact checks that a fixed-size structure got exactly its size.
func exact(msg string, size, have int) error {
	if have < size {
		return truncated(msg, msg, size, have)
	}
	if have > size {
		return fieldErr(msg, msg, "%d unexpected trailing bytes", have-size)
	}
	return nil
}

// ConnectionError is the error of a request whose connection ended under
// it — an LWIO RDMA connection or the session channel. Its scope is the
// connection, as x/net/http2's ConnectionError: the request may or may not
// have run, every other request on that connection fails the same way, and
// the caller's remedy is a new connection (fs's reconnect), not a retry on
// this one. Callers ask with errors.As or IsConnectionLost instead of
// knowing each package's error values.
type ConnectionError struct {
	// Conn names the connection for logs: provider or channel and remote
	// address, e.g. "softrdma 127.0.0.1:4451" or "session 127.0.0.1:4450".
	Conn string
	// Err is why it ended (a transport error, io.EOF, a FieldError, ...).
	Err error
}

// Error implements error.
func (e *ConnectionError) Error() string {
	return "lwio: connection " + e.Conn + " lost: " + fmt.Sprint(e.Err)
}

// Unwrap returns the cause.
func (e *ConnectionError) Unwrap() error { return e.Err }

// IsConnectionLost reports whether err is, or wraps, a *ConnectionError.
func IsConnectionLost(err error) bool {
	var ce *ConnectionError
	return errors.As(err, &ce)
}
