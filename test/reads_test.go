package test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Large reads through a mount (issue 16 item 4): 1 MiB O_DIRECT reads are
// one request each and answered whole, buffered reads get the 1 MiB
// readahead window the mount sets on its backing device, and go-fuse
// never logs a failed splice (it used to, "trySplice: … max pipe size",
// on every 1 MiB reply).
func TestLargeReads(t *testing.T) {
	needFUSE(t)
	s := startServer(t, ServerConfig{})
	m := mountShare(t, s, MountConfig{})
	data := pattern(21, 4<<20+100)
	if err := os.WriteFile(filepath.Join(m.Backing, "big"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(m.Dir, "big")

	t.Run("direct", func(t *testing.T) {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		buf := alignedBuf(t, 1<<20)
		for off := 0; off < len(data); off += len(buf) {
			n, err := unix.Pread(fd, buf, int64(off))
			want := data[off:min(off+len(buf), len(data))]
			if err != nil || n != len(want) || !bytes.Equal(buf[:n], want) {
				t.Fatalf("O_DIRECT pread of 1 MiB at %d: %d bytes, %v", off, n, err)
			}
		}
	})
	t.Run("buffered", func(t *testing.T) {
		wantContent(t, path, data)
	})
	t.Run("readahead", func(t *testing.T) {
		var st unix.Stat_t
		if err := unix.Stat(m.Dir, &st); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev)))
		if err != nil {
			t.Skipf("no backing-device setting to check: %v", err)
		}
		if got := strings.TrimSpace(string(b)); got != "1024" {
			t.Errorf("the mount's read_ahead_kb is %s, want 1024 (1 MiB)", got)
		}
	})
	if out := m.p.out.String(); strings.Contains(out, "trySplice") {
		t.Errorf("lwio-mount logged a failed splice:\n%s", tail(out, 2000))
	}
}
