//go:build linux

package soft

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
)

// envPipePeer makes the test binary, re-executed by TestPipePeerKilled,
// the peer: "dial ADDR" or "listen".
const envPipePeer = "SOFT_TEST_PIPE_PEER"

// TestPipePeerKilled: the peer process dies (SIGKILL: the server, or the
// mount) with a receive posted on the other side. On pipes, as on the
// socket, the survivor notices at once: its receive is flushed within a
// second, and it does not wait for a timeout.
func TestPipePeerKilled(t *testing.T) {
	if mode := os.Getenv(envPipePeer); mode != "" {
		pipePeer(mode)
		return
	}
	for _, killed := range []string{"server", "client"} {
		t.Run(killed, func(t *testing.T) {
			p := New(Options{})
			var cmd *exec.Cmd
			var c transport.Conn
			start := func(mode string) *bufio.Scanner {
				cmd = exec.Command(os.Args[0], "-test.run=^TestPipePeerKilled$")
				cmd.Env = append(os.Environ(), envPipePeer+"="+mode)
				cmd.Stderr = os.Stderr
				out, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
				return bufio.NewScanner(out)
			}
			var lines *bufio.Scanner
			if killed == "server" {
				lines = start("listen")
				if !lines.Scan() {
					t.Fatal("the server said nothing")
				}
				var err error
				c, err = p.Dial(context.Background(), lines.Text(), transport.Config{})
				if err != nil {
					t.Fatal(err)
				}
			} else {
				ln, err := p.Listen("127.0.0.1:0", transport.Config{})
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				lines = start("dial " + ln.Addr())
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if c, err = ln.Accept(ctx); err != nil {
					t.Fatal(err)
				}
			}
			defer c.Close()
			if got := carrierOf(c); got != CarrierPipeShm {
				t.Fatalf("carrier %s, want %s", got, CarrierPipeShm)
			}
			buf := mustAlloc(t, c, 4096, transport.AccessLocal)
			if err := c.PostRecv(transport.RecvWR{ID: 7, Buf: transport.Segment{Region: buf, Length: 4096}}); err != nil {
				t.Fatal(err)
			}
			if !lines.Scan() || lines.Text() != "ready" {
				t.Fatalf("the peer did not get ready: %q", lines.Text())
			}
			_ = cmd.Process.Kill()
			killedAt := time.Now()
			if wc := waitOne(t, c, 5*time.Second); wc.ID != 7 || wc.Status == transport.StatusSuccess {
				t.Fatalf("after the kill: %+v, want the receive flushed", wc)
			}
			if d := time.Since(killedAt); d > time.Second {
				t.Fatalf("the receive was flushed %v after the kill", d)
			}
		})
	}
}

// pipePeer is the re-executed peer: it connects, posts a receive, says
// "ready" and waits to be killed.
func pipePeer(mode string) {
	p := New(Options{})
	var c transport.Conn
	var err error
	if addr, ok := strings.CutPrefix(mode, "dial "); ok {
		c, err = p.Dial(context.Background(), addr, transport.Config{})
	} else {
		var ln transport.Listener
		if ln, err = p.Listen("127.0.0.1:0", transport.Config{}); err == nil {
			fmt.Println(ln.Addr())
			c, err = ln.Accept(context.Background())
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pipe peer:", err)
		os.Exit(1)
	}
	r, err := c.Domain().Alloc(4096, transport.AccessLocal)
	if err == nil {
		err = c.PostRecv(transport.RecvWR{ID: 1, Buf: transport.Segment{Region: r, Length: 4096}})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pipe peer:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	select {}
}
