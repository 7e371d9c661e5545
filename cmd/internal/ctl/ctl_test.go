package ctl

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

const nobody = 65534

// The helper process: `ctl.test` run as another user calls the socket
// named by LWIO_CTL_CALL and prints the answer or the error.
func TestMain(m *testing.M) {
	if path := os.Getenv("LWIO_CTL_CALL"); path != "" {
		var out string
		if err := Call(path, 0, "echo", "hi", &out); err != nil {
			fmt.Println("error:", err)
		} else {
			fmt.Println("result:", out)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.Out = io.Discard
	return l
}

// publicDir is a socket directory in one other users can reach
// (t.TempDir's are 0700).
func publicDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(testutil.PublicDir(t, "lwio-ctl"), "run")
}

func echoServer(t *testing.T, dir string, allowOther bool) *Server {
	t.Helper()
	s, err := Listen(dir, "0:99", os.Geteuid(), allowOther, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.Handle("echo", func(r Request) (any, error) {
		var v string
		if err := r.Decode(&v); err != nil {
			return nil, err
		}
		return fmt.Sprintf("%s from uid %d", v, r.Peer.Uid), nil
	})
	s.Handle("fail", func(Request) (any, error) { return nil, errors.New("it failed") })
	return s
}

// asUser calls the socket from a process running as uid.
func asUser(t *testing.T, uid uint32, path string) string {
	t.Helper()
	// The test binary's own directory is private to root: run a copy.
	bin := filepath.Join(filepath.Dir(filepath.Dir(path)), "ctl.test")
	if _, err := os.Stat(bin); err != nil {
		b, err := os.ReadFile(os.Args[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), "LWIO_CTL_CALL="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper as uid %d: %v: %s", uid, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestCall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test runs a caller as another user")
	}
	s := echoServer(t, publicDir(t), false)
	if filepath.Base(s.Path()) != "0:99.sock" {
		t.Errorf("socket %s", s.Path())
	}
	var out string
	if err := Call(s.Path(), 0, "echo", "hi", &out); err != nil || out != "hi from uid 0" {
		t.Fatalf("echo: %q, %v", out, err)
	}
	if err := Call(s.Path(), 0, "fail", nil, nil); err == nil || err.Error() != "it failed" {
		t.Errorf("fail: %v", err)
	}
	if err := Call(s.Path(), 0, "nope", nil, nil); err == nil || !strings.Contains(err.Error(), "unknown operation") {
		t.Errorf("unknown op: %v", err)
	}
	// Not allow_other: the socket is 0600, and another user is refused.
	st, _ := os.Stat(s.Path())
	if st.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", st.Mode().Perm())
	}
	if got := asUser(t, nobody, s.Path()); !strings.HasPrefix(got, "error:") {
		t.Errorf("another user on a private mount's socket: %q", got)
	}
	// The caller refuses a socket that is not the mount owner's.
	if err := os.Chown(s.Path(), nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if err := Call(s.Path(), 0, "echo", "hi", &out); err == nil || !strings.Contains(err.Error(), "not a socket of the mount's owner") {
		t.Errorf("a socket of another user was trusted: %v", err)
	}
}

// With allow_other the socket is 0666 and every user may ask; the
// handler sees who asked.
func TestCallAllowOther(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test runs a caller as another user")
	}
	s := echoServer(t, publicDir(t), true)
	if got := asUser(t, nobody, s.Path()); got != fmt.Sprintf("result: hi from uid %d", nobody) {
		t.Errorf("another user on an allow_other mount's socket: %q", got)
	}
}

// A second server for the same mount is refused while the first answers;
// after the first is gone its stale socket is replaced.
func TestListenStale(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	s := echoServer(t, dir, false)
	if _, err := Listen(dir, "0:99", os.Geteuid(), false, quiet()); err == nil {
		t.Fatal("a second endpoint for a live mount was made")
	}
	s.Close()
	if _, err := os.Stat(s.Path()); !os.IsNotExist(err) {
		t.Errorf("socket left after Close: %v", err)
	}
	// A stale file (a crashed mount): replaced.
	if err := os.WriteFile(s.Path(), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s2, err := Listen(dir, "0:99", os.Geteuid(), false, quiet())
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	s2.Close()
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`/mnt/a\040b`: "/mnt/a b", `/x\134y`: `/x\y`, `/plain`: "/plain", `/bad\0`: `/bad\0`} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
