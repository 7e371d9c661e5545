package testutil

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// LoopbackAddr returns a 127.0.0.1 address whose port nothing listened on
// a moment ago, for a server a test restarts on the same address. The
// port is below the kernel's ephemeral range (ip_local_port_range), so no
// outgoing connection can hold it as its source port while the server is
// down: a client reconnecting in that window once took a killed server's
// port that way, and the restarted server's bind failed with "address
// already in use". Another process may still take the port first.
func LoopbackAddr(t testing.TB) string {
	t.Helper()
	lo := 32768 // the kernel's default start of the range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 2048 {
				lo = n
			}
		}
	}
	for range 200 {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(1024+rand.IntN(lo-1024))))
		if err != nil {
			continue // taken: try another
		}
		l.Close()
		return l.Addr().String()
	}
	t.Fatal("no free loopback port below the ephemeral range")
	return ""
}
