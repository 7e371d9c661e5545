package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLeases mounts one share twice, as two client hosts would, with
// attribute and entry timeouts of a minute, and changes on one mount (and
// on the server host) what the other has cached: with leases the other
// sees each change within a lease break's delivery; with -o noleases it
// trusts its cached attributes and names for the minute — the control
// that shows the test measures the leases (close-to-open shows new data at
// the next open, and absent names are not cached, leases or not).
//
// What the control checks is cached in b's kernel dentries and inodes,
// which the kernel may reclaim at any moment while unused: an
// "echo 3 > /proc/sys/vm/drop_caches" (the benchmarks run one before each
// job) or memory pressure makes b look the names up again, and it then
// rightly shows the change. So b holds an O_PATH descriptor on each name
// whose cached view the control checks: it pins the dentry and inode (no
// OPEN reaches the mount, so no handle or lease changes) and leaves the
// timeouts alone; with attr_timeout=0 or entry_timeout=0 the control
// still fails.
func TestLeases(t *testing.T) {
	const within = 500 * time.Millisecond
	timeouts := []string{"attr_timeout=60", "entry_timeout=60"}
	for _, leases := range []bool{true, false} {
		name := map[bool]string{true: "leases", false: "noleases"}[leases]
		t.Run(name, func(t *testing.T) {
			s := startServer(t, ServerConfig{})
			opts := timeouts
			if !leases {
				opts = append(opts, "noleases")
			}
			a := mountShare(t, s, MountConfig{Options: opts})
			b := mountShare(t, s, MountConfig{Completion: "polling", Options: opts})
			// seen checks b sees a change within a break's delivery;
			// cached, that without leases b's caches hide it.
			seen := func(what string, cached bool, cond func() bool) {
				t.Helper()
				deadline := time.Now().Add(within)
				for !cond() {
					if time.Now().After(deadline) {
						if leases || !cached {
							t.Errorf("%s: not seen on the other mount within %v", what, within)
						}
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
				if !leases && cached {
					t.Errorf("%s: seen at once without leases: the caches under test were not used", what)
				}
			}
			// pin keeps b's dentry and inode of p in its kernel until
			// the test ends (see above).
			pin := func(p string) {
				t.Helper()
				fd, err := unix.Open(p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					t.Fatalf("pin %s: %v", p, err)
				}
				t.Cleanup(func() { unix.Close(fd) }) // before the unmount: registered after it
			}
			exists := func(p string) bool { _, err := os.Lstat(p); return err == nil }
			read := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
			perm := func(p string) os.FileMode {
				fi, err := os.Stat(p)
				if err != nil {
					return 0
				}
				return fi.Mode().Perm()
			}

			// b has looked at everything it will see changed.
			mustWrite(t, filepath.Join(a.Dir, "f"), []byte("one"))
			mustWrite(t, filepath.Join(a.Dir, "gone"), []byte("x"))
			if read(filepath.Join(b.Dir, "f")) != "one" || perm(filepath.Join(b.Dir, "f")) != 0o644 ||
				!exists(filepath.Join(b.Dir, "gone")) || exists(filepath.Join(b.Dir, "new")) {
				t.Fatal("b's view before the changes")
			}
			if _, err := os.ReadDir(b.Dir); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // a's handles closed in the background

			f, err := os.OpenFile(filepath.Join(a.Dir, "f"), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteAt([]byte("two"), 0)
			f.Close()
			seen("write", false, func() bool { return read(filepath.Join(b.Dir, "f")) == "two" })
			// b reopens the file once a's handle is closed on the server (a
			// moment after close(2): the kernel releases it in the
			// background): while another client has a file open for
			// writing, no lease on it is granted, and the mount's timeouts
			// apply to it.
			time.Sleep(100 * time.Millisecond)
			read(filepath.Join(b.Dir, "f"))
			pin(filepath.Join(b.Dir, "f"))
			perm(filepath.Join(b.Dir, "f")) // b's attributes, fresh
			if err := os.Chmod(filepath.Join(a.Dir, "f"), 0o600); err != nil {
				t.Fatal(err)
			}
			seen("chmod", true, func() bool { return perm(filepath.Join(b.Dir, "f")) == 0o600 })
			mustWrite(t, filepath.Join(a.Dir, "new"), []byte("new"))
			seen("create", false, func() bool { return read(filepath.Join(b.Dir, "new")) == "new" })
			pin(filepath.Join(b.Dir, "gone"))
			exists(filepath.Join(b.Dir, "gone")) // b's entry, fresh
			if err := os.Remove(filepath.Join(a.Dir, "gone")); err != nil {
				t.Fatal(err)
			}
			seen("unlink", true, func() bool { return !exists(filepath.Join(b.Dir, "gone")) })
			pin(filepath.Join(b.Dir, "new"))
			exists(filepath.Join(b.Dir, "new"))
			if err := os.Rename(filepath.Join(a.Dir, "new"), filepath.Join(a.Dir, "renamed")); err != nil {
				t.Fatal(err)
			}
			seen("rename", true, func() bool { return !exists(filepath.Join(b.Dir, "new")) && exists(filepath.Join(b.Dir, "renamed")) })

			// A process on the server host.
			if read(filepath.Join(b.Dir, "renamed")) != "new" {
				t.Fatal("b's view of the renamed file")
			}
			local := s.Shares["share"]
			if out, err := exec.Command("sh", "-c", "echo local > "+filepath.Join(local, "renamed")+"; touch "+filepath.Join(local, "made")).CombinedOutput(); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			seen("change on the server host", false, func() bool {
				return read(filepath.Join(b.Dir, "renamed")) == "local\n" && exists(filepath.Join(b.Dir, "made"))
			})
		})
	}
}
