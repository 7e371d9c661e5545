package test

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriteInPlace: a mount on the server's host gets its large O_DIRECT
// WRITEs written straight from its memory (lwio_writes_in_place_total
// moves), fragmented (1 MiB: eight messages) and not (64 KiB), for a root
// mount, an ordinary account's and two mounts writing one file at once,
// with the file's bytes right on the export; a sealed mount and a server
// without shared memory write the same bytes through the receive buffers
// and nothing in place.
func TestWriteInPlace(t *testing.T) {
	needFUSE(t)
	const counter = "lwio_writes_in_place_total"
	// writes puts two files through the mount with O_DIRECT, 1 MiB and
	// 64 KiB writes, and checks them on the export.
	writes := func(t *testing.T, mnt, export string) {
		t.Helper()
		for _, c := range []struct {
			name       string
			total, per int
		}{{"big", 8 << 20, 1 << 20}, {"small", 1 << 20, 64 << 10}} {
			want := pattern(byte(c.per>>10), c.total)
			f, err := os.OpenFile(filepath.Join(mnt, c.name), os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			buf := alignedBuf(t, c.per)
			for off := 0; off < c.total; off += c.per {
				copy(buf, want[off:off+c.per])
				if _, err := f.WriteAt(buf, int64(off)); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(export, c.name))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: the export's bytes differ from those written (%d bytes, want %d)", c.name, len(got), len(want))
			}
		}
	}
	t.Run("root", func(t *testing.T) {
		metrics := freeAddr(t)
		share := t.TempDir()
		s := startServer(t, ServerConfig{Shares: map[string]string{"share": share}, Args: []string{"-metrics", metrics}})
		m := mountShare(t, s, MountConfig{Options: []string{"noleases"}})
		writes(t, m.Dir, share)
		if n := scrapeMetrics(t, metrics)[counter]; n < 8+16 {
			t.Fatalf("%v WRITEs written in place, want the 8 MiB file's 8 and the 64 KiB writes' 16", n)
		}
	})
	t.Run("ordinary account", func(t *testing.T) {
		acct, m, share, metrics := accountMount(t)
		writes(t, m.Dir, share)
		if uid, _ := ownerOnDisk(t, filepath.Join(share, "big")); uid != acct.uid {
			t.Fatalf("the file is owned by %d, want the account's %d: the test proves nothing", uid, acct.uid)
		}
		if n := scrapeMetrics(t, metrics)[counter]; n < 8+16 {
			t.Fatalf("%v WRITEs written in place, want 24", n)
		}
	})
	t.Run("two mounts, one file", func(t *testing.T) {
		// Two mounts of one share write the two halves of one file at
		// once, 1 MiB O_DIRECT writes: their lent messages interleave in
		// the server's shared receive buffers, and each half must come
		// out as its own mount wrote it.
		metrics := freeAddr(t)
		share := t.TempDir()
		s := startServer(t, ServerConfig{Shares: map[string]string{"share": share}, Args: []string{"-metrics", metrics}})
		ms := []*Mount{mountShare(t, s, MountConfig{Options: []string{"noleases"}}), mountShare(t, s, MountConfig{Options: []string{"noleases"}})}
		const half, per = 8 << 20, 1 << 20
		want := append(pattern(1, half), pattern(2, half)...)
		if err := os.WriteFile(filepath.Join(share, "f"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, len(ms))
		for i, m := range ms {
			buf := alignedBuf(t, per)
			go func() {
				f, err := os.OpenFile(filepath.Join(m.Dir, "f"), os.O_WRONLY|syscall.O_DIRECT, 0)
				if err != nil {
					errs <- err
					return
				}
				defer f.Close()
				for off := i * half; off < (i+1)*half; off += per {
					copy(buf, want[off:off+per])
					if _, err := f.WriteAt(buf, int64(off)); err != nil {
						errs <- err
						return
					}
				}
				errs <- f.Close()
			}()
		}
		for range ms {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(filepath.Join(share, "f"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("the export's bytes differ from what the two mounts wrote (%d bytes, want %d)", len(got), len(want))
		}
		if n := scrapeMetrics(t, metrics)[counter]; n < 16 {
			t.Fatalf("%v WRITEs written in place, want the two mounts' 16", n)
		}
	})
	for _, c := range []struct {
		name string
		env  []string
		opts []string
	}{
		{"server without shared memory", []string{"LWIO_SOFT_NOSHM=1"}, []string{"noleases"}},
		{"sealed mount", nil, []string{"noleases", "seal"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			metrics := freeAddr(t)
			share := t.TempDir()
			s := startServer(t, ServerConfig{Shares: map[string]string{"share": share}, Env: c.env, Args: []string{"-metrics", metrics}})
			m := mountShare(t, s, MountConfig{Options: c.opts})
			writes(t, m.Dir, share)
			if n := scrapeMetrics(t, metrics)[counter]; n != 0 {
				t.Fatalf("%v WRITEs written in place", n)
			}
		})
	}
}

// accountMount starts a server (its /metrics at a free address) whose
// share belongs to a new local account, and mounts it as that account.
func accountMount(t *testing.T) (acct *localUser, m *Mount, share, metrics string) {
	t.Helper()
	needAccounts(t)
	acct = newLocalUser(t)
	metrics = freeAddr(t)
	share = t.TempDir()
	if err := os.Chown(share, int(acct.uid), int(acct.gid)); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, ServerConfig{Shares: map[string]string{"share": share},
		Args: append(serverConfig(t, acct), "-metrics", metrics)})
	m = mountShare(t, s, MountConfig{User: acct.name, Password: acct.password, Options: []string{"allow_other", "noleases"}})
	reachable(t, m.Dir)
	return acct, m, share, metrics
}
