package share

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// TestWritesKeepTheirUser: two users' writes, interleaved on the same
// rings (or identity threads), each run with its own user's credentials
// and no other's. The kernel tells which by the set-id bits of a file
// owned by the writer, mode 06767 (set-group-ID without group execute):
// a write by anyone without CAP_FSETID clears set-user-ID, and set-group-ID
// goes too unless the writer is in the file's group. A write as its owner
// leaves 02767; as the other user 0767; as the server (CAP_FSETID) 06767.
// Run through io_uring personalities and, with io_uring off, through the
// identity threads.
func TestWritesKeepTheirUser(t *testing.T) {
	needPerUser(t)
	eachWritePath(t, checkWritesKeepTheirUser)
}

// eachWritePath runs check twice: writes through io_uring personalities
// ("uring"; skipped where io_uring cannot be set up) and, with io_uring
// off, through the identity threads ("threads").
func eachWritePath(t *testing.T, check func(t *testing.T)) {
	for _, ring := range []bool{true, false} {
		t.Run(map[bool]string{true: "uring", false: "threads"}[ring], func(t *testing.T) {
			if !ring {
				uringOff.Store(true)
				t.Cleanup(func() { uringOff.Store(false) })
			} else if r := getRing(nil); r == nil {
				t.Skip("SKIP: io_uring cannot be set up here: writes go to the identity threads (the threads case)")
			} else {
				putRing(r)
			}
			check(t)
		})
	}
}

func checkWritesKeepTheirUser(t *testing.T) {
	dir := sharedDir(t)
	accts := []Account{acctA, acctB}
	trees := []*Tree{connectAs(t, dir, acctA, Config{AllowSetid: true}), connectAs(t, dir, acctB, Config{AllowSetid: true})}
	const files = 40
	open := func(u, i int) *OpenFile {
		name := fmt.Sprintf("%s-%d", accts[u].Name, i)
		ownedFile(t, dir, name, "0123456789", accts[u], 0o6767)
		f, _, err := trees[u].Open(name, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	check := func(u, i int) {
		t.Helper()
		p := filepath.Join(dir, fmt.Sprintf("%s-%d", accts[u].Name, i))
		st := testutil.Stat(t, p)
		if got := st.Mode & 0o7777; got != 0o2767 {
			t.Errorf("%s, written by its owner %s: mode %o, want 2767 (6767: written as the server; 767: as another user)",
				p, accts[u].Name, got)
		}
	}
	// One goroutine alternating users: each write takes the ring (or
	// thread) the other user's write has just given back.
	for i := range files / 2 {
		for u := range accts {
			f := open(u, i)
			if _, err := f.WriteAt([]byte("x"), 3); err != nil {
				t.Fatal(err)
			}
			bufs := [][]byte{[]byte("ab"), []byte("cd")}
			if _, err := f.WriteVAt(bufs, 5); err != nil {
				t.Fatal(err)
			}
			check(u, i)
		}
	}
	// Many goroutines of both users at once.
	var wg sync.WaitGroup
	for i := files / 2; i < files; i++ {
		for u := range accts {
			f := open(u, i)
			wg.Go(func() {
				for k := range 20 {
					if _, err := f.WriteAt([]byte{byte('a' + k)}, int64(k%10)); err != nil {
						t.Errorf("%s's write: %v", accts[u].Name, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	for i := files / 2; i < files; i++ {
		for u := range accts {
			check(u, i)
		}
	}
}

// BenchmarkWriteAt is one 4 KiB WriteAt as a user: through an io_uring
// personality on the caller's goroutine, and through an identity thread.
func BenchmarkWriteAt(b *testing.B) {
	needPerUser(b)
	dir := b.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		b.Fatal(err)
	}
	p := make([]byte, 4096)
	for _, ring := range []bool{true, false} {
		b.Run(map[bool]string{true: "uring", false: "threads"}[ring], func(b *testing.B) {
			uringOff.Store(!ring)
			defer uringOff.Store(false)
			sh, err := Open(Config{Name: "s", Path: dir}, false)
			if err != nil {
				b.Fatal(err)
			}
			defer sh.Close()
			tr, err := sh.Connect(Identity{User: acctA.Name, Account: acctA})
			if err != nil {
				b.Fatal(err)
			}
			f, _, err := tr.Open("f", os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			i := 0
			for b.Loop() {
				if _, err := f.WriteAt(p, int64(i%256)*4096); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// TestWriteNegativeOffset: a negative offset is refused on both paths —
// to io_uring -1 would mean "at the file position", to pwrite(2) it is
// EINVAL — and nothing is written.
func TestWriteNegativeOffset(t *testing.T) {
	needPerUser(t)
	eachWritePath(t, func(t *testing.T) {
		dir := sharedDir(t)
		a := connectAs(t, dir, acctA, Config{})
		f, _, err := a.Open("f", os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte("XYZ"), -1); err == nil {
			t.Error("WriteAt at offset -1 succeeded")
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "f")); len(b) != 0 {
			t.Errorf("the file holds %q after a refused write", b)
		}
	})
}

// TestWriteInRunIsInPlace: inside Tree.Run (a BATCH's held-back writes),
// WriteAtInRun writes on the identity thread Run handed the caller to —
// no ring, whose buffered writes the kernel may hand to a worker thread —
// and as the tree's user: the owner's write leaves set-group-ID (it is in
// the file's group) and clears set-user-ID, as in TestWritesKeepTheirUser.
// Outside a Run it is WriteAt, through the ring when there is one.
func TestWriteInRunIsInPlace(t *testing.T) {
	needPerUser(t)
	dir := sharedDir(t)
	p, tr, f := openOwned(t, dir, "f", "0123456789", acctA, 0o6767)
	before := ringOps.Load()
	if err := tr.Run(func() error {
		_, err := f.WriteAtInRun([]byte("xy"), 3)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n := ringOps.Load() - before; n != 0 {
		t.Errorf("a write inside Tree.Run went through a ring (%d operations): it belongs on the identity thread", n)
	}
	if got, _ := os.ReadFile(p); string(got) != "012xy56789" {
		t.Errorf("file holds %q after the write, want 012xy56789", got)
	}
	if got := testutil.Stat(t, p).Mode & 0o7777; got != 0o2767 {
		t.Errorf("mode %o after its owner's write inside Run, want 2767 (6767: written as the server; 767: as another user)", got)
	}
	if r := getRing(nil); r != nil {
		putRing(r)
		before = ringOps.Load()
		if _, err := f.WriteAtInRun([]byte("z"), 0); err != nil {
			t.Fatal(err)
		}
		if ringOps.Load() == before {
			t.Error("a write outside Tree.Run did not use the ring")
		}
	}
}

// TestUserWriteAllocatesNothing: a 4 KiB WriteAt as a user through an
// io_uring personality allocates nothing (the LWIO server makes one per
// WRITE), and is still the user's write of all of p: the owner's write
// clears set-user-ID and keeps set-group-ID, as in TestWritesKeepTheirUser.
func TestUserWriteAllocatesNothing(t *testing.T) {
	needPerUser(t)
	r := getRing(nil)
	if r == nil {
		t.Skip("SKIP: io_uring cannot be set up here")
	}
	putRing(r)
	if raceEnabled {
		t.Skip("SKIP: the race detector allocates")
	}
	dir := sharedDir(t)
	path, _, f := openOwned(t, dir, "f", "", acctA, 0o6767)
	p := make([]byte, 4096)
	for i := range p {
		p[i] = byte(i)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if n, err := f.WriteAt(p, 4096); n != len(p) || err != nil {
			t.Fatalf("WriteAt: %d, %v", n, err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per 4 KiB WriteAt through a ring, want 0", allocs)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 8192 || string(got[4096:]) != string(p) {
		t.Errorf("file holds %d bytes, the written ones wrong or missing", len(got))
	}
	if m := testutil.Stat(t, path).Mode & 0o7777; m != 0o2767 {
		t.Errorf("mode %o after its owner's writes, want 2767 (6767: written as the server; 767: as another user)", m)
	}
}
