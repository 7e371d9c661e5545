package test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// tapProxy relays TCP connections to a server and records every byte in
// each direction: what a wire capture between the mount and the server's
// session or softrdma port would see.
type tapProxy struct {
	Addr     string
	mu       sync.Mutex
	c2s, s2c bytes.Buffer
}

func startTapProxy(t *testing.T, server string) *tapProxy {
	return startTapProxyFunc(t, func() string { return server })
}

// startTapProxyFunc relays to server(), asked at each connection: the
// softrdma proxy starts before the server whose port it relays to.
func startTapProxyFunc(t *testing.T, server func() string) *tapProxy {
	t.Helper()
	p := &tapProxy{}
	var wg sync.WaitGroup
	// Registered first, so it runs after the relay has stopped accepting.
	t.Cleanup(wg.Wait)
	p.Addr = testutil.RelayFunc(t, server, func(cc, sc net.Conn) {
		wg.Add(2)
		go func() { defer wg.Done(); p.pump(sc, cc, &p.c2s) }()
		go func() { defer wg.Done(); p.pump(cc, sc, &p.s2c) }()
	})
	return p
}

func (p *tapProxy) pump(dst, src net.Conn, rec *bytes.Buffer) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			rec.Write(buf[:n])
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *tapProxy) seen(marker string) (c2s, s2c bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.c2s.Bytes(), []byte(marker)), bytes.Contains(p.s2c.Bytes(), []byte(marker))
}

// mountVia mounts share of s through the session address addr (a proxy),
// without checkDataPath: the tests check the data path themselves.
func mountVia(t *testing.T, s *Server, addr, share string, opts ...string) (*Mount, *proc) {
	t.Helper()
	mnt := t.TempDir()
	o := append([]string{"username=" + testUser, "completion=interrupt"}, opts...)
	p := startProc(t, "lwio-mount", []string{"LWIO_PASSWORD=" + testPassword}, binaries.mount,
		"//"+addr+"/"+share, mnt, "-o", strings.Join(o, ","))
	return waitMounted(t, p, mnt, s.Shares[share]), p
}

// writeMarker puts marker in a file name and in file data through the
// mount in the three ways data leaves a mount — a small buffered write, a
// large buffered write, an O_DIRECT write — reads the data back (O_DIRECT,
// so it crosses the wire) and lists the directory.
func writeMarker(t *testing.T, m *Mount, marker string) {
	t.Helper()
	small := filepath.Join(m.Dir, "small-"+marker)
	mustWrite(t, small, []byte(marker+"\n"))
	big := bytes.Repeat([]byte(marker+"."), (1<<20)/(len(marker)+1))
	mustWrite(t, filepath.Join(m.Dir, "big-"+marker), big)
	direct := filepath.Join(m.Dir, "direct-"+marker)
	buf := alignedBuf(t, 64<<10)
	for i := 0; i < len(buf); i += copy(buf[i:], marker+"|") {
	}
	f, err := os.OpenFile(direct, os.O_CREATE|os.O_RDWR|syscall.O_DIRECT, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(buf, 0); err != nil {
		t.Fatalf("O_DIRECT write: %v", err)
	}
	got := alignedBuf(t, len(buf))
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("O_DIRECT read back: %v", err)
	}
	wantContent(t, small, []byte(marker+"\n"))
	wantOnDisk(t, filepath.Join(m.Backing, "big-"+marker), big)
	if ents, err := os.ReadDir(m.Dir); err != nil || len(ents) != 3 {
		t.Fatalf("ReadDir: %v %v", ents, err)
	}
}

// TestSealedMount: with sealing, a marker written and read through a mount
// — in file names, buffered, large and O_DIRECT data — never appears in the
// bytes between the mount and the server, on the session channel or on the
// softrdma data connections (the server advertises a recording proxy for
// them, listen.softrdma_advertise); without it, it does.
func TestSealedMount(t *testing.T) {
	needFUSE(t)
	for _, tc := range []struct {
		name     string
		server   []string
		share    string
		opts     []string
		sealed   bool
		dataPath string // the data path the mount must report: "session", or "lwio…"
	}{
		// Unsealed, the capture must see the marker on whichever channel
		// carries the data, which shows the capture works.
		{"unsealed session channel", nil, "share", []string{"provider=none"}, false, "session"},
		{"unsealed softrdma", nil, "share", []string{"provider=softrdma"}, false, "lwio"},
		{"mount -o seal", nil, "share", []string{"seal"}, true, "lwio"},
		{"mount -o seal, session channel", nil, "share", []string{"seal", "provider=none"}, true, "session"},
		{"server -encrypt desired", []string{"-encrypt", "desired"}, "share", nil, true, "lwio"},
		{"share encrypt = required", nil, "secret", []string{"provider=softrdma"}, true, "lwio"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, secret := t.TempDir(), t.TempDir()
			var softAddr atomic.Value // the server's softrdma address, once it listens
			soft := startTapProxyFunc(t, func() string { a, _ := softAddr.Load().(string); return a })
			conf := filepath.Join(t.TempDir(), "server.toml")
			mustWrite(t, conf, []byte("[listen]\nsoftrdma_advertise = [\""+soft.Addr+"\"]\n"+
				"[shares.secret]\npath = \""+secret+"\"\nencrypt = \"required\"\n"))
			// On TCP: the same-host unix socket would go around the proxy.
			s := startServer(t, ServerConfig{Shares: map[string]string{"share": dir},
				Args: append([]string{"-config", conf}, tc.server...), Env: []string{"LWIO_SOFT_TCP=1"}})
			softAddr.Store(s.Soft)
			s.Shares["secret"] = secret
			sess := startTapProxy(t, s.Addr)
			m, mp := mountVia(t, s, sess.Addr, tc.share, tc.opts...)
			marker := "MARKER-c1f2e3-" + strings.ReplaceAll(strings.ReplaceAll(tc.name, " ", "_"), ",", "")
			writeMarker(t, m, marker)
			c2s, s2c := sess.seen(marker)
			dc2s, ds2c := soft.seen(marker)
			if tc.sealed && (c2s || s2c || dc2s || ds2c) {
				t.Errorf("sealed, yet the marker is on the wire: session mount→server %v, server→mount %v; softrdma %v, %v", c2s, s2c, dc2s, ds2c)
			}
			if !tc.sealed && !((c2s || dc2s) && (s2c || ds2c)) {
				t.Errorf("unsealed, yet the marker is not on the wire both ways (session %v, %v; softrdma %v, %v): the capture is broken", c2s, s2c, dc2s, ds2c)
			}
			soft.mu.Lock()
			softBytes := soft.c2s.Len() + soft.s2c.Len()
			soft.mu.Unlock()
			if onSoft := softBytes > 1<<20; onSoft != (tc.dataPath == "lwio") {
				t.Errorf("%d bytes crossed the softrdma proxy; want the data there: %v", softBytes, tc.dataPath == "lwio")
			}
			out := mp.out.String()
			if !strings.Contains(out, "data_path="+tc.dataPath) {
				t.Errorf("lwio-mount does not report data_path=%s:\n%s", tc.dataPath, out)
			}
			if tc.sealed != strings.Contains(out, "session channel sealed") {
				t.Errorf("lwio-mount's log does not say whether the session is sealed (want sealed=%v):\n%s", tc.sealed, out)
			}
		})
	}
}

// TestSealRefusals: a mount that requires sealing from a server that will
// not seal, and a share that requires sealing on a server whose encrypt is
// off, fail with one clear line (and the server says why in its log).
func TestSealRefusals(t *testing.T) {
	needFUSE(t)
	dir, secret := t.TempDir(), t.TempDir()
	conf := filepath.Join(t.TempDir(), "server.toml")
	mustWrite(t, conf, []byte("[shares.secret]\npath = \""+secret+"\"\nencrypt = \"required\"\n"))
	s := startServer(t, ServerConfig{Shares: map[string]string{"share": dir}, Args: []string{"-config", conf, "-encrypt", "off"}})
	for _, tc := range []struct {
		name, share, opts, want, serverLog string
	}{
		{"mount -o seal, server -encrypt off", "share", "seal", "requires sealing", "client requires sealing"},
		{"share requires, server -encrypt off", "secret", "", `share "secret" requires sealing`, "tree connect refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := mountFails(t, s.URL(tc.share), tc.opts)
			if !strings.Contains(msg, tc.want) {
				t.Errorf("lwio-mount says %q, want it to say %q", msg, tc.want)
			}
			if !strings.Contains(s.p.out.String(), tc.serverLog) {
				t.Errorf("lwio-server's log does not say %q:\n%s", tc.serverLog, s.p.out)
			}
		})
	}
}

// mountFails runs lwio-mount, which must fail quickly with one line on
// stderr and leave nothing mounted; it returns that line.
func mountFails(t *testing.T, url, opts string) string {
	t.Helper()
	mnt := t.TempDir()
	o := "username=" + testUser
	if opts != "" {
		o += "," + opts
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binaries.mount, url, mnt, "-o", o)
	cmd.Env = append(os.Environ(), "LWIO_PASSWORD="+testPassword)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	err := cmd.Run()
	if fuseMounted(mnt) {
		forceUnmount(mnt)
		t.Errorf("a failed mount left %s mounted", mnt)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() <= 0 {
		t.Fatalf("lwio-mount: %v, want a non-zero exit; stderr: %s", err, stderr.String())
	}
	msg := strings.TrimSpace(stderr.String())
	if strings.Count(msg, "\n") != 0 || msg == "" {
		t.Errorf("stderr is not one line: %q", msg)
	}
	t.Logf("stderr: %s", msg)
	return msg
}
