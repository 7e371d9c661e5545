package share

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// An OPEN that recalls another tree's Write returns the attributes the
// recall left: what the holder sent at the recall (a client's held-back
// writes and chmod, its close(2) long returned) lands before they are
// read — with or without a lease for the opener, reading or writing.
func TestOpenAttrsAfterRecall(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags int
		want  LeaseState
		left  LeaseState // what a keeps
	}{
		{"read", unix.O_RDONLY, 0, LeaseRead | LeaseHandle},
		{"read leased", unix.O_RDONLY, LeaseAll, LeaseRead | LeaseHandle},
		{"write", unix.O_RDWR, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, hs := leaseShare(t, 2)
			a, b := hs[0], hs[1]
			f, at := a.holdWrite(t, "f")
			done := make(chan Attr, 1)
			go func() {
				g, ga, _, err := b.tr.OpenLease("f", tc.flags, 0, tc.want)
				if err != nil {
					t.Error(err)
				} else {
					g.Close()
				}
				done <- ga
			}()
			brk := a.wantBreak(t, "open by another", at.Ino, tc.left)
			// What a held back, sent at the recall.
			if _, err := f.WriteAt([]byte("held back"), 0); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(dir, "f"), 0o600); err != nil {
				t.Fatal(err)
			}
			a.tr.AckLease(brk.ID)
			select {
			case ga := <-done:
				if ga.Size != 9 || ga.Mode&0o777 != 0o600 {
					t.Errorf("open's attributes after the recall: size %d mode %o, want 9 and 600", ga.Size, ga.Mode&0o777)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the open did not return")
			}
		})
	}
}

// holdWrite creates p through h's tree with every lease (Write included),
// closed at the test's end, and mutes h: its breaks wait for the test.
func (h *holder) holdWrite(t *testing.T, p string) (*OpenFile, Attr) {
	t.Helper()
	f, at, got, err := h.tr.OpenLease(p, unix.O_CREAT|unix.O_WRONLY, 0o644, LeaseAll)
	if err != nil || got != LeaseAll {
		t.Fatalf("OpenLease = %v, %v; want RWH", got, err)
	}
	t.Cleanup(func() { f.Close() })
	h.mute.Store(true)
	return f, at
}
