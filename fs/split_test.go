package fs

import (
	"bytes"
	"context"
	mrand "math/rand"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// halfReads counts the server's reads of exactly 512 KiB: the pieces of a
// 1 MiB read split over two connections (protocol/client/split.go).
type halfReads struct {
	share.File
	n *atomic.Int32
}

func (f halfReads) ReadAt(p []byte, off int64) (int, error) {
	if len(p) == 512<<10 {
		f.n.Add(1)
	}
	return f.File.ReadAt(p, off)
}

// A program reading a file with 1 MiB O_DIRECT reads, one at a time, on a
// mount with split_read=1024, gets each read split over the mount's idle
// connections (the server sees
// 512 KiB pieces) and the right bytes, straight through a server restart:
// reads made while the server is away wait for it, then go on split over
// the new connections.
func TestSplitReadThroughRestart(t *testing.T) {
	needFUSE(t)
	if client.DefaultConnections() < 2 {
		t.Fatal("fewer than 2 default connections: nothing to split over")
	}
	var pieces atomic.Int32
	wrap := func(f share.File) share.File { return halfReads{f, &pieces} }
	dir := t.TempDir()
	content := make([]byte, 4<<20)
	mrand.New(mrand.NewSource(16)).Read(content)
	if err := os.WriteFile(filepath.Join(dir, "f"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := serveWrapped(t, dir, testutil.LoopbackAddr(t), testutil.LoopbackAddr(t), wrap)
	log := logrus.New()
	log.SetLevel(logrus.PanicLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// split_read=1024 as the mount option says it: on this host the
	// connections share memory, where the default is not to split.
	cfg := dialConfig(srv.SessionAddr(), client.Interrupt)
	cfg.SplitRead = client.DefaultSplitRead
	r, err := NewReconnector(ctx, func(ctx context.Context) (*Session, error) { return Dial(ctx, cfg) }, 20*time.Second, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	mnt := mountOn(t, r, r)

	fd, err := unix.Open(filepath.Join(mnt, "f"), unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE) // aligned for O_DIRECT
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	reads := 0
	read := func() {
		t.Helper()
		off := int64(reads%4) << 20
		reads++
		n, err := unix.Pread(fd, buf, off)
		if err != nil || n != len(buf) {
			t.Fatalf("read %d at %d: %d bytes, %v", reads, off, n, err)
		}
		if !bytes.Equal(buf, content[off:off+1<<20]) {
			t.Fatalf("read %d at %d: wrong data", reads, off)
		}
	}
	for range 8 {
		read()
	}
	if pieces.Load() < 8 {
		t.Fatalf("the server read %d pieces of 512 KiB for 8 reads of 1 MiB, want 16: not split", pieces.Load())
	}

	// The server goes away and comes back on the same addresses while
	// the reads go on.
	srv.Close()
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(300 * time.Millisecond)
		serveWrapped(t, dir, srv.SessionAddr(), srv.Listeners()[0].Addr, wrap)
	}()
	for range 4 {
		read()
	}
	<-restarted
	before := pieces.Load()
	for range 8 {
		read()
	}
	if got := pieces.Load() - before; got < 8 {
		t.Errorf("after the restart the server read %d pieces of 512 KiB for 8 reads of 1 MiB: not split", got)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Size != int64(len(content)) {
		t.Fatalf("stat after the restart: size %d, %v", st.Size, err)
	}
}
