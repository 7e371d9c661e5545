package testutil

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fatalTB records Fatalf instead of failing the test, and panics to stop
// the caller as t.Fatal would; fails recovers it.
type fatalTB struct {
	testing.TB
	msg string
}

type fatal struct{}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(fatal{})
}

func fails(f func()) (failed bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(fatal); !ok {
				panic(r)
			}
			failed = true
		}
	}()
	f()
	return false
}

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, "the third poll", 10*time.Second, func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("cond ran %d times, want 3", n)
	}
	tb := &fatalTB{TB: t}
	if !fails(func() { Eventually(tb, "never", 20*time.Millisecond, func() bool { return false }) }) {
		t.Fatal("Eventually of a cond that never holds did not fail")
	}
	if want := "never: not seen within 20ms"; tb.msg != want {
		t.Errorf("message %q, want %q", tb.msg, want)
	}
}

func TestStat(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	l := filepath.Join(dir, "l")
	if err := os.Symlink("f", l); err != nil {
		t.Fatal(err)
	}
	if st := Stat(t, l); st.Size != 5 {
		t.Errorf("Stat of a link to 5 bytes: size %d", st.Size)
	}
	if st := Lstat(t, l); st.Size != 1 {
		t.Errorf("Lstat of a link to \"f\": size %d, want 1", st.Size)
	}
}

func TestPublicDir(t *testing.T) {
	d := PublicDir(t, "testutil-")
	fi, err := os.Stat(d)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o755 || !strings.HasPrefix(filepath.Base(d), "testutil-") {
		t.Errorf("%s: %v", d, fi.Mode())
	}
}

// TestLoopbackAddr: the port is free and below the ephemeral range, where
// no outgoing connection can take it.
func TestLoopbackAddr(t *testing.T) {
	lo, hi := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fmt.Sscan(string(b), &lo, &hi)
	}
	addr := LoopbackAddr(t)
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.Atoi(port); n < 1024 || n >= lo {
		t.Errorf("%s: port outside [1024, %d)", addr, lo)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("%s is not free: %v", addr, err)
	}
	l.Close()
}

func TestRandBytes(t *testing.T) {
	a, b := RandBytes(32), RandBytes(32)
	if len(a) != 32 || string(a) == string(b) {
		t.Fatalf("RandBytes(32) twice: %x, %x", a, b)
	}
}

func TestContextEndsWithTest(t *testing.T) {
	var ctx interface{ Err() error }
	t.Run("inner", func(t *testing.T) {
		ctx = Context(t, time.Hour)
		if ctx.Err() != nil {
			t.Fatalf("fresh context: %v", ctx.Err())
		}
	})
	if ctx.Err() == nil {
		t.Fatal("context still live after its test ended")
	}
}
