//go:build linux

package soft

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Pipes on the same-host path. A unix stream socket wakes every poller of
// the sending socket each time the receiver consumes data
// (unix_write_space), and Go's netpoller polls every socket for EPOLLOUT:
// one needless thread wake-up per message on each side, on the path of a
// queue-depth-1 request (docs/bench.md, "4 KiB at qd1 over the unix
// socket"). A pipe wakes its writer only when it was full, and a round
// trip over two pipes takes half that of either socket. So once both
// hellos carry helloPipe (unless Options.NoPipes), the server makes two
// pipes, one
// per direction, after the unix socket has proved both ends and after the
// shared-memory step if any, and sends the client its two ends over that
// socket (SCM_RIGHTS, with one byte, pipeByte). The
// connection then reads and writes the pipes; the unix socket stays open,
// unused but for telling that the peer is gone (peerClosed).
//
// Without shared memory (shm.go) a 1 MiB frame costs more on a pipe of
// fs.pipe-max-size (1 MiB) than on the socket; with it, payloads do not
// cross the carrier. The server makes the pipes, so the ends it reads and writes with raw
// system calls are open file descriptions only it holds: a client cannot
// clear their O_NONBLOCK (a blocking raw read would hold a P). The client
// checks that it got a pipe's write end and a pipe's read end.

// helloPipe, with helloLocal, offers (listener) or accepts (dialer) pipes
// for the same-host path; a peer older than it sends zero and ignores it.
const helloPipe = 1 << 2

const pipeByte = 'P'

// pipeSize is each pipe's capacity when the process may set it (root may
// exceed fs.pipe-max-size), as localBuffer is the unix socket's; else the
// system's maximum.
const pipeSize = localBuffer

// pipeSock is a connection's carrier on pipes: it reads r, writes w, and
// keeps the unix socket the pipes came over. It does not embed the
// socket: net.Buffers.WriteTo would find the socket's own vectored write.
type pipeSock struct {
	uc   *net.UnixConn
	r, w *os.File
	rc   pipeRaw
}

// pipeRaw is the RawConn of a pipeSock: reads on r, writes on w.
type pipeRaw struct{ r, w syscall.RawConn }

func (p pipeRaw) Control(f func(uintptr)) error    { return p.r.Control(f) }
func (p pipeRaw) Read(f func(uintptr) bool) error  { return p.r.Read(f) }
func (p pipeRaw) Write(f func(uintptr) bool) error { return p.w.Write(f) }

// newPipeSock makes the carrier of the pipe ends rfd and wfd, which it
// owns from then on (closed if it fails).
func newPipeSock(uc *net.UnixConn, rfd, wfd int) (*pipeSock, error) {
	for _, fd := range []int{rfd, wfd} {
		if err := unix.SetNonblock(fd, true); err != nil {
			closeFDs(rfd, wfd)
			return nil, err
		}
		// Best effort, as the socket's buffer: a larger pipe takes a
		// large frame in fewer fills.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, pipeSize); err != nil {
			_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, pipeMaxSize())
		}
	}
	s := &pipeSock{uc: uc, r: os.NewFile(uintptr(rfd), "softrdma-pipe-r"), w: os.NewFile(uintptr(wfd), "softrdma-pipe-w")}
	rr, err := s.r.SyscallConn()
	if err == nil {
		var wr syscall.RawConn
		if wr, err = s.w.SyscallConn(); err == nil {
			s.rc = pipeRaw{r: rr, w: wr}
			return s, nil
		}
	}
	_ = s.r.Close()
	_ = s.w.Close()
	return nil, err
}

// pipeMaxSize is fs.pipe-max-size, the most an unprivileged process may
// give a pipe.
func pipeMaxSize() int {
	n := 1 << 20
	if b, err := os.ReadFile("/proc/sys/fs/pipe-max-size"); err == nil {
		_, _ = fmt.Sscan(string(b), &n)
	}
	return n
}

func (s *pipeSock) Read(b []byte) (int, error) { return s.r.Read(b) }

// Write writes all of b, waiting for room, with raw write(2) calls: as
// sysWriter's writev, it does not tell the race detector it read b, which
// the application may reuse once its completion arrived, before Write
// returns (os.File's Write would; a socket's vectored write does not).
func (s *pipeSock) Write(b []byte) (int, error) {
	n := 0
	var werr error
	err := s.rc.w.Write(func(fd uintptr) bool {
		for n < len(b) {
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[n])), uintptr(len(b)-n))
			switch e {
			case 0:
				n += int(r)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // the poller waits for room
			default:
				werr = e
				return true
			}
		}
		return true
	})
	return n, errors.Join(err, werr)
}
func (s *pipeSock) Close() error {
	return errors.Join(s.r.Close(), s.w.Close(), s.uc.Close())
}
func (s *pipeSock) CloseWrite() error                  { return s.w.Close() }
func (s *pipeSock) LocalAddr() net.Addr                { return s.uc.LocalAddr() }
func (s *pipeSock) RemoteAddr() net.Addr               { return s.uc.RemoteAddr() }
func (s *pipeSock) SetReadDeadline(t time.Time) error  { return s.r.SetReadDeadline(t) }
func (s *pipeSock) SetWriteDeadline(t time.Time) error { return s.w.SetWriteDeadline(t) }
func (s *pipeSock) SetDeadline(t time.Time) error {
	return errors.Join(s.r.SetDeadline(t), s.w.SetDeadline(t))
}
func (s *pipeSock) SyscallConn() (syscall.RawConn, error) { return s.rc, nil }

// peer is the socket whose end of stream says the peer has gone.
func (s *pipeSock) peer() (syscall.RawConn, error) { return s.uc.SyscallConn() }

// servePipes makes the connection's pipes and sends the client its ends
// over uc; it returns the server's carrier.
func servePipes(uc *net.UnixConn) (sock, error) {
	var up, down [2]int // client to server, server to client
	if err := unix.Pipe2(up[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return nil, err
	}
	if err := unix.Pipe2(down[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		closeFDs(up[0], up[1])
		return nil, err
	}
	_, _, err := uc.WriteMsgUnix([]byte{pipeByte}, unix.UnixRights(up[1], down[0]), nil)
	closeFDs(up[1], down[0]) // the client's now, or nobody's
	if err != nil {
		closeFDs(up[0], down[1])
		return nil, err
	}
	return newPipeSock(uc, up[0], down[1])
}

// takePipes receives the client's pipe ends from the server over uc.
func takePipes(uc *net.UnixConn, deadline time.Time) (sock, error) {
	_ = uc.SetReadDeadline(deadline)
	var b [1]byte
	oob := make([]byte, unix.CmsgSpace(2*4))
	n, oobn, _, _, err := uc.ReadMsgUnix(b[:], oob)
	_ = uc.SetReadDeadline(time.Time{})
	if err != nil {
		return nil, err
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if f, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, f...)
			}
		}
	}
	if n != 1 || b[0] != pipeByte || len(fds) != 2 || !isPipeEnd(fds[0], unix.O_WRONLY) || !isPipeEnd(fds[1], unix.O_RDONLY) {
		closeFDs(fds...)
		return nil, errors.New("softrdma: the server sent no pipes, or not two pipe ends")
	}
	return newPipeSock(uc, fds[1], fds[0])
}

// isPipeEnd reports whether fd is a pipe opened for mode alone.
func isPipeEnd(fd, mode int) bool {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return false
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	return err == nil && fl&unix.O_ACCMODE == mode
}

func closeFDs(fds ...int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}
