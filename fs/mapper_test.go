package fs

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Programs that map files of a mount run in a process of their own: this
// test binary re-executed as a mapper (TestMain), which the test drives
// line by line. The test process serves the mounts, and a Go process must
// not touch a mapping of a FUSE mount it serves itself. A page fault is not
// a system call: the faulting goroutine keeps its P, running as far as the
// Go scheduler knows, and cannot be preempted until the kernel has the page
// — from a READ this same process must answer. When the garbage collector
// then waits for every P to reach a safe point (stopping the world, or mark
// termination's forEachP, or suspending the goroutine to scan its stack),
// the goroutines that would answer the READ get no P: the process
// deadlocks. Killed, it then hangs in exit, writing its dirty mapping back
// to its own dead mount (fuse_vma_close before the /dev/fuse descriptors
// close). lwio-mount never maps its own files; sqlite is another process,
// as the mapper is here.

// mapperEnv, when set, makes the test binary a mapper of the files named by
// its arguments, opened with the flags it holds, instead of running tests.
const mapperEnv = "LWIOFS_TEST_MAPPER"

func TestMain(m *testing.M) {
	if v := os.Getenv(mapperEnv); v != "" {
		flags, err := strconv.Atoi(v)
		if err != nil {
			fmt.Println("error:", mapperEnv, err)
			os.Exit(2)
		}
		os.Exit(runMapper(os.Stdin, os.Stdout, flags, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// runMapper opens each file with flags (read-write), maps it shared (the
// pages it has when opened, at least one), and then does what each line of in says, answering each on out
// with "ok", "ok BYTE" or "error: ...":
//
//	lock I OFF    an OFD write lock of the byte at OFF on file I
//	unlock I OFF  its release
//	set I OFF B   stores byte B at OFF in file I's mapping
//	get I OFF     loads the byte at OFF in file I's mapping
//	sync I        fsync(2) of file I
//
// At the end of in it unmaps and closes the files and returns the exit code.
func runMapper(in io.Reader, out io.Writer, flags int, paths []string) int {
	var maps [][]byte
	var files []*os.File
	for _, p := range paths {
		f, err := os.OpenFile(p, flags, 0)
		if err != nil {
			fmt.Fprintln(out, "error:", err)
			return 1
		}
		size := int64(twinPage) // the whole file, at least a page
		if st, err := f.Stat(); err == nil && st.Size() > size {
			size = (st.Size() + twinPage - 1) / twinPage * twinPage
		}
		m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			fmt.Fprintln(out, "error: mmap:", err)
			return 1
		}
		files, maps = append(files, f), append(maps, m)
	}
	fmt.Fprintln(out, "ok")
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		fmt.Fprintln(out, mapperDo(strings.Fields(lines.Text()), files, maps))
	}
	code := 0
	for i, f := range files {
		if err := unix.Munmap(maps[i]); err != nil {
			fmt.Fprintln(out, "error: munmap:", err)
			code = 1
		}
		if err := f.Close(); err != nil {
			fmt.Fprintln(out, "error: close:", err)
			code = 1
		}
	}
	return code
}

// mapperDo does one of runMapper's commands and returns its answer.
func mapperDo(cmd []string, files []*os.File, maps [][]byte) string {
	var n []int64
	for _, a := range cmd[min(1, len(cmd)):] {
		v, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			return "error: " + err.Error()
		}
		n = append(n, v)
	}
	want := map[string]int{"lock": 2, "unlock": 2, "set": 3, "get": 2, "sync": 1}
	if len(cmd) == 0 || want[cmd[0]] != len(n) || n[0] < 0 || n[0] >= int64(len(files)) {
		return fmt.Sprintf("error: bad command %q", cmd)
	}
	f, m := files[n[0]], maps[n[0]]
	if (cmd[0] == "set" || cmd[0] == "get") && (n[1] < 0 || n[1] >= int64(len(m))) {
		return fmt.Sprintf("error: offset %d outside the mapping", n[1])
	}
	var err error
	switch cmd[0] {
	case "lock":
		err = ofd(f, unix.F_WRLCK, n[1], 1, false)
	case "unlock":
		err = ofd(f, unix.F_UNLCK, n[1], 1, false)
	case "set":
		m[n[1]] = byte(n[2])
	case "get":
		return fmt.Sprintf("ok %d", m[n[1]])
	case "sync":
		err = f.Sync()
	}
	if err != nil {
		return "error: " + err.Error()
	}
	return "ok"
}

// mapper is a running mapper process.
type mapper struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *os.File
	pid    atomic.Int32 // once started, for the watchdog
}

// startMapper starts a mapper of paths, opened with flags, under a watchdog
// over mounts (the mounts the paths are on); it ends with the test (the
// mappings written back, the files closed).
func startMapper(t *testing.T, flags int, mounts []string, paths ...string) *mapper {
	t.Helper()
	m := &mapper{t: t}
	watchdog(t, func() []int {
		if pid := m.pid.Load(); pid != 0 {
			return []int{int(pid)}
		}
		return nil
	}, mounts...)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	m.cmd = exec.Command(self, paths...)
	m.cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", mapperEnv, flags),
		// A -race binary sleeps a second in exit otherwise.
		"GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
	if m.stderr, err = os.Create(filepath.Join(t.TempDir(), "mapper.stderr")); err != nil {
		t.Fatal(err)
	}
	m.cmd.Stderr = m.stderr
	// Killed if this process dies: a mapper never outlives its mounts.
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if m.in, err = m.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	m.out = bufio.NewScanner(out)
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m.pid.Store(int32(m.cmd.Process.Pid))
	t.Cleanup(func() {
		m.in.Close()
		for m.out.Scan() { // a failed munmap or close
			t.Errorf("mapper: %s", m.out.Text())
		}
		if err := m.cmd.Wait(); err != nil {
			t.Errorf("mapper: %v\n%s", err, m.errors())
		}
	})
	m.answer()
	return m
}

// do sends the mapper one command and returns its answer past "ok"; an
// error fails the test.
func (m *mapper) do(format string, args ...any) string {
	m.t.Helper()
	fmt.Fprintf(m.in, format+"\n", args...)
	return m.answer()
}

func (m *mapper) answer() string {
	m.t.Helper()
	if !m.out.Scan() {
		m.t.Fatalf("mapper: no answer (%v)\n%s", m.out.Err(), m.errors())
	}
	a := m.out.Text()
	if !strings.HasPrefix(a, "ok") {
		m.t.Fatalf("mapper: %s", a)
	}
	return strings.TrimSpace(strings.TrimPrefix(a, "ok"))
}

// errors returns what the mapper wrote to its standard error.
func (m *mapper) errors() []byte {
	b, _ := os.ReadFile(m.stderr.Name())
	return b
}

// hangLimit is how long a test that moves a few pages may take before
// watchdog calls it hung: minutes where it takes a second, even on a
// loaded machine. A bound for hangs, not for speed.
const hangLimit = 2 * time.Minute

// watchdog fails the test if it has not ended within hangLimit (or shortly
// before the test binary's -timeout) instead of letting it hang: it
// reports this process's goroutines and the kernel stacks of its threads
// and of the processes pids returns (the stuck system calls and page
// faults), aborts the FUSE connections of the mounts, which fails every
// request waiting on them, and kills those processes, so the test ends. It is
// disarmed when the test's cleanups reach it: start it before what it
// guards.
func watchdog(t *testing.T, pids func() []int, mounts ...string) {
	limit := hangLimit
	if d, ok := t.Deadline(); ok {
		limit = min(limit, time.Until(d)*9/10) // a short -timeout: fire before it
	}
	done := make(chan struct{})
	var fired sync.WaitGroup
	fired.Go(func() {
		select {
		case <-done:
			return
		case <-time.After(limit):
		}
		var b strings.Builder
		fmt.Fprintf(&b, "hung for %v; aborting the FUSE connections of %v\n", limit, mounts)
		for _, pid := range append([]int{os.Getpid()}, pids()...) {
			kernelStacks(&b, pid)
		}
		buf := make([]byte, 1<<20)
		fmt.Fprintf(&b, "goroutines:\n%s", buf[:runtime.Stack(buf, true)])
		for _, mnt := range mounts {
			abortFUSE(&b, mnt)
		}
		for _, pid := range pids() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		t.Error(b.String())
	})
	t.Cleanup(func() {
		close(done)
		fired.Wait()
	})
}

// kernelStacks writes where in the kernel each thread of pid is.
func kernelStacks(w io.Writer, pid int) {
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	fmt.Fprintf(w, "process %d %q:\n", pid, bytes.Split(cmdline, []byte{0}))
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, task := range tasks {
		comm, _ := os.ReadFile(filepath.Join(task, "comm"))
		stat, _ := os.ReadFile(filepath.Join(task, "stat"))
		state := "?"
		if _, after, ok := bytes.Cut(stat, []byte(") ")); ok && len(after) > 0 {
			state = string(after[:1])
		}
		stack, err := os.ReadFile(filepath.Join(task, "stack"))
		if err != nil {
			stack = []byte(err.Error() + "\n")
		}
		fmt.Fprintf(w, "thread %s (%s) %s:\n%s", filepath.Base(task), bytes.TrimSpace(comm), state, stack)
	}
}

// abortFUSE aborts the FUSE connection mounted at mnt: a forced unmount
// (MNT_FORCE) has the kernel abort it first (fuse_umount_begin), without a
// request to the daemon; the unmount itself may then fail, busy. The
// mount's cleanup then only detaches it (see aborted).
func abortFUSE(w io.Writer, mnt string) {
	aborted.Store(mnt, true)
	err := unix.Unmount(mnt, unix.MNT_FORCE)
	fmt.Fprintf(w, "forced unmount of %s: %v\n", mnt, err)
}

// aborted holds the mount points whose connection a watchdog aborted: the
// requests their daemon was stuck in may never end, and an orderly
// unmount waits for them.
var aborted sync.Map
