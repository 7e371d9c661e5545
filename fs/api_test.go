package fs

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestSessionDataFile: the session channel's data file has every DataFile
// method a mount calls: ReadBuf lands in dest and says end of file as
// LWIO's does, WriteV writes each page, Cancel has nothing to cancel.
func TestSessionDataFile(t *testing.T) {
	dir := t.TempDir()
	tree := newDirTree(dir)
	ctx := context.Background()
	h, _, err := tree.Open(ctx, "f", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	df, err := SessionDataPath(tree).Attach(ctx, h, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := df.WriteV(ctx, [][]byte{[]byte("abcd"), []byte("efgh"), []byte("ij")}, 2); n != 10 || err != nil {
		t.Fatalf("WriteV: %d %v", n, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "\x00\x00abcdefghij" {
		t.Fatalf("file holds %q", b)
	}
	dest := make([]byte, 8)
	b, err := df.ReadBuf(ctx, dest, 6)
	if err != nil || string(b.Bytes()) != "efghij" || &b.Bytes()[0] != &dest[0] {
		t.Fatalf("ReadBuf short of the end: %v, want efghij in dest", err)
	}
	b.Release()
	if b, err := df.ReadBuf(ctx, dest, 100); b != nil || err != io.EOF {
		t.Fatalf("ReadBuf past the end: %v %v, want nil io.EOF", b, err)
	}
	if err := df.Cancel(ctx); err != nil {
		t.Errorf("Cancel: %v", err)
	}
	if err := df.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}
