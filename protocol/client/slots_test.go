package client

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
)

// behindWriter is one file's writer as fs's write-behind drives it
// (fs/writeasync.go): it keeps up to depth WriteAsync writes in flight and
// waits for its oldest only when it has depth of them.
type behindWriter struct {
	f     *File
	depth int
	q     []*PendingWrite
}

// step posts one write of p at off, first waiting for the oldest write
// when depth are in flight.
func (w *behindWriter) step(p []byte, off int64) error {
	if len(w.q) >= w.depth {
		if err := w.waitOldest(len(p)); err != nil {
			return err
		}
	}
	pw, err := w.f.WriteAsync(context.Background(), p, off)
	if err != nil {
		return err
	}
	w.q = append(w.q, pw)
	return nil
}

func (w *behindWriter) waitOldest(want int) error {
	n, err := w.q[0].Wait(context.Background())
	w.q = w.q[1:]
	if err == nil && n != want {
		err = fmt.Errorf("wrote %d of %d bytes", n, want)
	}
	return err
}

// Many files writing behind on one connection, more writes posted than
// the connection has request slots (maxSlots): 64 files, each keeping up
// to 8 writes in flight as fs's write-behind does. The writers post in
// lockstep rounds, so after round 4 the 256 slots hold 4 posted writes of
// every file and no writer has 8 in flight: no writer waits on one of its
// own. A posted write kept its slot until its Wait, so the fifth round's
// posts waited for a free slot that only those Waits would give back, and
// every writer hung — a mount whose make -j or cp of many open files
// writes behind stops for good. A posted write's slot must come back with
// its answer.
func TestWriteBehindManyFilesOneConn(t *testing.T) {
	const files, depth, rounds, size = 64, 8, 20, 64 << 10
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			s, cl := newEnv(t, server.Config{}).oneConn(t, mode)
			ws := make([]*behindWriter, files)
			data := make([][]byte, files)
			for i := range ws {
				ws[i] = &behindWriter{f: s.newFile(t, cl, fmt.Sprintf("f%d", i), nil), depth: depth}
				data[i] = testutil.RandBytes(rounds * size)
			}
			// One goroutine per writer, as FUSE runs one per request;
			// each round every writer takes one step.
			steps := make([]chan int, files)
			errs := make(chan error, files)
			for i, w := range ws {
				steps[i] = make(chan int)
				go func() {
					for r := range steps[i] {
						off := r * size
						errs <- w.step(data[i][off:off+size], int64(off))
					}
				}()
			}
			done := make(chan struct{})
			var err error
			go func() {
				defer close(done)
				defer func() {
					for _, ch := range steps {
						close(ch)
					}
				}()
				for r := 0; r < rounds; r++ {
					for _, ch := range steps {
						ch <- r
					}
					for range steps {
						if e := <-errs; e != nil && err == nil {
							err = fmt.Errorf("round %d: %w", r, e)
						}
					}
					if err != nil {
						return
					}
				}
				for i, w := range ws {
					for len(w.q) > 0 {
						if e := w.waitOldest(size); e != nil {
							err = fmt.Errorf("file %d: %w", i, e)
							return
						}
					}
				}
			}()
			watchdog(t, fmt.Sprintf("%d files writing behind, %d deep, on one connection", files, depth), time.Minute, done)
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range ws {
				got := make([]byte, len(data[i]))
				if n, err := w.f.ReadAt(context.Background(), got, 0); n != len(got) || !bytes.Equal(got, data[i]) {
					t.Fatalf("file %d reads back %d of %d bytes (%v), equal %v", i, n, len(got), err, bytes.Equal(got, data[i]))
				}
			}
		})
	}
}

// Delta-credit handshakes give their request slots back. Bursts of 64
// concurrent reads grow the connection's grant from 2 to 128 credits (a
// CREDIT answering each positive delta), and a long run of single reads
// makes the server take them back (a CREDIT per credit retired), cycle
// after cycle, until the connection has made twice as many CREDIT
// requests as it has slots. sendCredit kept its slot after the answer,
// so a mount whose grant went up and down long enough had every slot
// taken by CREDITs long finished, and its next request waited for good.
func TestCreditHandshakesGiveSlotsBack(t *testing.T) {
	const burst, most, cycles = 64, 128, 12
	e := newEnv(t, server.Config{Credits: 2, MaxCredits: most})
	cl, f := oneConnFile(t, e, Interrupt, 2, most, 4096)
	credits := func() int { return cl.Conns()[0].Credits }
	handshakes := func() uint64 { return cl.Stats().Ops["CREDIT"].Count }
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		read := func() error {
			var b [512]byte
			_, err := f.ReadAt(context.Background(), b[:], 0)
			return err
		}
		for c := 0; c < cycles && handshakes() < 2*maxSlots; c++ {
			// Grow: bursts of reads, each outstanding until all are.
			for i := 0; i < 50 && credits() < most; i++ {
				errs := make(chan error, burst)
				for j := 0; j < burst; j++ {
					go func() { errs <- read() }()
				}
				for j := 0; j < burst; j++ {
					if e := <-errs; e != nil && err == nil {
						err = e
					}
				}
				if err != nil {
					return
				}
			}
			// Shrink: one read at a time, a hint far under the grant.
			for i := 0; i < 20000 && credits() > 2; i++ {
				if err = read(); err != nil {
					return
				}
			}
		}
	}()
	watchdog(t, "reads while the grant goes up and down", 2*time.Minute, done)
	if err != nil {
		t.Fatal(err)
	}
	n := handshakes()
	t.Logf("%d CREDIT requests on a connection of %d slots; %+v", n, maxSlots, cl.Stats().Ops["CREDIT"])
	if n < 2*maxSlots {
		t.Fatalf("only %d CREDIT requests in %d cycles: the grant did not go up and down enough to prove anything", n, cycles)
	}
}

// A posted write whose connection is lost before its answer gives its
// bytes back from Data (fs's Reconnector writes them again on the next
// session), a small write's from the slot's send area as a large one's
// from its pooled buffer: the slot a posted write frees on its answer is
// not freed, nor reused, without one.
func TestPostedWriteLostKeepsItsBytes(t *testing.T) {
	s, cl := newEnv(t, server.Config{}).oneConn(t, Interrupt)
	key, g := s.gated(t, "g", nil)
	f := s.register(t, cl, key, 0)
	data := [][]byte{testutil.RandBytes(1000), testutil.RandBytes(64 << 10), testutil.RandBytes(3000)}
	var pws []*PendingWrite
	off := int64(0)
	for _, p := range data {
		pw, err := f.WriteAsync(ctxT(t), p, off)
		if err != nil {
			t.Fatal(err)
		}
		pws = append(pws, pw)
		off += int64(len(p))
	}
	<-g.Entered // the server holds one: no answer comes before the close
	cl.Close()
	for i, pw := range pws {
		n, err := pw.Wait(ctxT(t))
		if !protocol.IsConnectionLost(err) {
			t.Fatalf("write %d: %d bytes, %v; want the connection lost", i, n, err)
		}
		if !bytes.Equal(pw.Data(), data[i]) {
			t.Fatalf("write %d: Data has %d bytes, not the %d written", i, len(pw.Data()), len(data[i]))
		}
	}
}

// A write WriteAsync cannot post but writes at once (longer than MaxWrite)
// on a lost connection fails from WriteAsync itself, as one it posts
// does: fs's Reconnector sees the lost connection there and writes it on
// the next session. Hidden in a PendingWrite already done, the error came
// only at Wait, which cannot send those bytes again, and the write failed
// with EIO.
func TestWriteAsyncLostFailsAtOnce(t *testing.T) {
	e := newEnv(t, server.Config{})
	s, cl := e.oneConn(t, Interrupt)
	f := s.newFile(t, cl, "f", nil)
	e.srv.Abort()
	<-cl.Done()
	for _, size := range []int{1000, int(cl.MaxWrite()) + 1} {
		pw, err := f.WriteAsync(ctxT(t), make([]byte, size), 0)
		if !protocol.IsConnectionLost(err) || pw != nil {
			t.Errorf("WriteAsync of %d bytes on a lost connection: %v, %v; want no PendingWrite and the connection lost", size, pw, err)
		}
	}
}
