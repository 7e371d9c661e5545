package share

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// holder is a tree with leases whose breaks a test watches: each break is
// recorded, and acknowledged unless mute.
type holder struct {
	tr     *Tree
	breaks chan LeaseBreak
	mute   atomic.Bool
}

// leaseShare opens a share of a fresh directory with a short break timeout
// and n trees that hold leases.
func leaseShare(t *testing.T, n int) (dir string, hs []*holder) {
	t.Helper()
	dir = t.TempDir()
	sh := leasingShare(t, dir)
	for range n {
		tr, err := sh.Connect(Identity{User: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		h := &holder{tr: tr, breaks: make(chan LeaseBreak, 100)}
		tr.EnableLeases(func(b LeaseBreak) {
			h.breaks <- b
			if b.Ack && !h.mute.Load() {
				go tr.AckLease(b.ID)
			}
		})
		hs = append(hs, h)
	}
	return dir, hs
}

// leasingShare opens a share of dir that grants leases, with a short
// break timeout, or skips the test when the kernel cannot watch it.
func leasingShare(t *testing.T, dir string) *Share {
	t.Helper()
	sh, err := Open(Config{Name: "s", Path: dir, LeaseBreakTimeout: time.Second, AllowRoot: true}, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	if ok, err := sh.Leasing(); !ok {
		t.Skipf("no leases on this kernel: %v", err)
	}
	return sh
}

// wantBreak waits for h's next break and checks it.
func (h *holder) wantBreak(t *testing.T, why string, ino uint64, new LeaseState, names ...string) LeaseBreak {
	t.Helper()
	select {
	case b := <-h.breaks:
		if b.Ino != ino || b.New != new || !slices.Equal(b.Names, names) {
			t.Fatalf("%s: break %+v, want ino %d new %v names %q", why, b, ino, new, names)
		}
		return b
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no break", why)
	}
	return LeaseBreak{}
}

// wantNoBreak checks that h hears nothing for a while.
func (h *holder) wantNoBreak(t *testing.T, why string) {
	t.Helper()
	select {
	case b := <-h.breaks:
		t.Fatalf("%s: unexpected break %+v", why, b)
	case <-time.After(200 * time.Millisecond):
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

func mustLease(t *testing.T, tr *Tree, p string, want, wantGot LeaseState) Attr {
	t.Helper()
	a, got, err := tr.Lease(p, want)
	if err != nil || got != wantGot {
		t.Fatalf("Lease(%q, %v) = %v, %v; want %v", p, want, got, err, wantGot)
	}
	return a
}

// local runs a shell command as another process: a change on the server
// host that is not the server's own.
func local(t *testing.T, script string) {
	t.Helper()
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

func TestLeaseWriteOpenBreaksRead(t *testing.T) {
	dir, hs := leaseShare(t, 2)
	a, b := hs[0], hs[1]
	os.WriteFile(filepath.Join(dir, "f"), []byte("old"), 0o644)
	at := mustLease(t, a.tr, "f", LeaseRead|LeaseHandle, LeaseRead|LeaseHandle)
	// Reading opens of others break nothing.
	f, _, err := b.tr.Open("f", unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	a.wantNoBreak(t, "read open")
	w, _, err := b.tr.Open("f", unix.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	brk := a.wantBreak(t, "write open", at.Ino, 0)
	if !brk.Ack || brk.Current != LeaseRead|LeaseHandle {
		t.Errorf("break %+v: want an acknowledged RH → none", brk)
	}
	// While b writes, a gets no Read; b itself does.
	mustLease(t, a.tr, "f", LeaseRead, 0)
	mustLease(t, b.tr, "f", LeaseRead, LeaseRead)
	w.Close()
	mustLease(t, a.tr, "f", LeaseRead, LeaseRead)
}

func TestLeaseAttrChangeKeepsRead(t *testing.T) {
	dir, hs := leaseShare(t, 2)
	a, b := hs[0], hs[1]
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	at := mustLease(t, a.tr, "f", LeaseRead|LeaseHandle, LeaseRead|LeaseHandle)
	if _, err := b.tr.SetAttr("f", SetAttrIn{Valid: SetMode, Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	a.wantBreak(t, "chmod", at.Ino, LeaseRead)
	if _, err := b.tr.SetAttr("f", SetAttrIn{Valid: SetSize, Size: 0}); err != nil {
		t.Fatal(err)
	}
	a.wantBreak(t, "truncate", at.Ino, 0)
	// The actor's own lease stays.
	mustLease(t, b.tr, "f", LeaseRead, LeaseRead)
	if _, err := b.tr.SetAttr("f", SetAttrIn{Valid: SetSize, Size: 1}); err != nil {
		t.Fatal(err)
	}
	b.wantNoBreak(t, "own truncate")
}

func TestLeaseDirectoryNames(t *testing.T) {
	dir, hs := leaseShare(t, 2)
	a, b := hs[0], hs[1]
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	d := mustLease(t, a.tr, "d", LeaseRead|LeaseHandle, LeaseRead)
	f, _, err := b.tr.Open("d/new", unix.O_CREAT|unix.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if brk := a.wantBreak(t, "create", d.Ino, LeaseRead, "new"); brk.Ack {
		t.Errorf("a directory's break waits for its acknowledgement: %+v", brk)
	}
	if err := b.tr.Rename("d/new", "d/renamed", 0); err != nil {
		t.Fatal(err)
	}
	a.wantBreak(t, "rename", d.Ino, LeaseRead, "new", "renamed")
	if _, err := b.tr.Mkdir("d/sub", 0o755); err != nil {
		t.Fatal(err)
	}
	a.wantBreak(t, "mkdir", d.Ino, LeaseRead, "sub")
	if err := b.tr.Unlink("d/renamed"); err != nil {
		t.Fatal(err)
	}
	a.wantBreak(t, "unlink", d.Ino, LeaseRead, "renamed")
	if err := b.tr.Rmdir("d/sub"); err != nil {
		t.Fatal(err)
	}
	a.wantBreak(t, "rmdir", d.Ino, LeaseRead, "sub")
	// a's own changes break nothing of a's.
	if _, err := a.tr.Mkdir("d/mine", 0o755); err != nil {
		t.Fatal(err)
	}
	a.wantNoBreak(t, "own mkdir")
	if err := b.tr.Rmdir("d"); err == nil {
		t.Fatal("rmdir of a non-empty directory")
	}
}

func TestLeaseWriteRecalled(t *testing.T) {
	_, hs := leaseShare(t, 2)
	a, b := hs[0], hs[1]
	// A stat by b recalls Write and waits for it: what a held back lands
	// before b reads the size.
	f, at := a.holdWrite(t, "f")
	done := make(chan Attr)
	go func() {
		got, err := b.tr.GetAttr("f")
		if err != nil {
			t.Error(err)
		}
		done <- got
	}()
	brk := a.wantBreak(t, "stat by another", at.Ino, LeaseRead|LeaseHandle)
	select {
	case <-done:
		t.Fatal("the stat did not wait for the acknowledgement")
	case <-time.After(100 * time.Millisecond):
	}
	f.WriteAt([]byte("held back"), 0)
	a.tr.AckLease(brk.ID)
	if got := <-done; got.Size != 9 {
		t.Errorf("stat after the recall: size %d, want 9", got.Size)
	}
	// With another open, no Write for anyone.
	g, _, got2, err := b.tr.OpenLease("f", unix.O_RDONLY, 0, LeaseAll)
	if err != nil || got2 != 0 {
		t.Errorf("b's lease while a writes: %v, %v", got2, err)
	}
	g.Close()
}

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

func TestLeaseAckTimeoutSuspends(t *testing.T) {
	dir, hs := leaseShare(t, 2)
	a, b := hs[0], hs[1]
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "g"), []byte("x"), 0o644)
	at := mustLease(t, a.tr, "f", LeaseRead, LeaseRead)
	mustLease(t, a.tr, "g", LeaseRead, LeaseRead)
	a.mute.Store(true)
	start := time.Now()
	w, _, err := b.tr.Open("f", unix.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if d := time.Since(start); d < 900*time.Millisecond || d > 4*time.Second {
		t.Errorf("the open waited %v for a silent holder; want the 1 s timeout", d)
	}
	a.wantBreak(t, "write open", at.Ino, 0)
	all := a.wantBreak(t, "suspension", 0, 0)
	// Suspended: nothing granted until the "every lease" break is
	// acknowledged; g's lease went with the others.
	mustLease(t, a.tr, "g", LeaseRead, 0)
	a.tr.AckLease(all.ID)
	mustLease(t, a.tr, "g", LeaseRead, LeaseRead)
}

func TestLeaseLocalChanges(t *testing.T) {
	dir, hs := leaseShare(t, 1)
	a := hs[0]
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	os.WriteFile(filepath.Join(dir, "d", "f"), []byte("x"), 0o644)
	d := mustLease(t, a.tr, "d", LeaseRead, LeaseRead)
	f := mustLease(t, a.tr, "d/f", LeaseRead, LeaseRead)
	local(t, "echo more >> "+filepath.Join(dir, "d", "f"))
	a.wantBreak(t, "local append", f.Ino, 0)
	local(t, "touch "+filepath.Join(dir, "d", "other"))
	a.wantBreak(t, "local create", d.Ino, LeaseRead, "other")
	local(t, "chmod 700 "+filepath.Join(dir, "d"))
	a.wantBreak(t, "local chmod of the directory", d.Ino, LeaseRead)
	// The server's own changes are not seen twice: a's change breaks
	// nothing, and the watcher skips the event it causes.
	mustLease(t, a.tr, "d/f", LeaseRead, LeaseRead)
	w, _, err := a.tr.Open("d/f", unix.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteAt([]byte("own"), 0)
	w.Close()
	a.wantNoBreak(t, "own write")
}

func TestLeaseEntriesAndMoves(t *testing.T) {
	dir, hs := leaseShare(t, 2)
	a, b := hs[0], hs[1]
	for _, d := range []string{"d1", "d2"} {
		os.Mkdir(filepath.Join(dir, d), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "d1", "f"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "d1", "linked"), []byte("x"), 0o644)
	os.Link(filepath.Join(dir, "d1", "linked"), filepath.Join(dir, "d2", "link"))
	ents, _, got, leases, err := a.tr.ReadDirLease("d1", "", 1<<20, func(string) int { return 1 }, LeaseRead, LeaseRead)
	if err != nil || got != LeaseRead || len(ents) != 2 {
		t.Fatalf("ReadDirLease: %v entries, %v, %v", len(ents), got, err)
	}
	byName := map[string]LeaseState{}
	for i := range ents {
		byName[ents[i].Name] = leases[i]
	}
	if byName["f"] != LeaseRead || byName["linked"] != 0 {
		t.Errorf("entry leases %v: want f R, and none for a hard-linked file", byName)
	}
	fi := ents[slices.IndexFunc(ents, func(e DirEntry) bool { return e.Name == "f" })].Attr.Ino
	d1 := a.dirIno(t, "d1")
	// Moved by b to d2: a's lease follows it there, so a local change in
	// d2 still reaches a.
	if err := b.tr.Rename("d1/f", "d2/g", 0); err != nil {
		t.Fatal(err)
	}
	a.wantBreak(t, "rename out", d1, LeaseRead, "f")
	a.wantBreak(t, "moved file's attributes", fi, LeaseRead)
	local(t, "echo x >> "+filepath.Join(dir, "d2", "g"))
	a.wantBreak(t, "local write after the move", fi, 0)
}

// dirIno is p's inode number.
func (h *holder) dirIno(t *testing.T, p string) uint64 {
	a, err := h.tr.GetAttr(p)
	if err != nil {
		t.Fatal(err)
	}
	return a.Ino
}

func TestLeaseDisconnectAndRelease(t *testing.T) {
	dir, hs := leaseShare(t, 2)
	a, b := hs[0], hs[1]
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	at := mustLease(t, a.tr, "f", LeaseRead, LeaseRead)
	a.tr.ReleaseLeases([]uint64{at.Ino})
	w, _, _ := b.tr.Open("f", unix.O_WRONLY, 0)
	w.Close()
	a.wantNoBreak(t, "after release")
	mustLease(t, a.tr, "f", LeaseRead, LeaseRead)
	a.tr.Disconnect()
	w, _, _ = b.tr.Open("f", unix.O_WRONLY, 0)
	w.Close()
	a.wantNoBreak(t, "after disconnect")
	mustLease(t, a.tr, "f", LeaseRead, 0)
	if lt := a.tr.sh.leases; lt.held.Load() != 0 {
		t.Errorf("%d leases still counted", lt.held.Load())
	}
}
