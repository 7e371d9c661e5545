package hostile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/test/hostile/rig"
)

// TestPrivilegedRequests: a client speaking the protocol directly (no
// mount in between to refuse first) asks for what would let it take the
// server host: file capabilities and trusted.* attributes, set-user-ID
// bits, and opens of FIFOs that would block server threads. Everything is
// refused at once, nothing reaches the disk, and the server goes on
// serving.
func TestPrivilegedRequests(t *testing.T) {
	s := newServer(t, rig.Options{})
	ctx := ctx10(t)
	tr := s.TestSession(ctx, t).Tree
	h, _, err := tr.Open(ctx, "prog", os.O_CREATE|os.O_RDWR, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	tr.CloseHandle(ctx, h)
	capability := []byte{1, 0, 0, 2, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	for _, name := range []string{"security.capability", "security.selinux", "trusted.overlay.redirect"} {
		if err := tr.SetXattr(ctx, "prog", name, capability, 0); !errors.Is(err, ntstatus.PrivilegeNotHeld) {
			t.Errorf("SETXATTR %s: %v, want PRIVILEGE_NOT_HELD", name, err)
		}
	}
	if n, err := unix.Getxattr(filepath.Join(s.Dir, "prog"), "security.capability", make([]byte, 64)); err == nil {
		t.Errorf("a file capability reached the disk (%d bytes)", n)
	}
	if _, err := tr.SetAttr(ctx, "prog", 0, session.SetAttrIn{Valid: session.SetMode, Mode: 0o6755}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(s.Dir, "prog"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		t.Errorf("SETATTR 6755 left mode %o on disk", st.Mode&07777)
	}

	// FIFOs: many opens at once, for reading and for writing, each
	// answered ACCESS_DENIED without waiting for a peer that never comes.
	const fifos = 64
	for i := range fifos {
		if err := unix.Mkfifo(filepath.Join(s.Dir, fmt.Sprintf("fifo%d", i)), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, fifos)
	for i := range fifos {
		wg.Add(1)
		go func() {
			defer wg.Done()
			flags := []int{os.O_RDONLY, os.O_WRONLY, os.O_RDWR}[i%3]
			_, _, err := tr.Open(ctx, fmt.Sprintf("fifo%d", i), flags, 0)
			errs <- err
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("FIFO opens have not all been answered after 10 s: they block server threads")
	}
	close(errs)
	for err := range errs {
		if !errors.Is(err, protocol.StatusAccessDenied) {
			t.Errorf("OPEN of a FIFO: %v, want ACCESS_DENIED", err)
		}
	}
	if _, err := tr.GetAttr(ctx, "fifo0"); err != nil {
		t.Errorf("GETATTR of a FIFO: %v (they are stat-able)", err)
	}
	s.Check(t)
	figures.Add(t, "SETXATTR security.*/trusted.*: PRIVILEGE_NOT_HELD; SETATTR 6755: set-id bits cleared; %d FIFO opens: ACCESS_DENIED at once, and the server serves on", fifos)
}
