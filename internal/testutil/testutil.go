// Package testutil holds the few test helpers that tests in several
// packages need alike: stat that fails the test, polling for a condition,
// a directory every local user can reach, random bytes, a context bounded
// by the test, a TCP relay for tests that watch, change or cut a
// connection's bytes, a command a test stops with SIGINT (Interruptible),
// and the logger LWIO_TEST_LOG turns on. It is for tests only: _test.go files and the test rigs
// (test/hostile/rig).
package testutil

import (
	"context"
	"crypto/rand"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Stat is unix.Stat of p (links followed); the test fails if it fails.
func Stat(t testing.TB, p string) unix.Stat_t {
	t.Helper()
	return stat(t, p, unix.Stat)
}

// Lstat is unix.Lstat of p (a link itself); the test fails if it fails.
func Lstat(t testing.TB, p string) unix.Stat_t {
	t.Helper()
	return stat(t, p, unix.Lstat)
}

func stat(t testing.TB, p string, f func(string, *unix.Stat_t) error) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := f(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// Eventually polls cond until it holds, failing the test ("what: not seen
// within d") if it does not within d. It polls often at first and backs
// off to every 50ms, so a cond that runs a program stays cheap.
func Eventually(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen within %v", what, d)
		}
		time.Sleep(pause)
	}
}

// PublicDir is a fresh directory named prefix* that every local user can
// reach (t.TempDir()'s cannot: its parent is 0700), removed when the test
// ends.
func PublicDir(t testing.TB, prefix string) string {
	t.Helper()
	d, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// RandBytes is n random bytes (crypto/rand, which does not fail).
func RandBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// Context is a context that ends after d or when the test ends.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
