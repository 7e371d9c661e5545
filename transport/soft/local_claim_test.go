package soft

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
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

// TestSameHostTCPClosed: once a connection moved to the same-host path,
// neither end keeps its TCP connection open (an fd per connection, and a
// loopback connection the kernel keeps alive for nothing).
func TestSameHostTCPClosed(t *testing.T) {
	// A socket nobody references is closed by its finalizer: no GC
	// here, so an end that forgot its TCP connection shows.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	ln, err := New(Options{}).Listen("127.0.0.1:0", transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cli, srv := conformance.Connect(t, New(Options{}), ln, ln.Addr(), transport.Config{}, 10*time.Second)
	if carrierOf(cli) != CarrierPipeShm || carrierOf(srv) != CarrierPipeShm {
		t.Fatalf("carriers %s/%s, want %s", carrierOf(cli), carrierOf(srv), CarrierPipeShm)
	}
	port := ln.(*listener).ln.Addr().(*net.TCPAddr).Port
	var open []string
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		open = tcpOpen(t, port)
		if len(open) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(open) > 0 {
		t.Fatalf("TCP connections of port %d still open after the move: %v", port, open)
	}
}

// tcpOpen lists the IPv4 TCP sockets of this network namespace with port
// at either end, in a state where this end has not closed (neither
// listening nor TIME_WAIT nor CLOSE): /proc/net/tcp's st column.
func tcpOpen(t *testing.T, port int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Skip(err)
	}
	hexPort := fmt.Sprintf(":%04X", port)
	var open []string
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 4 || !(strings.HasSuffix(f[1], hexPort) || strings.HasSuffix(f[2], hexPort)) {
			continue
		}
		switch f[3] {
		case "0A", "06", "07": // LISTEN, TIME_WAIT, CLOSE
		default:
			open = append(open, f[1]+"->"+f[2]+" st "+f[3])
		}
	}
	return open
}
