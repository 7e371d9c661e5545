package share

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/lwiofs/lwiofs/protocol"
)

// WriteVAt writes its pieces in order at the offset, however many (more
// than one pwritev takes) and whatever their sizes (empty ones too), and a
// read-only open refuses it.
func TestWriteVAt(t *testing.T) {
	e := newEnv(t, false)
	f, _, err := e.tr.Open("v", syscall.O_RDWR|syscall.O_CREAT, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var bufs [][]byte
	var want []byte
	for i := 0; i < 3*maxWriteV+5; i++ {
		b := bytes.Repeat([]byte{byte(i)}, i%7*100)
		bufs = append(bufs, b)
		want = append(want, b...)
	}
	n, err := f.WriteVAt(bufs, 4096)
	if err != nil || n != len(want) {
		t.Fatalf("WriteVAt: %d, %v; want %d", n, err, len(want))
	}
	got, _ := os.ReadFile(filepath.Join(e.share, "v"))
	if len(got) != 4096+len(want) || !bytes.Equal(got[4096:], want) {
		t.Fatalf("file holds %d bytes, want %d after a 4096-byte hole", len(got), 4096+len(want))
	}
	ro, _, err := e.tr.Open("v", syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := ro.WriteVAt(bufs, 0); !errors.Is(err, protocol.StatusAccessDenied) {
		t.Fatalf("WriteVAt on a read-only open: %v", err)
	}
}
