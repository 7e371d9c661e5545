package test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestWriteClearsSetID: a write through the mount by a user other than the
// owner of a set-user-ID, set-group-ID file clears both bits on the
// server's disk, on the LWIO data path (O_DIRECT, 4 KiB and 1 MiB) and on
// the session channel (a small buffered write); so do truncate(2),
// fallocate(2), copy_file_range(2) and open(2) with O_TRUNC. The mount
// asks the kernel for HANDLE_KILLPRIV_V2 (fs/mount.go): the client's
// kernel then neither asks for security.capability nor sends a SETATTR
// before a write, and the bits are the server's to clear — its kernel
// does, for it writes as the user, without CAP_FSETID.
func TestWriteClearsSetID(t *testing.T) {
	needLWIO(t)
	dir := openShareDir(t)
	accts := localAccounts(t, 2)
	a, b := accts[0], accts[1]
	conf := usersConfig(t, accts, fmt.Sprintf("[shares.setid]\npath = %q\nallow_setid = true\n", dir))
	s := startServer(t, ServerConfig{Args: []string{"-config", conf}})
	ma := mountShare(t, s, MountConfig{Share: "setid", User: a.name, Password: a.password})
	mb := mountShare(t, s, MountConfig{Share: "setid", User: b.name, Password: b.password})

	for _, tc := range []struct {
		name   string
		flags  int
		n      int
		byA    bool // the owner writes instead
		wantOn os.FileMode
	}{
		{"direct-4k", unix.O_DIRECT, 4096, false, 0},
		{"direct-1m", unix.O_DIRECT, 1 << 20, false, 0},
		{"buffered-small", 0, 100, false, 0},
		{"owner-direct-4k", unix.O_DIRECT, 4096, true, 0},
		{"truncate", -1, 0, false, 0},
		{"open-trunc", unix.O_TRUNC, 0, false, 0},
		{"fallocate", -2, 0, false, 0},
		{"copy-range", -3, 0, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "f-" + tc.name
			mustWrite(t, filepath.Join(ma.Dir, name), bytes.Repeat([]byte("a"), 8192))
			// Set-user-ID, set-group-ID with group execute, writable by all.
			if err := unix.Chmod(filepath.Join(ma.Dir, name), 0o6777); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(dir, name), &st); err != nil {
				t.Fatal(err)
			}
			if st.Mode&0o6000 != 0o6000 {
				t.Fatalf("mode %o on the server's disk after chmod 6777: the share dropped the bits already", st.Mode&0o7777)
			}
			m := mb
			if tc.byA {
				m = ma
			}
			p := filepath.Join(m.Dir, name)
			// Looked at through the writer's mount first: the kernel has
			// the set-id mode cached when it writes.
			if err := unix.Stat(p, &st); err != nil || st.Mode&0o6000 != 0o6000 {
				t.Fatalf("stat through the writer's mount: mode %o, %v", st.Mode&0o7777, err)
			}
			switch {
			case tc.flags == -1: // truncate(2)
				if err := os.Truncate(p, 100); err != nil {
					t.Fatal(err)
				}
			case tc.flags < -1: // fallocate(2), copy_file_range(2) within the file
				f, err := os.OpenFile(p, os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				if tc.flags == -2 {
					err = unix.Fallocate(int(f.Fd()), 0, 0, 20000)
				} else {
					var k int
					in, out := int64(0), int64(4096)
					k, err = unix.CopyFileRange(int(f.Fd()), &in, int(f.Fd()), &out, 100, 0)
					if err == nil && k != 100 {
						err = fmt.Errorf("copied %d bytes of 100", k)
					}
				}
				f.Close()
				if err != nil {
					t.Fatal(err)
				}
			case tc.n == 0: // open(2) with O_TRUNC
				f, err := os.OpenFile(p, os.O_WRONLY|tc.flags, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.Close()
			default:
				f, err := os.OpenFile(p, os.O_WRONLY|tc.flags, 0)
				if err != nil {
					t.Fatal(err)
				}
				buf := alignedBuf(t, tc.n)
				if _, err := f.WriteAt(buf, 0); err != nil {
					f.Close()
					t.Fatal(err)
				}
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
			}
			// Through the writer's mount at once; on the server's disk
			// (read there directly) once a held-back write's BATCH,
			// which goes right after close(2), has landed.
			if err := unix.Stat(p, &st); err != nil || st.Mode&0o6000 != 0 {
				t.Errorf("mode %o through the writer's mount right after the write (%v); want the set-id bits cleared", st.Mode&0o7777, err)
			}
			if mode := diskMode(t, filepath.Join(dir, name), 0o777); mode&0o6000 != 0 {
				t.Errorf("mode %o on the server's disk after %s; want the set-id bits cleared (0777)", mode, tc.name)
			}
			if err := unix.Stat(p, &st); err != nil || st.Mode&0o6000 != 0 {
				t.Errorf("mode %o through the writer's mount after the write (%v); want the set-id bits cleared", st.Mode&0o7777, err)
			}
		})
	}
}

// TestRootAccountWriteClearsSetID: on a mount whose account is root (the
// share allows it; the server then writes with its own credentials, which
// keep set-id bits) made with allow_other, an ordinary local user — no
// CAP_FSETID — who writes to, truncates or opens with O_TRUNC a
// world-writable set-user-ID, set-group-ID (group execute) file clears
// both bits on the server's disk, as a local write would: the kernel
// flags those requests (HANDLE_KILLPRIV_V2) and the mount clears the bits
// (fs/killpriv.go). Root's own writes keep them, as locally.
func TestRootAccountWriteClearsSetID(t *testing.T) {
	needAccounts(t)
	u := newLocalUser(t)
	dir := openShareDir(t)
	s := startServer(t, ServerConfig{Shares: map[string]string{"share": dir}})
	m := mountShare(t, s, MountConfig{Options: []string{"allow_other"}}) // alice acts as root
	reachable(t, m.Dir)

	for _, tc := range []struct {
		name   string
		script string // run in the mount; "" means root writes instead
		root   func(p string) error
		want   uint32 // the mode on the server's disk afterwards
	}{
		{name: "direct-4k", script: "dd if=/dev/zero of=F bs=4096 count=1 oflag=direct conv=notrunc status=none", want: 0o777},
		{name: "direct-1m", script: "dd if=/dev/zero of=F bs=1M count=1 oflag=direct conv=notrunc status=none", want: 0o777},
		{name: "buffered-small", script: "printf hello 1<>F", want: 0o777},
		{name: "append", script: "printf hello >>F", want: 0o777},
		{name: "truncate", script: "truncate -s 100 F", want: 0o777},
		{name: "open-trunc", script: ": >F", want: 0o777},
		// Neither flagged by the kernel: the mount asks /proc.
		{name: "fallocate", script: "fallocate -l 20000 F", want: 0o777},
		{name: "copy-range", script: copyRangeScript, want: 0o777},
		{name: "twice", script: "printf a 1<>F; printf b 1<>F; dd if=/dev/zero of=F bs=4096 count=1 oflag=direct conv=notrunc status=none", want: 0o777},
		{name: "root-write", root: func(p string) error {
			return writeAt(p, 0, []byte("hello"))
		}, want: 0o6777},
		{name: "root-direct", root: func(p string) error {
			return writeAt(p, unix.O_DIRECT, alignedBuf(t, 4096))
		}, want: 0o6777},
		{name: "root-truncate", root: func(p string) error { return os.Truncate(p, 100) }, want: 0o6777},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "f-" + tc.name
			disk := filepath.Join(dir, name)
			mustWrite(t, disk, bytes.Repeat([]byte("a"), 8192))
			if err := os.Chmod(disk, 0o777|os.ModeSetuid|os.ModeSetgid); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(m.Dir, name)
			var st unix.Stat_t
			// Looked at through the mount first: the kernel, and the
			// mount, have the set-id mode when the write comes.
			if err := unix.Stat(p, &st); err != nil || st.Mode&0o7777 != 0o6777 {
				t.Fatalf("stat through the mount: mode %o, %v", st.Mode&0o7777, err)
			}
			if tc.root != nil {
				if err := tc.root(p); err != nil {
					t.Fatal(err)
				}
			} else {
				mustShAs(t, u, m.Dir, strings.ReplaceAll(tc.script, "F", name))
			}
			if mode := diskMode(t, disk, tc.want); mode != tc.want {
				t.Errorf("mode %o on the server's disk after %s; want %o", mode, tc.name, tc.want)
			}
			if err := unix.Stat(p, &st); err != nil || st.Mode&0o7777 != tc.want {
				t.Errorf("mode %o through the mount after %s (%v); want %o", st.Mode&0o7777, tc.name, err, tc.want)
			}
		})
	}
}

// diskMode returns the permission bits of p, read on the server's disk
// directly, once they are want or after 5 s: a write held back under a
// Write lease, and a chmod held back with it, land right after close(2)
// (docs/usage.md, "What close(2) promises").
func diskMode(t *testing.T, p string, want uint32) uint32 {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&0o7777 == want || time.Now().After(deadline) {
			return st.Mode & 0o7777
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// copyRangeScript copy_file_range(2)s 100 bytes of F into F itself
// (offset 0 to 4096), through the mount.
const copyRangeScript = `/usr/bin/python3 -c 'import os; f = os.open("F", os.O_RDWR); assert os.copy_file_range(f, f, 100, 0, 4096) == 100'`

// writeAt writes b at offset 0 of p, opened write-only with flags.
func writeAt(p string, flags int, b []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|flags, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
