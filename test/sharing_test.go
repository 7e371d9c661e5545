package test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

// Issue 15: one share, two mounts (as two client hosts would have them),
// and the server host's own processes — appends, locks and open files
// that survive the server going away.

// TestAppendsTwoMounts: `echo line >> log` alternating between two mounts
// keeps every line; programs appending at once through both mounts and on
// the server host lose nothing and tear nothing — lines over the session
// channel, records past the inline size over LWIO.
func TestAppendsTwoMounts(t *testing.T) {
	s := startServer(t, ServerConfig{})
	a := mountShare(t, s, MountConfig{})
	b := mountShare(t, s, MountConfig{Completion: "polling"})

	var want strings.Builder
	for i := range 40 {
		m := []*Mount{a, b}[i%2]
		runCmd(t, m.Dir, nil, "sh", "-c", fmt.Sprintf("echo 'line %02d' >> log", i))
		fmt.Fprintf(&want, "line %02d\n", i)
	}
	wantOnDisk(t, filepath.Join(a.Backing, "log"), []byte(want.String()))
	for _, m := range []*Mount{a, b} {
		if st, err := os.Stat(filepath.Join(m.Dir, "log")); err != nil || st.Size() != int64(want.Len()) {
			t.Errorf("stat of the log on a mount: %v %v, want size %d", st, err, want.Len())
		}
	}

	// Two shells appending 300 lines each through the two mounts at once,
	// a third on the server host, and big records through both mounts.
	record := func(who string, i int) string {
		return strings.Repeat(fmt.Sprintf("%s record %d|", who, i), 20000) // ~300 KiB: LWIO
	}
	var wg sync.WaitGroup
	for _, w := range []struct{ who, dir string }{{"A", a.Dir}, {"B", b.Dir}, {"L", a.Backing}} {
		wg.Add(2)
		go func() {
			defer wg.Done()
			runCmd(t, w.dir, nil, "sh", "-c", fmt.Sprintf("i=0; while [ $i -lt 300 ]; do echo \"%s line $i\" >> many; i=$((i+1)); done", w.who))
		}()
		go func() {
			defer wg.Done()
			if w.who == "L" {
				return
			}
			f, err := os.OpenFile(filepath.Join(w.dir, "many"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			for i := range 5 {
				if _, err := f.Write([]byte(record(w.who, i) + "\n")); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	data, err := os.ReadFile(filepath.Join(a.Backing, "many"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	var exp []string
	for _, who := range []string{"A", "B", "L"} {
		for i := range 300 {
			exp = append(exp, fmt.Sprintf("%s line %d", who, i))
		}
		if who != "L" {
			for i := range 5 {
				exp = append(exp, record(who, i))
			}
		}
	}
	sort.Strings(got)
	sort.Strings(exp)
	if len(got) != len(exp) {
		t.Fatalf("%d lines, want %d: appends were lost or torn", len(got), len(exp))
	}
	for i := range exp {
		if got[i] != exp[i] {
			t.Fatalf("line %.40q, want %.40q: an append was lost, torn or doubled", got[i], exp[i])
		}
	}
}

// holdFlock starts `flock FILE sleep` holding an exclusive flock on file
// until killed.
func holdFlock(t *testing.T, file string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("flock", "-o", "-x", file, "sleep", "600")
	// A group of its own: killing flock lets go of the lock (-o: sleep
	// does not hold it), and the cleanup ends sleep too, which would
	// otherwise outlive the test by ten minutes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// flockTry reports whether `flock -n FILE true` got the lock.
func flockTry(file string) bool {
	return exec.Command("flock", "-n", "-x", file, "true").Run() == nil
}

// TestLocksTwoMounts: flock and fcntl locks held through one mount, or by
// a local process on the server host, hold against the other mount; they
// go when the holding process exits, when a blocked waiter is interrupted
// (Ctrl-C) nothing is left waiting, and when the holder's mount dies its
// locks go after the server's durable timeout.
func TestLocksTwoMounts(t *testing.T) {
	needTool(t, "flock")
	s := startServer(t, ServerConfig{Args: []string{"-durable-timeout", "2s"}})
	a := mountShare(t, s, MountConfig{})
	b := mountShare(t, s, MountConfig{})
	mustWrite(t, filepath.Join(a.Backing, "db"), []byte("0123456789"))
	fa, fb := filepath.Join(a.Dir, "db"), filepath.Join(b.Dir, "db")
	// A flockTry through B that got the lock lets go of it as the kernel's
	// RELEASE of its last close reaches the server, after flock(1) has
	// exited (the kernel sends it asynchronously): before the next step
	// takes the lock, wait until the server host sees it free.
	probeGone := func() {
		t.Helper()
		testutil.Eventually(t, "B's probe letting go of the lock", 10*time.Second, func() bool { return flockTry(filepath.Join(a.Backing, "db")) })
	}

	// Held through A, by a process that then exits.
	holder := holdFlock(t, fa)
	testutil.Eventually(t, "A's holder taking the lock", 10*time.Second, func() bool { return !flockTry(fb) })
	if flockTry(filepath.Join(a.Backing, "db")) {
		t.Error("a local process on the server host got a lock A holds")
	}
	holder.Process.Kill()
	holder.Wait()
	testutil.Eventually(t, "the lock going with its holder's exit", 10*time.Second, func() bool { return flockTry(fb) })
	probeGone()

	// Held by a local process: B's blocking flock waits until it lets go.
	local := holdFlock(t, filepath.Join(a.Backing, "db"))
	testutil.Eventually(t, "the local holder taking the lock", 10*time.Second, func() bool { return !flockTry(fb) })
	start := time.Now()
	waiter := exec.Command("flock", "-w", "30", "-x", fb, "true")
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	local.Process.Kill()
	local.Wait()
	if err := waiter.Wait(); err != nil {
		t.Fatalf("B's blocking flock after the local holder left: %v", err)
	}
	if waited := time.Since(start); waited < 400*time.Millisecond {
		t.Errorf("B's flock returned after %v, while a local process held the lock", waited)
	}

	// Ctrl-C of a blocked waiter: it ends at once, and the lock is not
	// taken behind its back when the holder lets go.
	probeGone() // B's waiter's lock
	holder = holdFlock(t, fa)
	testutil.Eventually(t, "A's holder taking the lock", 10*time.Second, func() bool { return !flockTry(fb) })
	blocked := testutil.Interruptible("flock", "-x", fb, "sleep", "600")
	if err := blocked.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	blocked.Process.Signal(os.Interrupt)
	within(t, 10*time.Second, "a blocked flock after Ctrl-C", func() error { blocked.Wait(); return nil })
	holder.Process.Kill()
	holder.Wait()
	testutil.Eventually(t, "the lock free after its holder left and the waiter was interrupted", 10*time.Second, func() bool { return flockTry(fb) })
	probeGone()

	// The holder's mount dies (SIGKILL): the server keeps its open and
	// lock for the durable timeout (2 s here), then lets go.
	f, err := os.OpenFile(fa, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if flockTry(fb) {
		t.Fatal("B got a lock A holds")
	}
	a.kill(t)
	testutil.Eventually(t, "the lock of a dead mount's session going", 20*time.Second, func() bool { return flockTry(fb) })
}

// TestSQLiteTwoMounts: sqlite used from two mounts at once, in rollback
// journal and in WAL mode, under a concurrent write load: every row
// arrives, no statement fails and PRAGMA integrity_check passes. In WAL
// mode both check-point after every commit (wal_autocheckpoint=1), so that
// the -shm's header, hash tables, read marks and backfill count, and the
// database the checkpoints write, change under each other's readers all
// the time; three databases in a row. A reader on one mount used to take
// the other's new -shm header before its hash tables, or its backfill
// count before the database pages, and fail with "database disk image is
// malformed" (fs/twin_test.go TestSharedMappingPublishesStartLast,
// fs/writeasync_test.go TestUnlockWaitsForPostedWritesBeside): about one
// round in four, so most runs of this test failed.
func TestSQLiteTwoMounts(t *testing.T) {
	needTool(t, "sqlite3")
	s := startServer(t, ServerConfig{})
	a := mountShare(t, s, MountConfig{})
	b := mountShare(t, s, MountConfig{})
	for _, mode := range []string{"DELETE", "WAL"} {
		t.Run(mode, func(t *testing.T) {
			dbs, pragma := 1, ""
			if mode == "WAL" {
				dbs, pragma = 3, "PRAGMA wal_autocheckpoint=1;\n"
			}
			for k := range dbs {
				sqliteLoad(t, nil, a, b, fmt.Sprintf("t-%s-%d.db", mode, k), mode, pragma)
			}
		})
	}
}

// TestSQLiteTwoMountsAsUser: the WAL load of TestSQLiteTwoMounts (a
// checkpoint after every commit) run by an ordinary local account, from two
// mounts that log on as that account, so that the lock, the write-back of
// the -shm mapping and the waits at unlock all run with the user's
// credentials on the server (an identity thread per request) rather than
// root's in place. The order and the waits it needs are pinned down
// deterministically by fs's TestSharedMappingPublishesStartLast and
// TestUnlockWaitsForPostedWritesBeside; this run (like the root one) is a
// stress check, which on a quiet machine passed 3 of 3 even with both
// fixes reverted.
func TestSQLiteTwoMountsAsUser(t *testing.T) {
	needTool(t, "sqlite3")
	needAccounts(t)
	u := newLocalUser(t)
	s, a := sharedMount(t, u)
	b := mountShare(t, s, MountConfig{User: u.name, Password: u.password, Options: []string{"allow_other"}})
	reachable(t, b.Dir)
	for k := range 3 {
		db := fmt.Sprintf("t-user-%d.db", k)
		sqliteLoad(t, u, a, b, db, "WAL", "PRAGMA wal_autocheckpoint=1;\n")
		// Made by the user's account on the server, not by root's.
		wantOwner(t, filepath.Join(a.Backing, db), u.uid, u.gid)
	}
}

// sqliteLoad creates db in journal mode through a, runs the write load
// from a and b at once (each starting with pragma) and checks the result
// through both, all as local account u (nil: root).
func sqliteLoad(t *testing.T, u *localUser, a, b *Mount, db, mode, pragma string) {
	t.Helper()
	runSQLAs(t, u, a.Dir, filepath.Join(a.Dir, db), fmt.Sprintf("PRAGMA journal_mode=%s;\nCREATE TABLE t(who TEXT, i INTEGER, pad TEXT);\n", mode))
	const rows = 150
	var wg sync.WaitGroup
	for _, w := range []struct {
		who string
		m   *Mount
	}{{"a", a}, {"b", b}} {
		wg.Go(func() {
			var sql strings.Builder
			sql.WriteString(".timeout 60000\n" + pragma)
			for i := range rows {
				fmt.Fprintf(&sql, "BEGIN IMMEDIATE;\nINSERT INTO t VALUES('%s', %d, '%s');\nUPDATE t SET pad = pad || 'x' WHERE i = %d AND who = '%s';\nCOMMIT;\n",
					w.who, i, strings.Repeat("p", 100+i%300), i/2, w.who)
			}
			runSQLAs(t, u, w.m.Dir, filepath.Join(w.m.Dir, db), sql.String())
		})
	}
	wg.Wait()
	for _, m := range []*Mount{a, b} {
		out := runSQLAs(t, u, m.Dir, filepath.Join(m.Dir, db), "SELECT who, count(*), count(DISTINCT i) FROM t GROUP BY who;\nPRAGMA integrity_check;\n")
		if want := fmt.Sprintf("a|%d|%d\nb|%d|%d\nok\n", rows, rows, rows, rows); out != want {
			t.Errorf("%s after the load, from %s: %q, want %q", db, m.Dir, out, want)
		}
	}
}

// openRW opens dir/name read-write until the test ends.
func openRW(t *testing.T, dir, name string) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// readStart reads up to 64 bytes at the start of f, EOF not an error.
func readStart(f *os.File) (string, error) {
	buf := make([]byte, 64)
	n, err := f.ReadAt(buf, 0)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return string(buf[:n]), err
}

// TestDurableAcrossRestart: the server is killed (SIGKILL) and restarted
// under a live mount. An open descriptor keeps reading the same file; one
// whose file was replaced meanwhile is ESTALE; one that held a lock reports
// the lock's loss with EIO.
func TestDurableAcrossRestart(t *testing.T) {
	s := startServer(t, ServerConfig{})
	m := mountShare(t, s, MountConfig{})
	mustWrite(t, filepath.Join(m.Backing, "keep"), []byte("the same file"))
	mustWrite(t, filepath.Join(m.Backing, "swap"), []byte("old data"))
	mustWrite(t, filepath.Join(m.Backing, "locked"), []byte("locked file"))
	keep, swap, locked := openRW(t, m.Dir, "keep"), openRW(t, m.Dir, "swap"), openRW(t, m.Dir, "locked")
	fl := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(locked.Fd(), unix.F_OFD_SETLK, &fl); err != nil {
		t.Fatal(err)
	}

	_ = s.p.cmd.Process.Kill()
	<-s.p.done
	os.Remove(filepath.Join(m.Backing, "swap"))
	mustWrite(t, filepath.Join(m.Backing, "swap"), []byte("A NEW FILE"))
	s.restart(t)

	within(t, time.Minute, "reads after the restart", func() error {
		if got, err := readStart(keep); err != nil || got != "the same file" {
			return fmt.Errorf("descriptor opened before the crash: %q %v", got, err)
		}
		return nil
	})
	if got, err := readStart(swap); !errors.Is(err, syscall.ESTALE) {
		t.Errorf("descriptor of a file replaced while the server was down: %q %v, want ESTALE", got, err)
	}
	if _, err := readStart(locked); !errors.Is(err, syscall.EIO) {
		t.Errorf("descriptor whose lock the restart lost: %v, want EIO", err)
	}
}
