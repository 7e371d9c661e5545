package client

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
)

var modes = []Mode{Interrupt, Polling, Auto}

// TestReadWrite is the first end-to-end path: negotiate, connect,
// authenticate, register, read, write, close, in both completion modes and
// through every read size class (bounce buffer, pooled, multi-request).
func TestReadWrite(t *testing.T) {
	inEachMode(t, server.Config{}, func(t *testing.T, e *env, s *session, cl *Client) {
		content := testutil.RandBytes(3<<20 + 123)
		key, path := s.file(t, "f", content)
		f := s.register(t, cl, key, 0)
		ctx := ctxT(t)
		for _, tc := range []struct {
			off, n int
		}{{0, 1}, {5, 1000}, {4096, 4096}, {100, 65536}, {0, 1 << 20}, {1, 3 << 20}} {
			p := make([]byte, tc.n)
			got, err := f.ReadAt(ctx, p, int64(tc.off))
			if err != nil || got != tc.n {
				t.Fatalf("ReadAt(%d, %d) = %d, %v", tc.off, tc.n, got, err)
			}
			if !bytes.Equal(p, content[tc.off:tc.off+tc.n]) {
				t.Fatalf("ReadAt(%d, %d): wrong data", tc.off, tc.n)
			}
		}
		// Short read at end of file, then past it.
		p := make([]byte, 1000)
		got, err := f.ReadAt(ctx, p, int64(len(content)-10))
		if got != 10 || !errors.Is(err, io.EOF) || !bytes.Equal(p[:10], content[len(content)-10:]) {
			t.Fatalf("ReadAt at EOF-10 = %d, %v", got, err)
		}
		if got, err := f.ReadAt(ctx, p, int64(len(content)+5)); got != 0 || !errors.Is(err, io.EOF) {
			t.Fatalf("ReadAt past EOF = %d, %v", got, err)
		}
		// Writes: small (inline), large (second segment), beyond MaxWrite.
		for _, tc := range []struct{ off, n int }{{3, 100}, {8192, 64 << 10}, {1 << 20, 2<<20 + 7}} {
			data := testutil.RandBytes(tc.n)
			got, err := f.WriteAt(ctx, data, int64(tc.off))
			if err != nil || got != tc.n {
				t.Fatalf("WriteAt(%d, %d) = %d, %v", tc.off, tc.n, got, err)
			}
			copy(content[tc.off:], data)
		}
		disk, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(disk, content) {
			t.Fatal("file on disk differs from the writes")
		}
		if err := f.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := f.ReadAt(ctx, p, 0); !errors.Is(err, ErrClosed) {
			t.Fatalf("ReadAt after Close: %v", err)
		}
		// The Fid is gone on the server too.
		stale := &File{cl: cl, fid: f.fid}
		if _, err := stale.ReadAt(ctx, p, 0); !errors.Is(err, protocol.StatusInvalidHandle) {
			t.Fatalf("read on a closed Fid: %v, want STATUS_INVALID_HANDLE", err)
		}
	})
}

// TestAppend: WriteAt at a negative offset appends through WRITE at
// WriteToEndOfFile, whatever the file's size is meanwhile — the server
// places it — in each completion mode.
func TestAppend(t *testing.T) {
	inEachMode(t, server.Config{}, func(t *testing.T, e *env, s *session, cl *Client) {
		key, path := s.file(t, "log", []byte("head\n"))
		f := s.register(t, cl, key, 0)
		ctx := ctxT(t)
		if n, err := f.WriteAt(ctx, []byte("one\n"), -1); n != 4 || err != nil {
			t.Fatalf("append = %d %v", n, err)
		}
		// Someone else grows the file; the next append lands after it.
		if err := os.WriteFile(path, []byte("head\none\nlocal\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		big := bytes.Repeat([]byte("b"), cl.MaxWrite()+10) // two requests, each appended
		if n, err := f.WriteAt(ctx, big, -1); n != len(big) || err != nil {
			t.Fatalf("large append = %d %v", n, err)
		}
		if _, err := f.WriteV(ctx, [][]byte{make([]byte, 4096)}, -1); err == nil {
			t.Error("a vectored append was sent")
		}
		disk, _ := os.ReadFile(path)
		if want := append([]byte("head\none\nlocal\n"), big...); !bytes.Equal(disk, want) {
			t.Errorf("file is %d bytes %q…, want %d", len(disk), disk[:min(len(disk), 20)], len(want))
		}
	})
}

// The completion mode can differ per file, so per request.
func TestMixedModes(t *testing.T) {
	e := newEnv(t, server.Config{})
	s, cl := e.newClient(t, Interrupt)
	content := testutil.RandBytes(1 << 20)
	key, _ := s.file(t, "f", content)
	a := s.register(t, cl, key, 0)
	b := s.register(t, cl, key, 0)
	b.SetCompletion(Polling)
	ctx := ctxT(t)
	done := make(chan error, 2)
	for _, f := range []*File{a, b} {
		go func() {
			p := make([]byte, 64<<10)
			for i := 0; i < 30; i++ {
				off := int64(i * 4096)
				if _, err := f.ReadAt(ctx, p, off); err != nil {
					done <- err
					return
				}
				if !bytes.Equal(p, content[off:off+int64(len(p))]) {
					done <- errors.New("wrong data")
					return
				}
			}
			done <- nil
		}()
	}
	for i := 0; i < 2; i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
