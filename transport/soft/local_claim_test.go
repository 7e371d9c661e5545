package soft

import (
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"

	"github.com/lwiofs/lwiofs/transport"
)

// unixPair is a connected pair of unix stream sockets.
func unixPair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conv := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "unixpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conv(fds[0]), conv(fds[1])
}

// TestSameHostClaimWithdraw: a unix socket that presents its token while
// its hello gives up (deadline, eviction) is either handed to the offer
// before the hello withdraws it, and closed by the withdrawal, or refused;
// never left in the offer with nobody to take it (its fd held until a
// garbage collection, its client on a connection the server forgot).
func TestSameHostClaimWithdraw(t *testing.T) {
	ln, err := New(Options{}).Listen("127.0.0.1:0", transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ll := ln.(*listener).local
	left := 0
	for i := 0; i < 2000; i++ {
		o, po, err := ll.makeOffer()
		if err != nil {
			t.Fatal(err)
		}
		a, b := unixPair(t)
		_, _ = a.Write(o.cli[:])
		done := make(chan struct{})
		go func() { defer close(done); ll.claim(b) }()
		for j := 0; j < i%64; j++ { // move the withdrawal across claim
			runtime.Gosched()
		}
		ll.withdraw(o, po)
		<-done
		if len(po.got) != 0 {
			left++
			(<-po.got).Close()
		}
		a.Close()
	}
	if left > 0 {
		t.Fatalf("%d of 2000 claimed sockets were left in a withdrawn offer", left)
	}
}
