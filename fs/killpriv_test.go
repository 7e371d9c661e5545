package fs

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/lwiofs/lwiofs/protocol/session"
)

func TestSetIDCleared(t *testing.T) {
	for _, tc := range []struct {
		mode, want uint32
		ok         bool
	}{
		{syscall.S_IFREG | 0o6777, syscall.S_IFREG | 0o777, true},
		{syscall.S_IFREG | 0o4755, syscall.S_IFREG | 0o755, true},
		{syscall.S_IFREG | 0o2755, syscall.S_IFREG | 0o755, true},  // group execute: set-group-ID goes
		{syscall.S_IFREG | 0o6745, syscall.S_IFREG | 0o2745, true}, // none: it stays (mandatory locking's mark)
		{syscall.S_IFREG | 0o2745, syscall.S_IFREG | 0o2745, false},
		{syscall.S_IFREG | 0o777, syscall.S_IFREG | 0o777, false},
		{syscall.S_IFDIR | 0o2775, syscall.S_IFDIR | 0o2775, false}, // only regular files
	} {
		if got, ok := setIDCleared(tc.mode); got != tc.want || ok != tc.ok {
			t.Errorf("setIDCleared(%o) = %o, %v; want %o, %v", tc.mode, got, ok, tc.want, tc.ok)
		}
	}
}

// killSeen is a raw filesystem that records whether the node API would
// find the request flagged *_KILL_SUIDGID (what rawFS keeps).
type killSeen struct {
	fuse.RawFileSystem
	x    *requestExtras
	seen []bool
}

func (k *killSeen) look(cancel <-chan struct{}) {
	e, _ := k.x.of(&fuse.Context{Cancel: cancel})
	k.seen = append(k.seen, e.killSetID)
}

func (k *killSeen) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	k.look(cancel)
	return fuse.OK
}

func (k *killSeen) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	k.look(cancel)
	return fuse.OK
}

func (k *killSeen) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	k.look(cancel)
	return uint32(len(data)), fuse.OK
}

// TestRawFSKeepsKillFlags: the kernel's WRITE_KILL_SUIDGID and
// OPEN_KILL_SUIDGID reach the node API (for the request they came with
// only), which go-fuse's would not pass on.
func TestRawFSKeepsKillFlags(t *testing.T) {
	x := newRequestExtras()
	k := &killSeen{RawFileSystem: fuse.NewDefaultRawFileSystem(), x: x}
	r := &rawFS{RawFileSystem: k, x: x}
	c := make(chan struct{})
	r.Open(c, &fuse.OpenIn{Flags: syscall.O_WRONLY | syscall.O_TRUNC, Mode: fuse.OPEN_KILL_SUIDGID}, &fuse.OpenOut{})
	r.Open(c, &fuse.OpenIn{Flags: syscall.O_WRONLY | syscall.O_TRUNC}, &fuse.OpenOut{})
	r.Create(c, &fuse.CreateIn{Flags: syscall.O_WRONLY | syscall.O_TRUNC, OpenFlags: fuse.OPEN_KILL_SUIDGID}, "f", &fuse.CreateOut{})
	r.Create(c, &fuse.CreateIn{Flags: syscall.O_WRONLY}, "f", &fuse.CreateOut{})
	r.Write(c, &fuse.WriteIn{WriteFlags: fuse.WRITE_KILL_SUIDGID}, []byte("x"))
	r.Write(c, &fuse.WriteIn{WriteFlags: fuse.WRITE_KILL_SUIDGID | fuse.WRITE_CACHE}, []byte("x"))
	r.Write(c, &fuse.WriteIn{Flags: syscall.O_APPEND}, []byte("x"))
	r.Write(c, &fuse.WriteIn{}, []byte("x"))
	want := []bool{true, false, true, false, true, true, false, false}
	if len(k.seen) != len(want) {
		t.Fatalf("seen %v, want %v", k.seen, want)
	}
	for i := range want {
		if k.seen[i] != want[i] {
			t.Errorf("seen %v, want %v", k.seen, want)
			break
		}
	}
	if _, ok := x.of(&fuse.Context{Cancel: c}); ok {
		t.Error("a request's extras outlive it")
	}
}

// rootAccountMount mounts over the fake tree a new directory holding files
// of ten bytes with the given modes, as a mount whose account is root,
// with allow_other and reachable by any local user.
func rootAccountMount(t *testing.T, files map[string]uint32) (backing, mnt string, tree *dirTree) {
	t.Helper()
	backing = t.TempDir()
	for name, mode := range files {
		p := filepath.Join(backing, name)
		if err := os.WriteFile(p, []byte("0123456789"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	ids := NewIDMap(IDMapNone, nil, fakeAccounts{}, nil)
	ids.ActAsForAll(Account{Name: "root"})
	mnt, tree, _ = mountFake(t, backing, Options{AllowOther: true, Owners: ids, AttrTimeout: time.Second})
	if err := os.Chmod(filepath.Dir(mnt), 0o755); err != nil {
		t.Fatal(err)
	}
	return backing, mnt, tree
}

// TestKillSetIDRoundTrips: on a mount whose account is root, with
// allow_other, writes and a truncate by an unprivileged local user
// (nobody) of a file without set-id bits send no request beyond their
// own; the first write to a file with them sends one chmod, which clears
// them on the server's disk, and the next writes none. (The kernel itself
// sends an empty SETATTR before a write to a file with set-id bits: what
// is left of its ATTR_KILL_SUID once HANDLE_KILLPRIV_V2 leaves the mode
// to the filesystem.) It fails with a mount that clears nothing
// (dc9ac2b), or that chmods on every write.
func TestKillSetIDRoundTrips(t *testing.T) {
	backing, mnt, tree := rootAccountMount(t, map[string]uint32{"plain": 0o666, "setid": 0o6777})
	asNobody := func(script string) {
		t.Helper()
		// The shell changes into the mount, not the forked child before
		// exec: this process serves the mount, and holds syscall.ForkLock
		// until the exec.
		cmd := exec.Command("/bin/sh", "-ec", `cd "$0"; `+script, mnt)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("as nobody: %s: %v\n%s", script, err, out)
		}
	}
	mode := func(name string) uint32 {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(backing, name), &st); err != nil {
			t.Fatal(err)
		}
		return st.Mode & 0o7777
	}
	for _, step := range []struct {
		script           string
		setattrs, chmods int
		file             string
		wantAfter        uint32
	}{
		{"printf a 1<>plain; printf b 1<>plain; printf c >>plain", 0, 0, "plain", 0o666},
		{"truncate -s 3 plain", 1, 0, "plain", 0o666}, // the truncate itself
		{"fallocate -l 100 plain", -1, 0, "plain", 0o666},
		{"printf a 1<>setid", -1, 1, "setid", 0o777},
		{"printf b 1<>setid; printf c >>setid", 0, 0, "setid", 0o777},
	} {
		setattrs, chmods := tree.callCount("setattr"), tree.callCount("chmod")
		asNobody(step.script)
		if got := tree.callCount("setattr") - setattrs; step.setattrs >= 0 && got != step.setattrs {
			t.Errorf("%s: %d SETATTRs, want %d", step.script, got, step.setattrs)
		}
		if got := tree.callCount("chmod") - chmods; got != step.chmods {
			t.Errorf("%s: %d chmods, want %d", step.script, got, step.chmods)
		}
		if got := mode(step.file); got != step.wantAfter {
			t.Errorf("%s: mode %o on disk, want %o", step.script, got, step.wantAfter)
		}
	}
}

// TestKillSetIDAllocateCopy: on a mount whose account is root, an
// unprivileged local user's fallocate(2) and copy_file_range(2) into a
// world-writable set-id file clear its set-id bits on the server's disk,
// as they do on a local disk (file_modified). The kernel flags neither
// request (only the SETATTR its file_remove_privs sends first, which
// HANDLE_KILLPRIV_V2 leaves empty); the server, acting as root, keeps the
// bits. Root's own keep them.
func TestKillSetIDAllocateCopy(t *testing.T) {
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("needs /usr/bin/python3 for copy_file_range")
	}
	backing, mnt, _ := rootAccountMount(t, map[string]uint32{"src": 0o644, "falloc": 0o6777, "copied": 0o6777, "rootfalloc": 0o6777})
	run := func(asNobody bool, name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = "/"
		if asNobody {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	mode := func(name string) uint32 {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(backing, name), &st); err != nil {
			t.Fatal(err)
		}
		return st.Mode & 0o7777
	}
	for _, name := range []string{"falloc", "copied", "rootfalloc"} { // the mount sees the mode
		if _, err := os.Stat(filepath.Join(mnt, name)); err != nil {
			t.Fatal(err)
		}
	}
	run(true, "fallocate", "-l", "20000", filepath.Join(mnt, "falloc"))
	run(true, python, "-c", `import os, sys
s = os.open(sys.argv[1], os.O_RDONLY)
d = os.open(sys.argv[2], os.O_WRONLY)
if os.copy_file_range(s, d, 10, 0, 100) != 10:
    sys.exit("short copy")`, filepath.Join(mnt, "src"), filepath.Join(mnt, "copied"))
	run(false, "fallocate", "-l", "20000", filepath.Join(mnt, "rootfalloc"))
	for name, want := range map[string]uint32{"falloc": 0o777, "copied": 0o777, "rootfalloc": 0o6777} {
		if got := mode(name); got != want {
			t.Errorf("%s: mode %o on disk, want %o", name, got, want)
		}
	}
}

// TestSawModeStaleReply: attributes answered to a request begun before a
// change (a GETATTR overtaken by this mount's chmod u+s) do not unmark a
// node the change showed set-id bits on — a later write must still clear
// them — while current ones do.
func TestSawModeStaleReply(t *testing.T) {
	n := &Node{}
	n.freshGen = 5 // the chmod's, answered: set-id bits
	n.setID.Store(true)
	n.rememberAt(3, session.Attr{Mode: syscall.S_IFREG | 0o777}) // begun before it
	if !n.setID.Load() {
		t.Error("a reply older than the chmod u+s unmarked the node")
	}
	n.rememberAt(6, session.Attr{Mode: syscall.S_IFREG | 0o777})
	if n.setID.Load() {
		t.Error("a current reply without set-id bits left the node marked")
	}
	n.rememberAt(4, session.Attr{Mode: syscall.S_IFREG | 0o4777})
	if !n.setID.Load() {
		t.Error("an older reply with set-id bits did not mark the node")
	}
}

// TestKillSetIDHeldBack: on a root account's mount with leases, an
// unprivileged user's write held back under a Write lease takes the
// clearing of the file's set-id bits with it: the mount shows the mode
// without them at once, the server's disk keeps both (nothing sent) until
// the close sends what was held, and then has neither.
func TestKillSetIDHeldBack(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3 to write without closing")
	}
	ids := NewIDMap(IDMapNone, nil, fakeAccounts{}, nil)
	ids.ActAsForAll(Account{Name: "root"})
	dir, a, _, _, _, _, _ := leaseRoots(t, Options{AllowOther: true, Owners: ids})
	if err := os.Chmod(filepath.Dir(a), 0o755); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(dir, "F")
	if err := os.WriteFile(disk, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(disk, 0o6777); err != nil {
		t.Fatal(err)
	}
	diskMode := func() uint32 {
		var st syscall.Stat_t
		if err := syscall.Stat(disk, &st); err != nil {
			t.Fatal(err)
		}
		return st.Mode & 0o7777
	}
	// Not a shell: its redirections close dups of the file, whose FLUSH
	// sends what was held back.
	cmd := exec.Command("/usr/bin/python3", "-c", `import os, sys
f = os.open(sys.argv[1], os.O_RDWR)
os.write(f, b"abcdefghijkl")
print("written", flush=True)
sys.stdin.read()
os.close(f)`, filepath.Join(a, "F"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, len("written\n"))
	if _, err := io.ReadFull(stdout, line); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("as nobody: %v", err)
	}
	// (stat only: an open of the server's file would break its lease)
	var st syscall.Stat_t
	if err := syscall.Stat(disk, &st); err != nil || st.Size != 10 {
		t.Errorf("size %d on disk before the close (%v): the write was not held back", st.Size, err)
	}
	if m := diskMode(); m != 0o6777 {
		t.Errorf("mode %o on disk before the close: the chmod was not held back", m)
	}
	if err := syscall.Stat(filepath.Join(a, "F"), &st); err != nil || st.Mode&0o7777 != 0o777 {
		t.Errorf("mode %o through the mount while held back (%v); want 777", st.Mode&0o7777, err)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("as nobody: %v", err)
	}
	// Right after the close (asyncclose.go): the server's disk, read
	// there directly, once the BATCH landed.
	soon(t, "the held-back write and chmod on the server's disk", 5*time.Second, func() bool {
		b, _ := os.ReadFile(disk)
		return string(b) == "abcdefghijkl" && diskMode() == 0o777
	})
}
