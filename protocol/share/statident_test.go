package share

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestStatIdentIsFstat: the attributes an open answers with, read with
// statx (statIdent), are those fstat(2) reports, field by field — a
// hard-linked, non-empty file, so that nlink, size and blocks are not
// their defaults.
func TestStatIdentIsFstat(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, make([]byte, 10000), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(p, filepath.Join(dir, "g")); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(p, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	got, id, err := statIdent(fd)
	if err != nil {
		t.Fatal(err)
	}
	var want unix.Stat_t
	if err := unix.Fstat(fd, &want); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("statIdent = %+v\nfstat     = %+v", got, want)
	}
	if id.dev != want.Dev || id.ino != want.Ino {
		t.Errorf("identity dev %d ino %d; fstat says %d, %d", id.dev, id.ino, want.Dev, want.Ino)
	}
}
