//go:build linux

package soft

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/sirupsen/logrus"
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
	// release, on the server, gives back the listener's pipe slot (once,
	// at Close).
	release func()
	closed  atomic.Bool
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

// Read reads what is there, waiting for something (or the deadline), with
// RWF_NOWAIT reads (nowaitRead).
func (s *pipeSock) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var n int
	var rerr error
	err := s.rc.r.Read(func(fd uintptr) bool {
		n, rerr = nowaitRead(fd, b)
		return !errors.Is(rerr, syscall.EAGAIN)
	})
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of b, waiting for room, with raw RWF_NOWAIT writes
// (nowaitWritev): as sysWriter's writev, it does not tell the race
// detector it read b, which the application may reuse once its completion
// arrived, before Write returns (os.File's Write would; a socket's
// vectored write does not).
func (s *pipeSock) Write(b []byte) (int, error) {
	n := 0
	var werr error
	var iov [1]syscall.Iovec
	err := s.rc.w.Write(func(fd uintptr) bool {
		for n < len(b) {
			iov[0] = syscall.Iovec{Base: &b[n]}
			iov[0].SetLen(len(b) - n)
			r, e := nowaitWritev(fd, iov[:])
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
	return errors.Join(s.drop(), s.uc.Close())
}

// drop closes the pipe ends and gives back the slot, not the socket.
func (s *pipeSock) drop() error {
	if !s.closed.Swap(true) && s.release != nil {
		s.release()
	}
	return errors.Join(s.r.Close(), s.w.Close())
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

// noPipeByte, sent instead of pipeByte and without descriptors, says the
// server keeps this connection on the unix socket (pipeSlots).
const noPipeByte = 'N'

// maxPipeConns bounds a listener's connections on pipes. The server makes
// the pipes before the peer authenticated itself (the transport knows no
// LWIO), and pays for them: each pipe's pages count against its user's
// fs.pipe-user-pages-soft (16384 pages, 64 MiB, by default: 32 connections
// of 1 MiB pipes; CAP_SYS_RESOURCE or CAP_SYS_ADMIN exempts, and
// CAP_SYS_RESOURCE gets 4 MiB pipes), and a peer may fill
// the pipe it writes and leave it full (for up to the server's AUTH
// timeout). 128 connections is eight 16-CPU mounts; beyond, a connection
// stays on the unix socket, as with NoPipes.
const maxPipeConns = 128

// pipeSlots counts a listener's connections on pipes. A connection takes
// one before its pipes are made and gives it back when its carrier closes.
// Without a slot, or when its pipes cannot be made at the size wanted
// (want: the user's pipe budget spent leaves a new pipe at two pages), the
// server says noPipeByte and the connection stays on the unix socket,
// rather than fail or crawl through 8 KiB pipes.
type pipeSlots struct {
	n    atomic.Int32
	max  int32
	want func() int
}

// pipeWant is the size a listener needs of each pipe: what newPipeSock
// asks for.
func pipeWant() int { return min(pipeSize, pipeMaxSize()) }

// servePipes makes the connection's pipes and sends the client its ends
// over uc; it returns the server's carrier: the pipes, or uc itself if
// slots refused (noPipeByte).
func servePipes(uc *net.UnixConn, slots *pipeSlots, log logrus.FieldLogger) (sock, error) {
	refuse := func(why error) (sock, error) {
		log.WithError(why).Info("softrdma: this connection stays on the unix socket")
		if _, err := uc.Write([]byte{noPipeByte}); err != nil {
			return nil, err
		}
		return uc, nil
	}
	if slots.n.Add(1) > slots.max {
		slots.n.Add(-1)
		return refuse(fmt.Errorf("%d connections on pipes already", slots.max))
	}
	release := func() { slots.n.Add(-1) }
	var up, down [2]int // client to server, server to client
	if err := unix.Pipe2(up[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		release()
		return refuse(err)
	}
	if err := unix.Pipe2(down[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		closeFDs(up[0], up[1])
		release()
		return refuse(err)
	}
	for _, fd := range []int{up[0], down[1]} {
		// As the socket's buffer: a larger pipe takes a large frame in
		// fewer fills. The server sizes them, its user pays (the
		// client does not touch the size: it would charge that user).
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, pipeSize); err != nil {
			_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, pipeMaxSize())
		}
	}
	ps, err := newPipeSock(uc, up[0], down[1])
	if err != nil {
		closeFDs(up[1], down[0])
		release()
		return refuse(err)
	}
	ps.release = release
	want := slots.want()
	for _, f := range []*os.File{ps.r, ps.w} {
		if n, err := unix.FcntlInt(f.Fd(), unix.F_GETPIPE_SZ, 0); err != nil || n < want {
			closeFDs(up[1], down[0])
			ps.drop()
			return refuse(fmt.Errorf("a pipe of %d bytes, not %d: the user's pipe budget (fs.pipe-user-pages-soft) is spent? %v", n, want, err))
		}
	}
	_, _, err = uc.WriteMsgUnix([]byte{pipeByte}, unix.UnixRights(up[1], down[0]), nil)
	closeFDs(up[1], down[0]) // the client's now, or nobody's
	if err != nil {
		_ = ps.Close()
		return nil, err
	}
	return ps, nil
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
	if n == 1 && b[0] == noPipeByte && len(fds) == 0 {
		return uc, nil // the server keeps the unix socket
	}
	if n != 1 || b[0] != pipeByte || len(fds) != 2 || !isPipeEnd(fds[0], unix.O_WRONLY) || !isPipeEnd(fds[1], unix.O_RDONLY) ||
		samePipe(fds[0], fds[1]) {
		closeFDs(fds...)
		return nil, errors.New("softrdma: the server sent no pipes, or not two pipes' ends")
	}
	return newPipeSock(uc, fds[1], fds[0])
}

// samePipe reports whether a and b are ends of one pipe: the client would
// read back what it writes, its own requests as if they were answers.
func samePipe(a, b int) bool {
	var sa, sb unix.Stat_t
	return unix.Fstat(a, &sa) != nil || unix.Fstat(b, &sb) != nil || sa.Dev == sb.Dev && sa.Ino == sb.Ino
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

// The pipe ends' reads and writes must never wait in the kernel: they are
// raw system calls (RawSyscall, writev_linux.go), and one that blocked
// would hold its P, so the runtime could never stop the world again: the
// whole process would hang. O_NONBLOCK does not ensure it on the client's
// ends: it belongs to the open file description, which the server made
// and may still hold, and so may clear at any time. So every read and
// write on a pipe carrier is preadv2/pwritev2 at the current offset with
// RWF_NOWAIT, which is per call (Linux 6.x; pipesNoWait checks the
// kernel has it, else neither side offers pipes).

// nowaitRead reads p from the pipe end fd without waiting: EAGAIN when it
// is empty, whatever its O_NONBLOCK.
func nowaitRead(fd uintptr, p []byte) (int, error) {
	iov := syscall.Iovec{Base: &p[0]}
	iov.SetLen(len(p))
	for {
		r, e := nowaitRW(unix.SYS_PREADV2, fd, &iov, 1)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return r, nil
	}
}

// nowaitWritev writes vec to the pipe end fd without waiting: EAGAIN
// when it is full, whatever its O_NONBLOCK.
func nowaitWritev(fd uintptr, vec []syscall.Iovec) (int, syscall.Errno) {
	return nowaitRW(unix.SYS_PWRITEV2, fd, &vec[0], len(vec))
}

func nowaitRW(trap, fd uintptr, iov *syscall.Iovec, n int) (int, syscall.Errno) {
	// Offset -1: the file's own position, which a pipe has not. As
	// x/sys/unix's offs2lohi, for either word size.
	const longBits = 32 << (^uintptr(0) >> 63)
	off := int64(-1)
	r, _, e := syscall.RawSyscall6(trap, fd, uintptr(unsafe.Pointer(iov)), uintptr(n),
		uintptr(off), uintptr(uint64(off)>>(longBits-1)>>1), unix.RWF_NOWAIT)
	return int(r), e
}

// pipesNoWait reports whether this kernel takes RWF_NOWAIT on a pipe: a
// read of an empty pipe says EAGAIN, not EOPNOTSUPP (the probe's pipe is
// O_NONBLOCK too, so the probe itself never waits).
var pipesNoWait = sync.OnceValue(func() bool {
	var p [2]int
	if unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK) != nil {
		return false
	}
	defer closeFDs(p[0], p[1])
	var b [1]byte
	_, err := nowaitRead(uintptr(p[0]), b[:])
	return errors.Is(err, syscall.EAGAIN)
})
