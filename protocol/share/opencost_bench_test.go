package share

import (
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkTarFile is the server's side of one file of tar -x on a
// leasing share, in the tree's Run as the session runs them (onTree): the
// OPEN (a create with a lease and a FileID) and the BATCH at close (a
// write, tar's three setattrs, the closing fstat, the close). Only the
// share's public calls, so that the same file measures older code.
// LWIOFS_BENCH_DIR: where the share is (default a tmpfs, /dev/shm).
func BenchmarkTarFile(b *testing.B) {
	base := os.Getenv("LWIOFS_BENCH_DIR")
	if base == "" {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "lwiofs-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sh, err := Open(Config{Name: "s", Path: dir, LeaseBreakTimeout: time.Second, AllowRoot: true}, false)
	if err != nil {
		b.Fatal(err)
	}
	defer sh.Close()
	if ok, err := sh.Leasing(); !ok {
		b.Skipf("no leases: %v", err)
	}
	sh.SetIdentityKey(bytes.Repeat([]byte{7}, IdentityKeySize))
	tr, err := sh.Connect(serverIdentity("alice"))
	if err != nil {
		b.Fatal(err)
	}
	tr.EnableLeases(func(LeaseBreak) {})
	if err := os.Mkdir(dir+"/d", 0o755); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 4096)
	mtime := time.Unix(1787934006, 0)
	b.ResetTimer()
	for i := range b.N {
		var f *OpenFile
		err := tr.Run(func() (err error) {
			f, _, _, err = tr.OpenLease(fmt.Sprintf("d/f%d", i), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o600, LeaseAll)
			if err == nil && f.FileID() == nil {
				err = fmt.Errorf("no FileID")
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		err = tr.Run(func() error {
			if _, err := f.WriteAtInRun(data, 0); err != nil {
				return err
			}
			for _, in := range []SetAttrIn{
				{Valid: SetMtime, Mtime: mtime},
				{Valid: SetUid | SetGid, Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid())},
				{Valid: SetMode, Mode: 0o644},
				{},
			} {
				if _, err := f.SetAttr(in); err != nil {
					return err
				}
			}
			return f.Close()
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
