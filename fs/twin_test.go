package fs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/lwiofs/lwiofs/protocol/share"
)

func TestChanged(t *testing.T) {
	tw := bytes.Repeat([]byte{0}, 200)
	page := append([]byte(nil), tw...)
	page[3], page[5], page[150] = 1, 1, 1 // 3 and 5 one run (gap < twinGap), 150 another
	page = append(page, 7, 7)             // past the twin: changed
	got := changed(tw, page, 4096)
	want := []span{{4096 + 3, page[3:6]}, {4096 + 150, page[150:151]}, {4096 + 200, page[200:202]}}
	if len(got) != len(want) {
		t.Fatalf("changed = %v, want %v", got, want)
	}
	for i := range want {
		if got[i].off != want[i].off || !bytes.Equal(got[i].data, want[i].data) {
			t.Errorf("run %d = %d %v, want %d %v", i, got[i].off, got[i].data, want[i].off, want[i].data)
		}
	}
	if got := changed(tw, tw, 0); len(got) != 0 {
		t.Errorf("an unchanged page has runs %v", got)
	}
}

// TestSharedMappingTwoMounts: two mounts map one page of a file shared and
// each changes its own bytes under its own lock, at the same time (sqlite's
// WAL index: the header under the write lock, a reader's mark under its
// lock, on one page). Both changes reach the server: neither mount's
// write-back of the page puts back its stale copy of the other's bytes.
// The program mapping the file is a process of its own, as sqlite would be
// (mapper_test.go: why it must be).
func TestSharedMappingTwoMounts(t *testing.T) {
	share, a, b, _, _ := twoMounts(t)
	if err := os.WriteFile(filepath.Join(share, "shm"), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	// File 0 through mount a, file 1 through mount b, both mapped.
	m := startMapper(t, os.O_RDWR, []string{a, b}, filepath.Join(a, "shm"), filepath.Join(b, "shm"))
	for round := byte(1); round <= 3; round++ {
		// Each takes its own lock (bytes past the data, as sqlite's).
		m.do("lock 0 8192")
		m.do("lock 1 8193")
		m.do("set 0 0 %d", 'A'+round) // the page is cached on both mounts now
		m.do("set 1 100 %d", 'a'+round)
		m.do("unlock 0 8192")
		m.do("unlock 1 8193")
		got, err := os.ReadFile(filepath.Join(share, "shm"))
		if err != nil {
			t.Fatal(err)
		}
		if got[0] != 'A'+round || got[100] != 'a'+round {
			t.Fatalf("round %d: the server has %q at 0 and %q at 100, want %q and %q: a write-back put back a stale byte",
				round, got[0], got[100], 'A'+round, 'a'+round)
		}
	}
}

// writeOrder is a server file that records the offsets of its writes.
type writeOrder struct {
	share.File
	mu   *sync.Mutex
	offs *[]int64
}

func (f writeOrder) WriteAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	*f.offs = append(*f.offs, off)
	f.mu.Unlock()
	return f.File.WriteAt(p, off)
}

// orderedMapping maps a file of 8 pages shared through a mount, and
// returns its mapper and the offsets the server was written at since the
// last call.
func orderedMapping(t *testing.T) (*mapper, func() []int64) {
	needFUSE(t)
	dir := t.TempDir()
	var mu sync.Mutex
	var offs []int64
	srv := serveWrapped(t, dir, "127.0.0.1:0", "127.0.0.1:0", func(f share.File) share.File {
		return writeOrder{f, &mu, &offs}
	})
	s := dialed(t, srv.SessionAddr())
	mnt := mountWith(t, s.Tree, s.Data, Options{NoLeases: true})
	if err := os.WriteFile(filepath.Join(dir, "shm"), make([]byte, 8*twinPage), 0o644); err != nil {
		t.Fatal(err)
	}
	m := startMapper(t, os.O_RDWR, []string{mnt}, filepath.Join(mnt, "shm"))
	return m, func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		got := offs
		offs = nil
		return got
	}
}

// commit does what sqlite's writer does to its -shm at a commit: under
// its lock (40000), fills a hash table (at 16 KiB on) and a page number
// (at 136 on), then stores the header at the start that makes them count.
func commit(m *mapper, round int) {
	m.t.Helper()
	m.do("lock 0 40000")
	m.do("set 0 20000 %d", round)
	m.do("set 0 400 %d", round)
	m.do("set 0 10 %d", round)
}

// TestSharedMappingPublishesStartLast: the stores a program made to a
// shared mapping under a lock reach the server from the end of the file to
// its start, each on the server before the next is sent. Another mount may
// read the file at any moment (its own lock is not this one: sqlite's
// readers take theirs while the writer holds the write lock), and sqlite
// fills the -shm's hash tables (from 16 KiB) and the page numbers (from 136)
// before it stores the header (at 0) that makes them count. Sent start
// first, the new header reached the server before its hash tables: a
// reader on another mount read old pages of the database ("database disk
// image is malformed", TestSQLiteTwoMounts/WAL).
func TestSharedMappingPublishesStartLast(t *testing.T) {
	m, written := orderedMapping(t)
	for round := 1; round <= 3; round++ {
		commit(m, round)
		written()
		m.do("unlock 0 40000")
		got := written()
		// The kernel's first write-back of the file tells the mount it
		// is mapped; the order holds from then on.
		if round == 1 {
			continue
		}
		if len(got) != 3 || got[0] != 20000 || got[1] != 400 || got[2] != 10 {
			t.Fatalf("round %d: the server was written at %v, want [20000 400 10] (the header stored last went first)", round, got)
		}
	}
}

// failAt is a server file whose first write at off fails.
type failAt struct {
	share.File
	off    int64
	failed *atomic.Bool
}

func (f failAt) WriteAt(p []byte, off int64) (int, error) {
	if off == f.off && !f.failed.Swap(true) {
		return 0, syscall.EIO
	}
	return f.File.WriteAt(p, off)
}

// TestSharedMappingPushFailure: when the write of a page of a shared
// mapping fails on the server while an unlock pushes the pages end first,
// the unlock fails (and the next fsync), and the pages below it are not
// sent: the server keeps a state the program passed through, not the new
// header without its hash tables. Before, the failure was left for the
// file's next write and taken by the next page's write-back only, which
// went unsent, and the unlock returned 0.
func TestSharedMappingPushFailure(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	var failed atomic.Bool
	failed.Store(true) // armed in round 2
	srv := serveWrapped(t, dir, "127.0.0.1:0", "127.0.0.1:0", func(f share.File) share.File {
		return failAt{f, 20000, &failed}
	})
	s := dialed(t, srv.SessionAddr())
	mnt := mountWith(t, s.Tree, s.Data, Options{NoLeases: true})
	if err := os.WriteFile(filepath.Join(dir, "shm"), make([]byte, 8*twinPage), 0o644); err != nil {
		t.Fatal(err)
	}
	m := startMapper(t, os.O_RDWR, []string{mnt}, filepath.Join(mnt, "shm"))
	for round := 1; round <= 2; round++ { // the first write-back tells the mount the file is mapped
		m.do("lock 0 40000")
		m.do("set 0 20000 %d", round)
		m.do("set 0 8200 %d", round)
		m.do("set 0 10 %d", round)
		if round == 1 {
			m.do("unlock 0 40000")
			continue
		}
		failed.Store(false)
		fmt.Fprintln(m.in, "unlock 0 40000")
		if !m.out.Scan() || !strings.HasPrefix(m.out.Text(), "error:") {
			t.Errorf("the unlock whose push failed answered %q, want an error", m.out.Text())
		}
		for i := 0; ; i++ { // reported again (the kernel's and the mount's copies), then gone
			fmt.Fprintln(m.in, "sync 0")
			if !m.out.Scan() {
				t.Fatal("mapper: no answer")
			}
			ok := !strings.HasPrefix(m.out.Text(), "error:")
			if i == 0 && ok {
				t.Errorf("the fsync after answered %q, want the error again", m.out.Text())
			}
			if ok {
				break
			}
			if i == 3 {
				t.Fatalf("fsync still fails: %s", m.out.Text())
			}
		}
	}
	got, err := os.ReadFile(filepath.Join(dir, "shm"))
	if err != nil {
		t.Fatal(err)
	}
	if got[10] != 1 || got[8200] != 1 || got[20000] != 1 {
		t.Fatalf("the server holds %d at 10, %d at 8200 and %d at 20000, want round 1's 1 everywhere (a page below the failed one went)", got[10], got[8200], got[20000])
	}
}

// TestSharedMappingLockPublishesStartLast: taking a lock drops the
// mount's cache of the file (dropForLock), which writes back the mapping's
// dirty pages — another owner's stores among them (a second process, or a
// second lock of the same one, on the mount). Those pages go end first too:
// dropped in one invalidation, the kernel wrote them back start first, and
// a header stored after its hash tables reached the server before them.
func TestSharedMappingLockPublishesStartLast(t *testing.T) {
	m, written := orderedMapping(t)
	m.do("lock 0 40000") // the first write-back tells the mount the file is mapped
	m.do("set 0 10 1")
	m.do("unlock 0 40000")
	for round := 2; round <= 3; round++ {
		commit(m, round)
		written()
		m.do("lock 0 40001") // another lock, here of the same owner
		got := written()
		if len(got) != 3 || got[0] != 20000 || got[1] != 400 || got[2] != 10 {
			t.Fatalf("round %d: taking a lock wrote the server at %v, want [20000 400 10] (the header stored last went first)", round, got)
		}
		m.do("unlock 0 40001")
		m.do("unlock 0 40000")
	}
}
