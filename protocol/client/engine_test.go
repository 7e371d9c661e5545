package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

func TestVectored(t *testing.T) {
	inEachMode(t, server.Config{}, func(t *testing.T, e *env, s *session, cl *Client) {
		content := testutil.RandBytes(3<<20 + 1000)
		key, path := s.file(t, "f", content)
		f := s.register(t, cl, key, 0)
		direct := s.register(t, cl, key, protocol.FileNoIntermediateBuffering)
		ctx := ctxT(t)

		// ReadV: 300 pages (two VEC_READs), the last partial.
		pages := make([][]byte, 300)
		for i := range pages {
			pages[i] = make([]byte, 4096)
		}
		pages[299] = pages[299][:700]
		n, err := f.ReadV(ctx, pages, 8192)
		if err != nil || n != 299*4096+700 {
			t.Fatalf("ReadV = %d, %v", n, err)
		}
		for i, pg := range pages {
			if !bytes.Equal(pg, content[8192+i*4096:8192+i*4096+len(pg)]) {
				t.Fatalf("ReadV page %d differs", i)
			}
		}
		// ReadV across the end of the file.
		tail := [][]byte{make([]byte, 4096), make([]byte, 4096)}
		n, err = f.ReadV(ctx, tail, int64(len(content)-5000))
		if n != 5000 || !errors.Is(err, io.EOF) || !bytes.Equal(tail[0], content[len(content)-5000:len(content)-904]) || !bytes.Equal(tail[1][:904], content[len(content)-904:]) {
			t.Fatalf("ReadV at EOF = %d, %v", n, err)
		}

		// WriteV, different pages: gathered.
		wp := [][]byte{testutil.RandBytes(4096), testutil.RandBytes(4096), testutil.RandBytes(100)}
		if n, err := f.WriteV(ctx, wp, 4096); err != nil || n != 8292 {
			t.Fatalf("WriteV = %d, %v", n, err)
		}
		copy(content[4096:], bytes.Join(wp, nil))
		// Identical pages on a buffered file: not collapsed.
		same := testutil.RandBytes(4096)
		if _, err := f.WriteV(ctx, [][]byte{same, same, same}, 65536); err != nil {
			t.Fatal(err)
		}
		copy(content[65536:], bytes.Repeat(same, 3))
		if c := cl.Stats().Collapsed; c != 0 {
			t.Fatalf("collapsed %d writes on a buffered file", c)
		}
		// Identical pages with FILE_NO_INTERMEDIATE_BUFFERING: collapsed,
		// 300 pages in one request.
		big := make([][]byte, 300)
		for i := range big {
			big[i] = same
		}
		big[299] = same[:1000]
		if n, err := direct.WriteV(ctx, big, 1<<20); err != nil || n != 299*4096+1000 {
			t.Fatalf("collapsed WriteV = %d, %v", n, err)
		}
		copy(content[1<<20:], bytes.Join(big, nil))
		if c := cl.Stats().Collapsed; c != 1 {
			t.Fatalf("collapsed %d writes, want 1", c)
		}
		disk, _ := os.ReadFile(path)
		if !bytes.Equal(disk, content) {
			t.Fatal("file differs from the model")
		}
	})
}

func TestReadBuf(t *testing.T) {
	inEachMode(t, server.Config{}, func(t *testing.T, e *env, s *session, cl *Client) {
		content := testutil.RandBytes(1<<20 + 10)
		f := s.newFile(t, cl, "f", content)
		ctx := ctxT(t)
		b, err := f.ReadBuf(ctx, make([]byte, 1<<20), 10)
		if err != nil || !bytes.Equal(b.Bytes(), content[10:]) {
			t.Fatalf("ReadBuf = %v", err)
		}
		b.Release()
		b, err = f.ReadBuf(ctx, make([]byte, 4096), 1<<20)
		if err != nil || len(b.Bytes()) != 10 {
			t.Fatalf("ReadBuf at EOF-10: %v", err)
		}
		b.Release()
		if _, err := f.ReadBuf(ctx, make([]byte, 4096), 2<<20); !errors.Is(err, io.EOF) {
			t.Fatalf("ReadBuf past EOF: %v", err)
		}
		// Longer than one READ: split, landing in dest (short at EOF).
		dest := make([]byte, cl.MaxRead()+4096)
		b, err = f.ReadBuf(ctx, dest, 0)
		if err != nil || !bytes.Equal(b.Bytes(), content) || &b.Bytes()[0] != &dest[0] {
			t.Fatalf("ReadBuf of %d bytes: %v", len(dest), err)
		}
		b.Release()
	})
}

// 64 requests in flight, mixed reads and writes on several files, checked
// against an in-memory model.
func TestManyInFlight(t *testing.T) {
	inEachMode(t, server.Config{}, func(t *testing.T, e *env, s *session, cl *Client) {
		const nfiles, workers, block = 4, 64, 48 << 10
		model := make([][]byte, nfiles)
		files := make([]*File, nfiles)
		paths := make([]string, nfiles)
		for i := range model {
			model[i] = testutil.RandBytes(workers / nfiles * block)
			var key protocol.ResumeKey
			key, paths[i] = s.file(t, fmt.Sprintf("f%d", i), model[i])
			files[i] = s.register(t, cl, key, 0)
		}
		ctx := ctxT(t)
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := mrand.New(mrand.NewSource(int64(w)))
				fi := w % nfiles
				base := (w / nfiles) * block
				mine := model[fi][base : base+block] // only this worker touches it
				for it := 0; it < 40; it++ {
					off := rng.Intn(block - 1)
					n := 1 + rng.Intn(block-off)
					if rng.Intn(8) == 0 {
						n = min(n, 200)
					}
					if rng.Intn(2) == 0 {
						data := make([]byte, n)
						rng.Read(data)
						if got, err := files[fi].WriteAt(ctx, data, int64(base+off)); err != nil || got != n {
							errs <- fmt.Errorf("worker %d write: %d, %v", w, got, err)
							return
						}
						copy(mine[off:], data)
					} else {
						p := make([]byte, n)
						if got, err := files[fi].ReadAt(ctx, p, int64(base+off)); err != nil || got != n {
							errs <- fmt.Errorf("worker %d read: %d, %v", w, got, err)
							return
						}
						if !bytes.Equal(p, mine[off:off+n]) {
							errs <- fmt.Errorf("worker %d read [%d,+%d) differs from the model", w, base+off, n)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		for i := range model {
			disk, _ := os.ReadFile(paths[i])
			if !bytes.Equal(disk, model[i]) {
				t.Errorf("file %d differs from the model", i)
			}
		}
		t.Logf("connections %+v stats %+v", cl.Conns(), cl.Stats())
	})
}

// Credits grow when the client keeps every credit busy, shrink back when it
// goes quiet (both delta directions through the client), and a client
// offered more than MaxCredits reports the rest unused.
func TestCreditDeltas(t *testing.T) {
	e := newEnv(t, server.Config{Credits: 4, MaxCredits: 32})
	s := e.session()
	cl := s.oneConnClient(t, Interrupt, 4, 12)
	f := s.newFile(t, cl, "f", testutil.RandBytes(1<<20))
	ctx := ctxT(t)
	// The busy spell lasts until the grant has grown (or 10 s): each
	// doubling is a delta and its CREDIT answer, and on a loaded machine
	// a fixed number of reads can end before the second one starts (the
	// server grants on the hints of requests it sees, not afterwards).
	deadline := time.Now().Add(10 * time.Second)
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, 4096)
			for i := 0; cl.Conns()[0].Credits < 12 && time.Now().Before(deadline); i++ {
				if _, err := f.ReadAt(ctx, p, int64(i%256*4096)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got := cl.Conns()[0].Credits; got != 12 {
		t.Fatalf("credits after a busy spell of 10 s: %d, want MaxCredits 12", got)
	}
	srvCredits := func() int { return e.srv.Conns()[0].Credits }
	testutil.Eventually(t, "the server's grant back at 12", 10*time.Second, func() bool { return srvCredits() == 12 }) // the unused ones came back
	// Quiet: one request at a time until the server takes credits back.
	p := make([]byte, 100)
	for i := 0; i < 1100 && cl.Conns()[0].Credits > 4; i++ {
		if _, err := f.ReadAt(ctx, p, 0); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, "4 credits on both ends", 10*time.Second, func() bool { return cl.Conns()[0].Credits == 4 && srvCredits() == 4 })
	// Still works with the smaller grant.
	if _, err := f.ReadAt(ctx, p, 0); err != nil {
		t.Fatal(err)
	}
}

// Polling mode outlasting SpinTime sends an INTERRUPT and is woken by the
// server's next completion.
func TestPollingWakeup(t *testing.T) {
	e := newEnv(t, server.Config{})
	s, cl := e.newClient(t, Polling)
	content := testutil.RandBytes(8192)
	key, g := s.gated(t, "g", content)
	f := s.register(t, cl, key, 0)
	ctx := ctxT(t)
	done := make(chan error, 1)
	p := make([]byte, 8192)
	go func() {
		_, err := f.ReadAt(ctx, p, 0)
		done <- err
	}()
	<-g.Entered
	testutil.Eventually(t, "an INTERRUPT sent", 10*time.Second, func() bool { return cl.Stats().Interrupts > 0 })
	g.Open()
	if err := <-done; err != nil || !bytes.Equal(p, content) {
		t.Fatalf("polling read after wakeup: %v", err)
	}
}

// Cancel with requests in flight: the executing one finishes, queued ones
// fail with STATUS_CANCELLED; Close fails later calls.
func TestCancelAndCloseInFlight(t *testing.T) {
	inEachMode(t, server.Config{Workers: 1}, func(t *testing.T, e *env, s *session, cl *Client) {
		key, g := s.gated(t, "g", testutil.RandBytes(8192))
		f := s.register(t, cl, key, 0)
		ctx := ctxT(t)
		results := make(chan error, 4)
		read := func() {
			p := make([]byte, 4096)
			_, err := f.ReadAt(ctx, p, 0)
			results <- err
		}
		go read()
		<-g.Entered
		for i := 0; i < 3; i++ {
			go read()
		}
		// The three are queued on the server (a credit taken on the
		// client is not yet a request there). A polling read's INTERRUPT
		// holds a credit there too until the next completion: counted,
		// the last read could come after the Cancel and wait for the gate.
		testutil.Eventually(t, "4 READs holding credits on the server", 10*time.Second, func() bool {
			return e.srv.Stats().CreditsInUse-interruptsOut(cl) >= 4
		})
		if err := f.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if err := <-results; !errors.Is(err, protocol.StatusCancelled) {
				t.Fatalf("queued read: %v, want STATUS_CANCELLED", err)
			}
		}
		g.Open()
		if err := <-results; err != nil {
			t.Fatalf("executing read: %v", err)
		}
		if err := f.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(ctx, []byte("x"), 0); !errors.Is(err, ErrClosed) {
			t.Fatalf("write after Close: %v", err)
		}
	})
}

// interruptsOut counts cl's connections with an INTERRUPT sent and not
// yet answered: each holds a credit on the server.
func interruptsOut(cl *Client) int {
	n := 0
	for _, c := range cl.conns {
		c.intrMu.Lock()
		if c.intrOut {
			n++
		}
		c.intrMu.Unlock()
	}
	return n
}

// The server dies mid-I/O: every outstanding and later call fails promptly
// and Done is closed.
func TestServerKilledMidIO(t *testing.T) {
	inEachMode(t, server.Config{}, func(t *testing.T, e *env, s *session, cl *Client) {
		key, g := s.gated(t, "g", testutil.RandBytes(1<<20))
		f := s.register(t, cl, key, 0)
		ctx := context.Background() // no deadline: the engine must not hang
		const n = 16
		results := make(chan error, n)
		for i := 0; i < n; i++ {
			go func() {
				p := make([]byte, 64<<10)
				_, err := f.ReadAt(ctx, p, 0)
				results <- err
			}()
		}
		for i := 0; i < n; i++ {
			<-g.Entered
		}
		// Kill: drop every server connection at once, as a crash would.
		e.srv.Abort()
		watchdog := time.AfterFunc(10*time.Second, func() { panic("client calls hung after the server died") })
		defer watchdog.Stop()
		for i := 0; i < n; i++ {
			var ce *protocol.ConnectionError
			if err := <-results; !errors.As(err, &ce) {
				t.Fatalf("outstanding read: %v, want *protocol.ConnectionError", err)
			}
		}
		<-cl.Done()
		if _, err := f.ReadAt(ctx, make([]byte, 10), 0); err == nil {
			t.Fatal("read after the server died succeeded")
		}
		if _, err := f.WriteAt(ctx, make([]byte, 10), 0); err == nil {
			t.Fatal("write after the server died succeeded")
		}
	})
}

// Server.Close with requests in flight lets them finish.
func TestServerCloseGraceful(t *testing.T) {
	e := newEnv(t, server.Config{})
	s, cl := e.newClient(t, Interrupt)
	content := testutil.RandBytes(1 << 20)
	key, g := s.gated(t, "g", content)
	f := s.register(t, cl, key, 0)
	ctx := ctxT(t)
	results := make(chan error, 8)
	for i := 0; i < 8; i++ {
		go func() {
			p := make([]byte, 4096)
			_, err := f.ReadAt(ctx, p, 0)
			if err == nil && !bytes.Equal(p, content[:4096]) {
				err = errors.New("wrong data")
			}
			results <- err
		}()
	}
	for i := 0; i < 8; i++ {
		<-g.Entered
	}
	closed := make(chan struct{})
	go func() { e.srv.Close(); close(closed) }()
	g.Open()
	for i := 0; i < 8; i++ {
		if err := <-results; err != nil {
			t.Fatalf("in-flight read during Close: %v", err)
		}
	}
	<-closed
	<-cl.Done()
}

// Authentication fails closed.
func TestAuthFailsClosed(t *testing.T) {
	e := newEnv(t, server.Config{})
	for _, c := range []struct {
		name  string
		spoil func(s *session, cfg *Config)
		want  error // what New's error is; nil: any
	}{
		{"wrong signing key", func(s *session, _ *Config) {
			s.key = []byte("the server knows another key....") // what Negotiate registers
		}, errAuth},
		{"server names another session", func(_ *session, cfg *Config) { cfg.SessionID++ }, errAuth},
		{"no common provider", func(_ *session, cfg *Config) {
			cfg.Providers = []transport.Provider{renamed{soft.New(soft.Options{})}}
		}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := e.session()
			cfg := s.config(Interrupt)
			c.spoil(s, &cfg)
			_, err := New(ctxT(t), cfg)
			if err == nil {
				t.Fatal("New succeeded")
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("New: %v, want %v", err, c.want)
			}
		})
	}
}

type renamed struct{ transport.Provider }

func (renamed) Name() string { return "other" }

// A request whose context ends is abandoned, not leaked: its credit comes
// back when the server answers, and the connection keeps working.
func TestAbandonedRequest(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			s, cl := newEnv(t, server.Config{}).oneConn(t, mode)
			content := testutil.RandBytes(64 << 10)
			key, g := s.gated(t, "g", content)
			f := s.register(t, cl, key, 0)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := f.ReadAt(ctx, make([]byte, 8192), 0)
				done <- err
			}()
			<-g.Entered
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled read: %v", err)
			}
			g.Open()
			testutil.Eventually(t, "the abandoned request's credit back", 10*time.Second, func() bool { return cl.conns[0].credits.Used() == 0 })
			p := make([]byte, 8192)
			for i := 0; i < 50; i++ {
				if _, err := f.ReadAt(ctxT(t), p, 4096); err != nil || !bytes.Equal(p, content[4096:4096+8192]) {
					t.Fatalf("read after an abandoned one: %v", err)
				}
			}
		})
	}
}

// One slow read does not stall the connection: others complete meanwhile.
func TestSlowReadDoesNotStall(t *testing.T) {
	s, cl := newEnv(t, server.Config{}).oneConn(t, Interrupt)
	slowKey, g := s.gated(t, "slow", testutil.RandBytes(4096))
	slow := s.register(t, cl, slowKey, 0)
	content := testutil.RandBytes(1 << 20)
	fast := s.newFile(t, cl, "fast", content)
	ctx := ctxT(t)
	done := make(chan error, 1)
	go func() {
		_, err := slow.ReadAt(ctx, make([]byte, 4096), 0)
		done <- err
	}()
	<-g.Entered
	p := make([]byte, 1<<20)
	for i := 0; i < 20; i++ {
		if _, err := fast.ReadAt(ctx, p, 0); err != nil || !bytes.Equal(p, content) {
			t.Fatalf("read beside a stalled one: %v", err)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("the slow read finished early: %v", err)
	default:
	}
	g.Open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A server with the seed's small receive buffers: requests are split to
// fit, never sent longer than MaxRecvBufferSize.
func TestSmallServerBuffers(t *testing.T) {
	e := newEnv(t, server.Config{MaxRecvBufferSize: 2048, MaxRdmaWindowSize: 64 << 10})
	s, cl := e.newClient(t, Interrupt)
	content := testutil.RandBytes(1 << 20)
	key, path := s.file(t, "f", content)
	f := s.register(t, cl, key, protocol.FileNoIntermediateBuffering)
	ctx := ctxT(t)
	// Writes go fragmented, 2000 bytes a message, up to the window.
	if cl.MaxWrite() != 64<<10 || cl.MaxRead() != 64<<10 {
		t.Fatalf("limits %d/%d", cl.MaxWrite(), cl.MaxRead())
	}
	pages := make([][]byte, 200)
	for i := range pages {
		pages[i] = make([]byte, 4096)
	}
	if n, err := f.ReadV(ctx, pages, 0); err != nil || n != 200*4096 || !bytes.Equal(bytes.Join(pages, nil), content[:200*4096]) {
		t.Fatalf("ReadV = %d, %v", n, err)
	}
	data := testutil.RandBytes(100 << 10)
	if n, err := f.WriteAt(ctx, data, 5); err != nil || n != len(data) {
		t.Fatalf("WriteAt = %d, %v", n, err)
	}
	copy(content[5:], data)
	same := testutil.RandBytes(4096)
	if n, err := f.WriteV(ctx, [][]byte{same, same, same}, 300000); err != nil || n != 3*4096 {
		t.Fatalf("WriteV of identical 4 KiB pages = %d, %v", n, err)
	}
	copy(content[300000:], bytes.Repeat(same, 3))
	disk, _ := os.ReadFile(path)
	if !bytes.Equal(disk, content) {
		t.Fatal("file differs")
	}
}
