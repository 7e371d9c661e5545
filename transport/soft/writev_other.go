//go:build !linux

package soft

import (
	"errors"
)

// sysWriter is the inline path's writer; elsewhere than Linux every batch
// goes to the writer goroutine.
type sysWriter struct{}

var errInlineUnsupported = errors.New("softrdma: no inline writes on this platform")

func (s *sysWriter) init(sock)                    {}
func (s *sysWriter) writev([][]byte) (int, error) { return 0, errInlineUnsupported }
func (s *sysWriter) peerClosed() bool             { return false }
func errWouldBlock(err error) bool                { return errors.Is(err, errInlineUnsupported) }

// sysReader: elsewhere than Linux every read blocks (the idle hook runs
// before each).
type sysReader struct{ nc sock }

func (s *sysReader) init(tc sock)                { s.nc = tc }
func (s *sysReader) tryRead([]byte) (int, error) { return 0, errInlineUnsupported }
func (s *sysReader) read(p []byte) (int, error)  { return s.nc.Read(p) }
