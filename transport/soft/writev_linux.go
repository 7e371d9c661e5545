package soft

import (
	"errors"
	"io"
	"syscall"
	"unsafe"
)

// sysWriter does one non-blocking writev(2) on the socket, through
// RawConn.Write so it is serialized with the runtime's own writes. It
// does not tell the race detector it read the buffers (net.Buffers'
// writev does not either): the application may reuse a buffer as soon as
// its completion arrives, which may be before this call returns.
type sysWriter struct {
	rc   syscall.RawConn
	peer syscall.RawConn // peerClosed's socket: rc's, or a pipeSock's unix socket
	vec  []syscall.Iovec
	n    int
	err  error
	fn   func(fd uintptr) bool
}

// maxIOV is the kernel's IOV_MAX.
const maxIOV = 1024

func (s *sysWriter) init(tc sock) {
	rc, err := tc.SyscallConn()
	if err != nil {
		s.err = err
		return
	}
	s.rc, s.peer = rc, rc
	ps, pipe := tc.(*pipeSock)
	if pipe {
		// A pipe cannot be peeked: the unix socket tells (nil if it is
		// closed already: peerClosed then says no, as with no socket).
		s.peer, _ = ps.peer()
	}
	s.fn = func(fd uintptr) bool {
		s.n, s.err = 0, nil
		var r uintptr
		var e syscall.Errno
		if pipe { // never waits, whatever the pipe's O_NONBLOCK (local_pipe.go)
			var n int
			n, e = nowaitWritev(fd, s.vec)
			r = uintptr(n)
		} else {
			r, _, e = syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&s.vec[0])), uintptr(len(s.vec)))
		}
		if e != 0 {
			s.err = e
		} else {
			s.n = int(r)
		}
		return true // one attempt: never wait for the socket here
	}
}

// writev writes what the socket takes at once and reports how much.
func (s *sysWriter) writev(iov [][]byte) (int, error) {
	if s.rc == nil {
		return 0, syscall.EAGAIN
	}
	s.vec = s.vec[:0]
	for _, b := range iov {
		if len(b) == 0 {
			continue
		}
		if len(s.vec) == maxIOV {
			break
		}
		v := syscall.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		s.vec = append(s.vec, v)
	}
	if len(s.vec) == 0 {
		return 0, nil
	}
	raceRelease()
	if err := s.rc.Write(s.fn); err != nil {
		return 0, err
	}
	clear(s.vec) // let the buffers go
	return s.n, s.err
}

func errWouldBlock(err error) bool {
	return errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR)
}

// peerClosed reports whether the peer has closed or reset the connection,
// without consuming anything: a MSG_PEEK of one byte that must not block.
// The reader uses it while a SEND waits for a receive (RNR), since it is
// not reading the socket then.
func (s *sysWriter) peerClosed() bool {
	if s.peer == nil {
		return false
	}
	closed := false
	var b [1]byte
	_ = s.peer.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = (n == 0 && err == nil) || (err != nil && !errWouldBlock(err))
		return true
	})
	return closed
}

// sysReader reads the socket with raw read(2) calls through RawConn.Read,
// serialized with the runtime's own reads; the race detector does not see
// them (see raceSeq).
type sysReader struct {
	rc      syscall.RawConn
	nc      sock
	p       []byte
	n       int
	err     error
	tryFn   func(fd uintptr) bool // one attempt
	blockFn func(fd uintptr) bool // until something is read
}

func (s *sysReader) init(tc sock) {
	s.nc = tc
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	s.rc = rc
	read := rawRead
	if _, ok := tc.(*pipeSock); ok {
		read = nowaitRead // never waits, whatever the pipe's O_NONBLOCK (local_pipe.go)
	}
	s.tryFn = func(fd uintptr) bool {
		s.n, s.err = read(fd, s.p)
		return true
	}
	s.blockFn = func(fd uintptr) bool {
		s.n, s.err = read(fd, s.p)
		return !errors.Is(s.err, syscall.EAGAIN)
	}
}

// rawRead and sysWriter's writev are raw system calls (RawSyscall, not
// Syscall): the socket is non-blocking, so neither ever waits, and a
// system call entered the ordinary way wakes the runtime's sysmon thread
// whenever it sleeps, which it does between the requests of a queue-depth-1
// load — a thread wake-up on about one 4 KiB request in four on each side
// (perf sched, issue 16). The cost: the goroutine's P is not handed off
// while the kernel copies, as it would not be for a copy in Go.
func rawRead(fd uintptr, p []byte) (int, error) {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(r), nil
	}
}

func (s *sysReader) do(p []byte, fn func(uintptr) bool) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.p = p
	err := s.rc.Read(fn)
	s.p = nil
	switch {
	case err != nil:
		return 0, err
	case s.err != nil:
		return 0, s.err
	case s.n == 0:
		return 0, io.EOF
	}
	raceAcquire()
	return s.n, nil
}

// tryRead reads what is there without waiting; an empty socket is EAGAIN,
// end of stream io.EOF.
func (s *sysReader) tryRead(p []byte) (int, error) {
	if s.rc == nil {
		return 0, syscall.EAGAIN
	}
	return s.do(p, s.tryFn)
}

// read waits for something to read (or the read deadline) and reads it.
func (s *sysReader) read(p []byte) (int, error) {
	if s.rc == nil {
		return s.nc.Read(p)
	}
	return s.do(p, s.blockFn)
}
