//go:build linux

package soft

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/transport"
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
		srv, err = servePipes(a)
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

// TestTakePipesChecks: the client takes only a pipe's write end and then a
// pipe's read end from the server, and closes whatever else it was sent.
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
		{"a file", []int{int(file.Fd()), b[0]}, false},
		{"one", []int{a[1]}, false},
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
