package fs

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRestartReopensByIdentity: the server restarts under a mount with
// files open. An open file keeps reading the same file, renamed or not; a
// file replaced while the server was down is ESTALE on the old descriptor,
// never the new file's data; a descriptor whose locks the restart lost
// fails its I/O and lock calls with EIO, while a new open works.
func TestRestartReopensByIdentity(t *testing.T) {
	share, mnt, srv := reconnectMount(t, 20*time.Second, nil)
	for name, content := range map[string]string{"keep": "same file", "moved": "renamed away", "swap": "old file", "locked": "lockedfile"} {
		if err := os.WriteFile(filepath.Join(share, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	open := func(name string) *os.File {
		f, err := os.OpenFile(filepath.Join(mnt, name), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	keep, moved, swap, locked := open("keep"), open("moved"), open("swap"), open("locked")
	if err := ofd(locked, unix.F_WRLCK, 0, 0, false); err != nil {
		t.Fatal(err)
	}

	srv.Close()
	// While it is down, a local process renames one file and replaces
	// another with a new file under the same name.
	if err := os.Rename(filepath.Join(share, "moved"), filepath.Join(share, "moved.old")); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(share, "swap"))
	if err := os.WriteFile(filepath.Join(share, "swap"), []byte("NEW FILE"), 0o644); err != nil {
		t.Fatal(err)
	}
	serve(t, share, srv.SessionAddr(), srv.Listeners()[0].Addr, nil)

	read := func(f *os.File) (string, error) {
		buf := make([]byte, 64)
		n, err := f.ReadAt(buf, 0)
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return string(buf[:n]), err
	}
	if got, err := read(keep); err != nil || got != "same file" {
		t.Errorf("open file after the restart: %q %v", got, err)
	}
	if got, err := read(moved); err != nil || got != "renamed away" {
		t.Errorf("file renamed during the restart: %q %v, want its data", got, err)
	}
	if got, err := read(swap); !errors.Is(err, syscall.ESTALE) {
		t.Errorf("file replaced during the restart: %q %v, want ESTALE (not the new file's data)", got, err)
	}
	if _, err := read(locked); !errors.Is(err, syscall.EIO) {
		t.Errorf("read through a descriptor whose locks were lost: %v, want EIO", err)
	}
	if err := ofd(locked, unix.F_UNLCK, 0, 0, false); !errors.Is(err, syscall.EIO) {
		t.Errorf("unlock through a descriptor whose locks were lost: %v, want EIO", err)
	}
	again := open("locked")
	if got, err := read(again); err != nil || got != "lockedfile" {
		t.Errorf("a new open of the file: %q %v", got, err)
	}
	if err := ofd(again, unix.F_WRLCK, 0, 0, false); err != nil {
		t.Errorf("a lock through the new open: %v", err)
	}
}

// TestRestartLosesLocksLeftByPartialUnlock: a descriptor that unlocked part
// of what it locked still holds the rest, so when the server restarts and
// loses it, the descriptor's I/O fails with EIO as for any lost lock.
func TestRestartLosesLocksLeftByPartialUnlock(t *testing.T) {
	share, mnt, srv := reconnectMount(t, 20*time.Second, nil)
	if err := os.WriteFile(filepath.Join(share, "f"), []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(mnt, "f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := ofd(f, unix.F_WRLCK, 0, 10, false); err != nil {
		t.Fatal(err)
	}
	if err := ofd(f, unix.F_UNLCK, 0, 5, false); err != nil { // bytes 5..9 stay locked
		t.Fatal(err)
	}
	srv.Close()
	serve(t, share, srv.SessionAddr(), srv.Listeners()[0].Addr, nil)
	if _, err := f.ReadAt(make([]byte, 10), 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("read through a descriptor whose remaining lock was lost: %v, want EIO", err)
	}
}
