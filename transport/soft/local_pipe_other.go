//go:build !linux

package soft

import (
	"errors"
	"net"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
)

// Pipes on the same-host path are Linux's (local_pipe.go): never offered
// nor accepted elsewhere.
const helloPipe = 0

type pipeSock struct{ sock }

var errNoPipes = errors.New("softrdma: no pipes on this system")

func (s *pipeSock) peer() (syscall.RawConn, error) { return nil, errNoPipes }
func servePipes(*net.UnixConn, *pipeSlots, logrus.FieldLogger) (sock, error) {
	return nil, errNoPipes
}

type pipeSlots struct {
	max  int32
	want func() int
}

const maxPipeConns = 0

func pipeWant() int                                    { return 0 }
func takePipes(*net.UnixConn, time.Time) (sock, error) { return nil, errNoPipes }

func pipesNoWait() bool { return false }
