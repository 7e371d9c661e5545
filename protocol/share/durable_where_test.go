package share

import (
	"os"
	"path/filepath"
	"testing"
)

// An identity without a kernel handle is never "unnamed" (whereIs answers
// whereNot): that is why Reopen searches a directory only with a handle to
// compare what it finds with (isExactly has no other way to tell a file
// from the successor that reused its inode number).
func TestWhereIsNeedsAHandle(t *testing.T) {
	e := durableEnv(t)
	e.writeFile(t, "f", "x")
	fh, err := os.Open(filepath.Join(e.share, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	id, err := statxIdentity(int(fh.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	id.htype, id.handle = 0, nil
	if _, w := e.tr.sh.whereIs(&id); w != whereNot {
		t.Errorf("whereIs of an identity without a handle: %v, want whereNot", w)
	}
}
