//go:build linux

package soft

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
)

// TestSameHostPipes: on pipes, each end reads one pipe and writes the
// other, each at least pipeSize big, or what the system allows.
func TestSameHostPipes(t *testing.T) {
	cli, srv := pair(t, New(Options{}), New(Options{}), transport.Config{})
	want := min(pipeSize, pipeMaxSize())
	for side, c := range map[string]transport.Conn{"client": cli, "server": srv} {
		ps, ok := c.(*conn).nc.(*pipeSock)
		if !ok {
			t.Fatalf("%s: carrier %T, want pipes", side, c.(*conn).nc)
		}
		if !isPipeEnd(int(ps.r.Fd()), unix.O_RDONLY) || !isPipeEnd(int(ps.w.Fd()), unix.O_WRONLY) {
			t.Fatalf("%s: not a pipe's read end and another's write end", side)
		}
		for _, f := range []*os.File{ps.r, ps.w} {
			if n, err := unix.FcntlInt(f.Fd(), unix.F_GETPIPE_SZ, 0); err != nil || n < want {
				t.Errorf("%s: pipe of %d bytes (%v), want ≥ %d", side, n, err, want)
			}
			// A child that inherited an end would keep the pipe open
			// after its parent died: the peer would never see it go.
			if fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
				t.Errorf("%s: a pipe end without FD_CLOEXEC (%v)", side, err)
			}
		}
	}
	sendOne(t, cli, srv)
}

// TestPipePeerClosed: on pipes the unix socket, not a pipe, tells whether
// the peer is there: peerClosed (used while a SEND waits for a receive)
// says no while the peer lives and yes once it closed. A peek at a pipe
// fails, which would read as "closed".
func TestPipePeerClosed(t *testing.T) {
	a, b := unixPair(t)
	errs := make(chan error, 1)
	var srv sock
	go func() {
		var err error
		srv, err = servePipes(a, &pipeSlots{max: 1, want: pipeWant}, logrus.StandardLogger())
		errs <- err
	}()
	cli, err := takePipes(b, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	var w sysWriter
	w.init(cli)
	if w.peerClosed() {
		t.Fatal("peerClosed with the server there")
	}
	_ = srv.Close()
	if !w.peerClosed() {
		t.Fatal("peerClosed false after the server closed")
	}
}

// TestTakePipesChecks: the client takes only a pipe's write end and then
// another pipe's read end from the server, and closes whatever else it was sent.
func TestTakePipesChecks(t *testing.T) {
	var a, b [2]int
	if err := unix.Pipe2(a[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if err := unix.Pipe2(b[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer closeFDs(a[0], a[1], b[0], b[1])
	file, err := os.Create(t.TempDir() + "/f")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	for _, tc := range []struct {
		name string
		fds  []int
		ok   bool
	}{
		{"a write end, a read end", []int{a[1], b[0]}, true},
		{"swapped", []int{b[0], a[1]}, false},
		{"one pipe's two ends", []int{a[1], a[0]}, false},
		{"a file", []int{int(file.Fd()), b[0]}, false},
		{"one", []int{a[1]}, false},
		// The kernel installs no more than the two the client has room
		// for: the third is never its to close.
		{"three", []int{a[1], b[0], b[1]}, true},
		{"none", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, cli := unixPair(t)
			defer srv.Close()
			var oob []byte
			if tc.fds != nil {
				oob = unix.UnixRights(tc.fds...)
			}
			if _, _, err := srv.WriteMsgUnix([]byte{pipeByte}, oob, nil); err != nil {
				t.Fatal(err)
			}
			before := openFDs(t)
			s, err := takePipes(cli, time.Now().Add(5*time.Second))
			if (err == nil) != tc.ok {
				t.Fatalf("takePipes: %v, want ok %v", err, tc.ok)
			}
			if s != nil {
				_ = s.Close()
			} else {
				_ = cli.Close()
			}
			// The fds received were closed either way (and the socket).
			if after := openFDs(t); after > before-1 {
				t.Errorf("%d fds open after, %d before: what was received is left open", after, before)
			}
		})
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestPipesServerClearsNonblock: a hostile server keeps the client's pipe
// ends it sent and clears their O_NONBLOCK (it shares their open file
// descriptions). The client's raw reads and writes must still never wait
// in the kernel: a raw system call that blocked would hold its P, and the
// next stop of the world would hang the whole mount process.
func TestPipesServerClearsNonblock(t *testing.T) {
	if !pipesNoWait() {
		t.Skip("this kernel's pipes take no RWF_NOWAIT: pipes are never used")
	}
	a, b := unixPair(t)
	var up, down [2]int
	if err := unix.Pipe2(up[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if err := unix.Pipe2(down[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer closeFDs(up[0], up[1], down[0], down[1]) // the server's copies, kept
	if _, _, err := a.WriteMsgUnix([]byte{pipeByte}, unix.UnixRights(up[1], down[0]), nil); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	cli, err := takePipes(b, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for _, fd := range []int{up[1], down[0]} { // after takePipes set them non-blocking
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, 0); err != nil {
			t.Fatal(err)
		}
	}
	within := func(what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { defer close(done); f() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s waited in the kernel on a pipe whose O_NONBLOCK the server cleared", what)
		}
	}
	var r sysReader
	r.init(cli)
	within("a try read of the empty pipe", func() {
		if _, err := r.tryRead(make([]byte, 64)); !errors.Is(err, syscall.EAGAIN) {
			t.Errorf("tryRead of an empty pipe: %v, want EAGAIN", err)
		}
	})
	var w sysWriter
	w.init(cli)
	buf := make([]byte, 1<<20)
	within("writev to a full pipe", func() {
		for i := 0; ; i++ {
			_, err := w.writev([][]byte{buf})
			if errors.Is(err, syscall.EAGAIN) {
				return
			}
			if err != nil || i > 64 {
				t.Errorf("writev: %v after %d writes, want EAGAIN once full", err, i)
				return
			}
		}
	})
	// Read and Write wait in the poller, not the kernel: a deadline ends them.
	_ = cli.SetDeadline(time.Now().Add(100 * time.Millisecond))
	within("Read of the empty pipe", func() {
		if _, err := cli.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("Read: %v, want the deadline", err)
		}
	})
	within("Write to the full pipe", func() {
		if _, err := cli.Write(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("Write: %v, want the deadline", err)
		}
	})
}

// TestPipeSlots: the server makes pipes before any authentication and its
// user pays for them, so a listener has at most pipeConns connections on
// pipes; more (an unauthenticated peer's, say) stay on the unix socket and
// work, and a closed connection gives its slot back.
func TestPipeSlots(t *testing.T) {
	cp, sp := New(Options{}), New(Options{})
	sp.pipeConns = 2
	ln, err := sp.Listen("127.0.0.1:0", transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	connect := func(want string) (cli, srv transport.Conn) {
		t.Helper()
		cli, srv = conformance.Connect(t, cp, ln, ln.Addr(), transport.Config{}, 10*time.Second)
		if a, b := carrierOf(cli), carrierOf(srv); a != want || b != want {
			t.Fatalf("carriers %s/%s, want %s", a, b, want)
		}
		sendOne(t, cli, srv)
		return cli, srv
	}
	c1, s1 := connect(CarrierPipeShm)
	c2, s2 := connect(CarrierPipeShm)
	c3, s3 := connect(CarrierShm) // no slot left
	closeBoth(t, c1, s1)
	c4, s4 := connect(CarrierPipeShm) // c1's slot
	c5, s5 := connect(CarrierShm)
	for _, p := range [][2]transport.Conn{{c2, s2}, {c3, s3}, {c4, s4}, {c5, s5}} {
		closeBoth(t, p[0], p[1])
	}
	if n := ln.(*listener).pipes.n.Load(); n != 0 {
		t.Fatalf("%d pipe slots taken with every connection closed", n)
	}
}

// TestPipeBudgetSpent: when the server's user has spent its pipe budget
// (fs.pipe-user-pages-soft) a new pipe has two pages and cannot grow; the
// connection then stays on the unix socket rather than crawl through
// 8 KiB pipes. The test asks for more than any pipe gets.
func TestPipeBudgetSpent(t *testing.T) {
	cp := New(Options{NoSharedMemory: true})
	connect := func(sp *Provider) (cli, srv transport.Conn, ln transport.Listener) {
		ln, err := sp.Listen("127.0.0.1:0", transport.Config{})
		if err != nil {
			t.Fatal(err)
		}
		cli, srv = conformance.Connect(t, cp, ln, ln.Addr(), transport.Config{}, 10*time.Second)
		return cli, srv, ln
	}
	// What a connection on the unix socket holds open, to compare with.
	cli, srv, ln := connect(New(Options{NoPipes: true}))
	want := openFDs(t)
	closeBoth(t, cli, srv)
	_ = ln.Close()
	sp := New(Options{})
	sp.pipeWant = func() int { return 1 << 30 }
	cli, srv, ln = connect(sp)
	defer ln.Close()
	defer closeBoth(t, cli, srv)
	if a, b := carrierOf(cli), carrierOf(srv); a != CarrierUnix || b != CarrierUnix {
		t.Fatalf("carriers %s/%s, want %s", a, b, CarrierUnix)
	}
	sendOne(t, cli, srv)
	writeOne(t, srv, cli)
	// The pipes made and dropped left no descriptor open.
	if got := openFDs(t); got > want {
		t.Errorf("%d descriptors open, %d with a connection that never had pipes", got, want)
	}
}
