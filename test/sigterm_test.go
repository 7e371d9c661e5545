package test

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestServerSIGTERMAsSoonAsItListens: a SIGTERM sent the moment the server
// accepts connections (a service manager stopping it right after a start or
// a restart, a test's cleanup after a quick crashAndRestart) stops it
// cleanly, exit 0. The server used to listen first and take SIGTERM only
// after logging its start; a SIGTERM in between killed it (seen as
// "lwio-server on SIGTERM: signal: terminated" after
// TestRestartExecsHoldingNoMountFile beside CPU hogs).
func TestServerSIGTERMAsSoonAsItListens(t *testing.T) {
	needLWIO(t)
	for round := range 20 {
		addr := freeAddr(t)
		args := []string{"-listen", addr, "-soft", freeAddr(t), "-user", testUser, "-account", "root", "-allow-root",
			"-state-dir", filepath.Join(t.TempDir(), "state"), "-share", "share=" + t.TempDir()}
		p := startProcAs(t, "lwio-server", nil, []string{"LWIO_PASSWORD=" + testPassword}, binaries.server, args...)
		t.Cleanup(func() { _ = p.stop() })
		deadline := time.Now().Add(readyTimeout)
		for { // no pause: the SIGTERM goes as soon as the port answers
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				break
			}
			if p.exited() || time.Now().After(deadline) {
				t.Fatalf("lwio-server did not listen on %s:\n%s", addr, p.out)
			}
		}
		if err := p.stop(); err != nil {
			t.Fatalf("round %d: SIGTERM as the server began to listen: %v (want exit 0)\n%s", round, err, p.out)
		}
	}
}
