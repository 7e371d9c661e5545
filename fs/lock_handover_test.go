package fs

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol/share"

	"golang.org/x/sys/unix"
)

// TestLockHandOverAfterPostedWrite: mount A writes through LWIO — a write
// posted and not waited for by write(2) —, takes and releases an fcntl
// lock; mount B then takes the lock and reads: it must read A's bytes,
// from its first read after the lock, though it had the old bytes cached
// (it read the file before A wrote). The server's writes take a while
// (slowFile), so a posted write the unlock did not wait for is still in
// flight when B reads. Sizes from one page to a write that goes as
// fragments.
func TestLockHandOverAfterPostedWrite(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	srv := serveWrapped(t, dir, "127.0.0.1:0", "127.0.0.1:0", func(f share.File) share.File {
		return &slowFile{File: f, delay: 40 * time.Millisecond, failAt: -1}
	})
	mount := func() string {
		s := dialed(t, srv.SessionAddr())
		return mountWith(t, s.Tree, s.Data, Options{})
	}
	a, b := mount(), mount()
	const size = 1 << 20
	fa, fb := sharedFile(t, dir, a, b, "data", make([]byte, size))
	for _, n := range []int{4096, 64 << 10, 512 << 10} {
		for round := byte(1); round <= 3; round++ {
			what := fmt.Sprintf("%d bytes, round %d", n, round)
			off := int64(round) * 4096
			old := make([]byte, n)
			if _, err := fb.ReadAt(old, off); err != nil { // B caches the old bytes
				t.Fatal(err)
			}
			if err := ofd(fa, unix.F_WRLCK, size, 1, true); err != nil {
				t.Fatal(err)
			}
			want := bytes.Repeat([]byte{round + byte(n>>12)}, n)
			if _, err := fa.WriteAt(want, off); err != nil {
				t.Fatal(err)
			}
			if err := ofd(fa, unix.F_UNLCK, size, 1, false); err != nil {
				t.Fatal(err)
			}
			if err := ofd(fb, unix.F_WRLCK, size, 1, true); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, n)
			if _, err := fb.ReadAt(got, off); err != nil {
				t.Fatal(err)
			}
			if err := ofd(fb, unix.F_UNLCK, size, 1, false); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				i := 0
				for i < n && got[i] == want[i] {
					i++
				}
				t.Fatalf("%s: B read %#x at byte %d after taking the lock A released, want A's %#x", what, got[i], i, want[i])
			}
		}
	}
}
