package smbauth

import (
	"errors"
	"fmt"
)

// ErrLogonFailure is the one error the server returns for an unknown user, a
// wrong password, a reused challenge, a bad MIC, an anonymous or NTLMv1
// attempt: the caller maps it to STATUS_LOGON_FAILURE (or ACCESS_DENIED) and
// the client learns nothing about which check failed.
var ErrLogonFailure = errors.New("smbauth: logon failure")

// ErrMalformed is wrapped by every decoding error: a message that is
// truncated, has the wrong signature or type, or points outside itself. The
// session layer maps it to STATUS_INVALID_PARAMETER.
var ErrMalformed = errors.New("smbauth: malformed NTLMSSP message")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}
