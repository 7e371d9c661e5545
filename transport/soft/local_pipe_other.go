//go:build !linux

package soft

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// Pipes on the same-host path are Linux's (local_pipe.go): never offered
// nor accepted elsewhere.
const helloPipe = 0

type pipeSock struct{ sock }

var errNoPipes = errors.New("softrdma: no pipes on this system")

func (s *pipeSock) peer() (syscall.RawConn, error)     { return nil, errNoPipes }
func servePipes(*net.UnixConn) (sock, error)           { return nil, errNoPipes }
func takePipes(*net.UnixConn, time.Time) (sock, error) { return nil, errNoPipes }
