package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// pieceFile is a server-side file that records the sizes of the reads the
// engine makes of it, and fails those that start at failAt (>= 0).
type pieceFile struct {
	osFile
	mu     sync.Mutex
	sizes  []int
	failAt int64
}

func (f *pieceFile) ReadAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	f.sizes = append(f.sizes, len(p))
	fail := f.failAt >= 0 && off == f.failAt
	f.mu.Unlock()
	if fail {
		return 0, syscall.EIO
	}
	return f.osFile.ReadAt(p, off)
}

func (f *pieceFile) reads() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := append([]int(nil), f.sizes...)
	f.sizes = f.sizes[:0]
	return out
}

// splitFile creates name with content on s's server, wrapped in a
// pieceFile, and registers it on cl.
func (s *session) splitFile(t testing.TB, cl *Client, name string, content []byte) (*File, *pieceFile) {
	t.Helper()
	f, _ := s.e.create(t, name, content)
	pf := &pieceFile{osFile: osFile{File: f}, failAt: -1}
	return s.register(t, cl, s.e.auth.AddFile(s.id, pf), 0), pf
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	mrand.New(mrand.NewSource(int64(n))).Read(b)
	return b
}

// connRequests are the I/O requests completed on each of cl's connections.
func connRequests(cl *Client) []uint64 {
	var out []uint64
	for _, ci := range cl.Conns() {
		out = append(out, ci.Requests)
	}
	return out
}

// joined is what a read returned: its pieces in order, which must also be
// what Bytes says.
func joined(t *testing.T, b Buffer) []byte {
	t.Helper()
	s, ok := b.(*SplitBuf)
	if !ok {
		return append([]byte(nil), b.Bytes()...)
	}
	got := bytes.Join(s.Slices(), nil)
	if len(got) != s.Len() || !bytes.Equal(got, s.Bytes()) {
		t.Fatalf("split read: the pieces (%d bytes) and Bytes (%d) differ", len(got), len(s.Bytes()))
	}
	return got
}

// A lone 1 MiB read on a client whose two connections idle goes as two
// 512 KiB READs, one on each connection (the server sees two reads of
// half the size), and the data comes back whole and in order, in every
// completion mode.
func TestSplitReadSpreadsOverIdleConnections(t *testing.T) {
	inEachMode(t, server.Config{}, func(t *testing.T, e *env, s *session, cl *Client) {
		if len(cl.conns) < 2 {
			t.Fatalf("%d connections, want the default of at least 2", len(cl.conns))
		}
		content := randomBytes(3 << 20)
		f, pf := s.splitFile(t, cl, "f", content)
		ctx := ctxT(t)
		for _, off := range []int64{0, 1 << 20, 12288} {
			before := connRequests(cl)
			splits := cl.Stats().SplitReads
			pf.reads()
			waitIdle(t, cl) // a background CREDIT would keep a connection busy
			b, err := f.ReadBuf(ctx, make([]byte, 1<<20), off)
			if err != nil {
				t.Fatal(err)
			}
			if got := joined(t, b); !bytes.Equal(got, content[off:off+1<<20]) {
				t.Fatalf("read at %d: wrong data", off)
			}
			b.Release()
			if _, ok := b.(*SplitBuf); !ok && !raceEnabled { // -race: polling pieces come copied (joinPieces)
				t.Errorf("read at %d: %T, want a *SplitBuf", off, b)
			}
			if got := pf.reads(); len(got) != 2 || got[0] != 512<<10 || got[1] != 512<<10 {
				t.Errorf("read at %d: the server read %v bytes, want two pieces of 512 KiB", off, got)
			}
			after := connRequests(cl)
			for i := range after {
				if after[i]-before[i] != 1 {
					t.Errorf("read at %d: connection %d completed %d requests, want 1 each (%v -> %v)", off, i, after[i]-before[i], before, after)
				}
			}
			if d := cl.Stats().SplitReads - splits; d != 1 {
				t.Errorf("read at %d: SplitReads moved by %d, want 1", off, d)
			}
		}
	})
}

// No split below the threshold, on a client with one connection, with
// splitting turned off, or when a connection has a request in flight (a
// deep queue keeps them busy: it must read as it did without splitting).
func TestSplitReadOnlyWhenWorthIt(t *testing.T) {
	e := newEnv(t, server.Config{})
	content := randomBytes(2 << 20)
	one := func(t *testing.T, cl *Client, s *session, n int) {
		t.Helper()
		f, pf := s.splitFile(t, cl, "f", content)
		b, err := f.ReadBuf(ctxT(t), make([]byte, n), 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := joined(t, b); !bytes.Equal(got, content[:n]) {
			t.Fatal("wrong data")
		}
		b.Release()
		if _, ok := b.(*SplitBuf); ok {
			t.Errorf("a %d-byte read was split", n)
		}
		if got := pf.reads(); len(got) != 1 || got[0] != n {
			t.Errorf("the server read %v, want one read of %d", got, n)
		}
		if n := cl.Stats().SplitReads; n != 0 {
			t.Errorf("SplitReads = %d, want 0", n)
		}
	}
	t.Run("below threshold", func(t *testing.T) {
		s, cl := e.newClient(t, Interrupt)
		one(t, cl, s, 512<<10)
	})
	t.Run("one connection", func(t *testing.T) {
		s, cl := e.oneConn(t, Interrupt)
		one(t, cl, s, 1<<20)
	})
	t.Run("off", func(t *testing.T) {
		s := e.session()
		cfg := s.config(Interrupt)
		cfg.SplitRead = -1
		one(t, s.client(t, cfg), s, 1<<20)
	})
	t.Run("busy", func(t *testing.T) {
		s, cl := e.newClient(t, Interrupt)
		// A request in flight on every connection but one.
		for _, c := range cl.conns[1:] {
			if err := c.credits.ChargeN(ctxT(t), 1); err != nil {
				t.Fatal(err)
			}
			defer c.credits.ReleaseN(1)
		}
		one(t, cl, s, 1<<20)
	})
	t.Run("lower threshold", func(t *testing.T) {
		s := e.session()
		cfg := s.config(Interrupt)
		cfg.SplitRead = 256 << 10
		cl := s.client(t, cfg)
		f, pf := s.splitFile(t, cl, "f", content)
		waitIdle(t, cl)
		b, err := f.ReadBuf(ctxT(t), make([]byte, 512<<10), 0)
		if err != nil {
			t.Fatal(err)
		}
		b.Release()
		if got := pf.reads(); len(got) != 2 || got[0] != 256<<10 {
			t.Errorf("split_read=256 KiB: a 512 KiB read went as %v, want two of 256 KiB", got)
		}
	})
}

// End of file inside a split read ends it there, as one READ would: a
// short first piece drops the second's answer (END_OF_FILE), a short
// second piece gives the bytes up to the end, a read from exactly the end
// of the first piece's range or past the end says io.EOF.
func TestSplitReadEndOfFile(t *testing.T) {
	inEachMode(t, server.Config{}, func(t *testing.T, e *env, s *session, cl *Client) {
		ctx := ctxT(t)
		for _, tc := range []struct {
			name string
			size int
			off  int64
			want int // bytes; 0: io.EOF
		}{
			{"short first piece", 300 << 10, 0, 300 << 10},
			{"first piece exactly", 512 << 10, 0, 512 << 10},
			{"short second piece", 1<<20 - 100, 0, 1<<20 - 100},
			{"whole", 1 << 20, 0, 1 << 20},
			{"from the middle", 1<<20 + 7, 4096, 1<<20 + 7 - 4096},
			{"at the end", 1 << 20, 1 << 20, 0},
			{"past the end", 1 << 20, 3 << 20, 0},
		} {
			content := randomBytes(tc.size)
			f, _ := s.splitFile(t, cl, tc.name, content)
			splits := cl.Stats().SplitReads
			waitIdle(t, cl)
			b, err := f.ReadBuf(ctx, make([]byte, 1<<20), tc.off)
			if cl.Stats().SplitReads == splits {
				t.Errorf("%s: not split", tc.name)
			}
			if tc.want == 0 {
				if b != nil || err != io.EOF {
					t.Errorf("%s: (%v, %v), want (nil, io.EOF)", tc.name, b, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			got := joined(t, b)
			b.Release()
			if !bytes.Equal(got, content[tc.off:]) {
				t.Errorf("%s: %d bytes, want the %d to the end of file", tc.name, len(got), tc.size-int(tc.off))
			}
		}
		waitIdle(t, cl)
	})
}

// An error on one piece fails the whole read with it, as one READ that
// hit it would; an error beyond end of file does not count.
func TestSplitReadErrorOnAPiece(t *testing.T) {
	inEachMode(t, server.Config{}, func(t *testing.T, e *env, s *session, cl *Client) {
		ctx := ctxT(t)
		content := randomBytes(2 << 20)
		f, pf := s.splitFile(t, cl, "f", content)
		for _, at := range []int64{0, 512 << 10} {
			pf.mu.Lock()
			pf.failAt = at
			pf.mu.Unlock()
			waitIdle(t, cl)
			splits := cl.Stats().SplitReads
			b, err := f.ReadBuf(ctx, make([]byte, 1<<20), 0)
			if cl.Stats().SplitReads == splits {
				t.Errorf("piece at %d: not split", at)
			}
			if err == nil {
				b.Release()
				t.Fatalf("piece at %d failed on the server: the read succeeded", at)
			}
			if !errors.As(err, new(protocol.Status)) {
				t.Errorf("piece at %d failed: error %v, want the server's status", at, err)
			}
		}
		// The failed pieces gave their slots and credits back.
		waitIdle(t, cl)
		pf.mu.Lock()
		pf.failAt = -1
		pf.mu.Unlock()
		b, err := f.ReadBuf(ctx, make([]byte, 1<<20), 1<<20)
		if err != nil || !bytes.Equal(joined(t, b), content[1<<20:]) {
			t.Fatalf("read after the failures: %v", err)
		}
		b.Release()
	})
}

// A cancelled context abandons every piece in flight: the read returns
// the context's error at once, and each piece's slot and credit come back
// when the server answers.
func TestSplitReadCancelled(t *testing.T) {
	e := newEnv(t, server.Config{})
	s, cl := e.newClient(t, Interrupt)
	key, g := s.gated(t, "f", randomBytes(2<<20))
	f := s.register(t, cl, key, 0)
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	waitIdle(t, cl)
	splits := cl.Stats().SplitReads
	go func() {
		b, err := f.ReadBuf(ctx, make([]byte, 1<<20), 0)
		if err == nil {
			b.Release()
		}
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // both pieces posted, held at the gate
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled split read: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled split read still waits for its pieces")
	}
	if cl.Stats().SplitReads == splits {
		t.Error("the read was not split")
	}
	g.Open()
	waitIdle(t, cl)
	b, err := f.ReadBuf(ctxT(t), make([]byte, 1<<20), 0)
	if err != nil {
		t.Fatalf("read after the cancel: %v", err)
	}
	b.Release()
}

// waitIdle waits until no connection of cl has a request in flight.
func waitIdle(t *testing.T, cl *Client) {
	t.Helper()
	waitNone(t, "requests still in flight", func() int {
		busy := 0
		for _, c := range cl.conns {
			busy += c.credits.Pending()
		}
		return busy
	})
}

// waitNone waits up to 5 s until count says 0, else fails with what.
func waitNone(t *testing.T, what string, count func() int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := count()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d %s", n, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A read whose size is not a multiple of the pieces' count is read to its
// last byte: the pieces cover it whole. Sizes a FUSE direct-I/O read can
// have (any byte count up to max_read), on 2 to 4 idle connections with
// split_read low enough that each takes a piece; with n/k a whole number
// of pages and a remainder, the k pieces of n/k pages left the remainder
// out.
func TestSplitReadCoversOddSizes(t *testing.T) {
	e := newEnv(t, server.Config{})
	content := randomBytes(2 << 20)
	for _, conns := range []int{2, 3, 4} {
		s := e.session()
		cfg := s.config(Interrupt)
		cfg.Connections, cfg.SplitRead = conns, 8192
		cl := s.client(t, cfg)
		f, _ := s.splitFile(t, cl, "f", content)
		for _, n := range []int{conns*10*4096 + 1, conns*85*4096 + conns - 1, 1<<20 - 1, 12289, 1 << 20} {
			if n > cl.MaxRead() {
				continue
			}
			waitIdle(t, cl)
			splits := cl.Stats().SplitReads
			b, err := f.ReadBuf(ctxT(t), make([]byte, n), 4096)
			if err != nil {
				t.Fatalf("%d connections, %d bytes: %v", conns, n, err)
			}
			if cl.Stats().SplitReads == splits {
				t.Errorf("%d connections, %d bytes: not split", conns, n)
			}
			got := joined(t, b)
			b.Release()
			if !bytes.Equal(got, content[4096:4096+n]) {
				t.Errorf("%d connections: a %d-byte read returned %d bytes", conns, n, len(got))
			}
		}
	}
}

// SplitReads (lwio stat's "split reads") counts reads that went as pieces:
// not one refused before any piece was sent (a closed file), nor one whose
// second piece could not be sent.
func TestSplitReadCountsOnlySentPieces(t *testing.T) {
	e := newEnv(t, server.Config{})
	s, cl := e.newClient(t, Interrupt)
	f, _ := s.splitFile(t, cl, "f", randomBytes(2<<20))
	waitIdle(t, cl)
	if err := f.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, cl)
	if b, err := f.ReadBuf(ctxT(t), make([]byte, 1<<20), 0); !errors.Is(err, ErrClosed) {
		if err == nil {
			b.Release()
		}
		t.Fatalf("read of a closed file: %v, want ErrClosed", err)
	}
	if n := cl.Stats().SplitReads; n != 0 {
		t.Errorf("a read refused before any piece was sent counted as %d split reads", n)
	}
}

// movingFile answers the read at short with only its first keep bytes, as
// a file cut there would, and the one at failAt with EIO, whatever the
// file holds: the file changed between the pieces' preads.
type movingFile struct {
	osFile
	short  int64
	keep   int
	failAt int64
}

func (f *movingFile) ReadAt(p []byte, off int64) (int, error) {
	switch off {
	case f.short:
		n, _ := f.osFile.ReadAt(p[:f.keep], off)
		return n, io.EOF
	case f.failAt:
		return 0, syscall.EIO
	}
	return f.osFile.ReadAt(p, off)
}

// A piece that comes back short ends the read there even when a later
// piece found bytes (the file grew, or was cut and grew, between the
// preads) or failed: the read returns the short piece's bytes and
// nothing of the pieces after it, as one READ at one moment would.
func TestSplitReadShortPieceEndsIt(t *testing.T) {
	inEachMode(t, server.Config{}, func(t *testing.T, e *env, s *session, cl *Client) {
		content := randomBytes(2 << 20)
		for _, tc := range []struct {
			name   string
			failAt int64
		}{{"later piece full", -1}, {"later piece failed", 512 << 10}} {
			f, _ := e.create(t, tc.name, content)
			mf := &movingFile{osFile: osFile{File: f}, short: 0, keep: 5000, failAt: tc.failAt}
			rf := s.register(t, cl, e.auth.AddFile(s.id, mf), 0)
			waitIdle(t, cl)
			splits := cl.Stats().SplitReads
			b, err := rf.ReadBuf(ctxT(t), make([]byte, 1<<20), 0)
			if cl.Stats().SplitReads == splits {
				t.Errorf("%s: not split", tc.name)
			}
			if err != nil {
				t.Fatalf("%s: %v, want the short piece's bytes", tc.name, err)
			}
			got := joined(t, b)
			b.Release()
			if !bytes.Equal(got, content[:5000]) {
				t.Errorf("%s: %d bytes, want the short piece's 5000", tc.name, len(got))
			}
		}
		waitIdle(t, cl)
	})
}

// Near the largest offset a split read answers as one READ does: a read
// ending past 2^63-1 (which the kernel never sends: it stops reads at the
// largest file size) is not split, so no piece goes out at an offset that
// wrapped, and a piece at end of file does not turn the one READ's
// invalid parameter into end of file.
func TestSplitReadNearTheLargestOffset(t *testing.T) {
	e := newEnv(t, server.Config{})
	answers := func(split int) []string {
		s := e.session()
		cfg := s.config(Interrupt)
		cfg.SplitRead = split
		cl := s.client(t, cfg)
		f, _ := s.splitFile(t, cl, "f", randomBytes(1<<20))
		var out []string
		for _, back := range []int64{1 << 20, 1<<20 - 1, 600 << 10, 100, 0} {
			waitIdle(t, cl)
			b, err := f.ReadBuf(ctxT(t), make([]byte, 1<<20), math.MaxInt64-back)
			if b != nil {
				b.Release()
			}
			out = append(out, fmt.Sprintf("MaxInt64-%d: %v", back, err))
		}
		return out
	}
	split, one := answers(0), answers(-1)
	for i := range one {
		if split[i] != one[i] {
			t.Errorf("split: %s; one READ: %s", split[i], one[i])
		}
	}
}

// With SplitRead left at 0, a client whose connections all share its
// memory with the server on this host (softrdma's "+shm" carriers, where
// the server reads in place) sends a lone 1 MiB read whole; over TCP the
// default splits it as before, and an explicit SplitRead splits it on
// shared memory too.
func TestSplitReadDefaultBySharedMemory(t *testing.T) {
	e := newEnv(t, server.Config{})
	content := randomBytes(2 << 20)
	for _, tc := range []struct {
		name   string
		tcp    bool
		sealed bool
		split  int
		want   []int
	}{
		{"shared memory, default", false, false, 0, []int{1 << 20}},
		{"shared memory, split_read=1024", false, false, 1 << 20, []int{512 << 10, 512 << 10}},
		{"tcp, default", true, false, 0, []int{512 << 10, 512 << 10}},
		// A sealed session's connections keep their "+shm" carrier
		// name but read nothing in place: the default splits.
		{"shared memory, sealed, default", false, true, 0, []int{512 << 10, 512 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := e.session()
			if tc.sealed {
				se := newEnv(t, server.Config{})
				se.auth.SealWith(smbauth.CipherAES128GCM)
				s = se.session()
			}
			cfg := s.config(Interrupt)
			if tc.sealed {
				cfg.Cipher = smbauth.CipherAES128GCM
			}
			cfg.SplitRead = tc.split
			cfg.Providers = []transport.Provider{soft.New(soft.Options{TCPOnly: tc.tcp})}
			cl := s.client(t, cfg)
			if len(cl.conns) < 2 {
				t.Fatalf("%d connections, want at least 2", len(cl.conns))
			}
			for _, ci := range cl.Conns() {
				if shm := strings.HasSuffix(ci.Carrier, "+shm"); shm == tc.tcp {
					t.Fatalf("carrier %q on a client with TCPOnly %v", ci.Carrier, tc.tcp)
				}
			}
			f, pf := s.splitFile(t, cl, "f", content)
			waitIdle(t, cl)
			b, err := f.ReadBuf(ctxT(t), make([]byte, 1<<20), 4096)
			if err != nil {
				t.Fatal(err)
			}
			if got := joined(t, b); !bytes.Equal(got, content[4096:4096+1<<20]) {
				t.Fatal("wrong data")
			}
			b.Release()
			if got := pf.reads(); !slices.Equal(got, tc.want) {
				t.Errorf("the server read %v, want %v", got, tc.want)
			}
		})
	}
}
