package test

import (
	"path/filepath"
	"testing"
)

// TestReadInPlace: a mount on the server's host gets its large O_DIRECT
// READs read straight into its memory (lwio_reads_in_place_total moves),
// for a root mount and for an ordinary account's, with the bytes right;
// a server without shared memory serves the same bytes through its own
// buffer and reads nothing in place.
func TestReadInPlace(t *testing.T) {
	needFUSE(t)
	inPlace := func(t *testing.T, metrics string) float64 {
		t.Helper()
		return scrapeMetrics(t, metrics)["lwio_reads_in_place_total"]
	}
	t.Run("root", func(t *testing.T) {
		metrics := freeAddr(t)
		s := startServer(t, ServerConfig{Args: []string{"-metrics", metrics}})
		m := mountShare(t, s, MountConfig{Options: []string{"noleases"}})
		directIO(t, filepath.Join(m.Dir, "big"), 8<<20)
		if n := inPlace(t, metrics); n < 8 {
			t.Fatalf("%v READs read in place, want the 8 MiB read's", n)
		}
	})
	t.Run("ordinary account", func(t *testing.T) {
		acct, m, share, metrics := accountMount(t)
		directIO(t, filepath.Join(m.Dir, "big"), 8<<20)
		if uid, _ := ownerOnDisk(t, filepath.Join(share, "big")); uid != acct.uid {
			t.Fatalf("the file is owned by %d, want the account's %d: the test proves nothing", uid, acct.uid)
		}
		if n := inPlace(t, metrics); n < 8 {
			t.Fatalf("%v READs read in place, want the 8 MiB read's", n)
		}
	})
	t.Run("server without shared memory", func(t *testing.T) {
		metrics := freeAddr(t)
		s := startServer(t, ServerConfig{Env: []string{"LWIO_SOFT_NOSHM=1"}, Args: []string{"-metrics", metrics}})
		m := mountShare(t, s, MountConfig{Options: []string{"noleases"}})
		directIO(t, filepath.Join(m.Dir, "big"), 8<<20)
		if n := inPlace(t, metrics); n != 0 {
			t.Fatalf("%v READs read in place without shared memory", n)
		}
	})
}
