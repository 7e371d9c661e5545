package verbs

import (
	"context"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
)

// benchPair connects two verbs providers, or skips the benchmark (with the
// reason) where verbs is unusable.
func benchPair(b *testing.B) (cli, srv transport.Conn) {
	b.Helper()
	return connectPair(b, usable(b))
}

// connectPair connects two verbs providers on addr (from usable); both
// connections and the listener are closed when the test ends.
func connectPair(tb testing.TB, addr string) (cli, srv transport.Conn) {
	tb.Helper()
	ln, err := New(Options{}).Listen(addr, transport.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	return conformance.Connect(tb, New(Options{}), ln, ln.Addr(), transport.Config{}, 30*time.Second)
}

func benchAlloc(b *testing.B, c transport.Conn, n int, acc transport.Access) transport.Region {
	r, err := c.Domain().Alloc(n, acc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Deregister() })
	return r
}

// benchWrite keeps depth RDMA WRITEs of size bytes in flight.
func benchWrite(b *testing.B, size int) {
	cli, srv := benchPair(b)
	const depth = 16
	src := benchAlloc(b, cli, size, transport.AccessLocal)
	dst := benchAlloc(b, srv, size, transport.AccessLocal|transport.AccessRemoteWrite)
	wr := transport.SendWR{Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(src)}, RemoteAddr: dst.Addr(), RKey: dst.Handle()}
	ctx := context.Background()
	comps := make([]transport.Completion, depth)
	b.SetBytes(int64(size))
	b.ResetTimer()
	posted, done := 0, 0
	for done < b.N {
		for posted < b.N && posted-done < depth {
			wr.ID = uint64(posted)
			if err := cli.Post(wr); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		done += len(conformance.WaitOK(ctx, b, cli, comps))
	}
}

func BenchmarkWrite64K(b *testing.B) { benchWrite(b, 64<<10) }
func BenchmarkWrite1M(b *testing.B)  { benchWrite(b, 1<<20) }

// BenchmarkSendRoundTrip64: a 64-byte SEND and a 64-byte reply.
func BenchmarkSendRoundTrip64(b *testing.B) {
	cli, srv := benchPair(b)
	cbuf := benchAlloc(b, cli, 128, transport.AccessLocal)
	sbuf := benchAlloc(b, srv, 128, transport.AccessLocal)
	cs, cr := transport.Segment{Region: cbuf, Length: 64}, transport.Segment{Region: cbuf, Offset: 64, Length: 64}
	ss, sr := transport.Segment{Region: sbuf, Length: 64}, transport.Segment{Region: sbuf, Offset: 64, Length: 64}
	ctx := context.Background()
	if err := srv.PostRecv(transport.RecvWR{Buf: sr}); err != nil {
		b.Fatal(err)
	}
	if err := cli.PostRecv(transport.RecvWR{Buf: cr}); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		comps := make([]transport.Completion, 4)
		for i := 0; i < b.N; {
			n, err := srv.CQ().Wait(ctx, comps)
			if err != nil {
				done <- err
				return
			}
			for _, c := range comps[:n] {
				if c.Err() != nil {
					done <- c.Err()
					return
				}
				if c.Op != transport.OpRecv {
					continue
				}
				i++
				if err := srv.PostRecv(transport.RecvWR{Buf: sr}); err != nil {
					done <- err
					return
				}
				if err := srv.Post(transport.SendWR{Op: transport.OpSend, SGL: []transport.Segment{ss}}); err != nil {
					done <- err
					return
				}
			}
		}
		done <- nil
	}()
	comps := make([]transport.Completion, 4)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := cli.Post(transport.SendWR{Op: transport.OpSend, SGL: []transport.Segment{cs}}); err != nil {
			b.Fatal(err)
		}
		for got := false; !got; {
			for _, c := range conformance.WaitOK(ctx, b, cli, comps) {
				if c.Op == transport.OpRecv {
					got = true
					if err := cli.PostRecv(transport.RecvWR{Buf: cr}); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
	}
	b.StopTimer()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
