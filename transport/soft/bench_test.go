package soft

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
)

// The benchmarks put softrdma next to a raw TCP socket doing the same
// transfer in the same run (docs/transport.md records the figures):
//
//	go test -run '^$' -bench . -benchtime 2s -count 3 ./transport/soft/

func BenchmarkWrite(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		name := fmt.Sprintf("%dKiB", size>>10)
		b.Run(name+"/softrdma", func(b *testing.B) { benchSoftWrite(b, size, false) })
		b.Run(name+"/softrdma-sealed", func(b *testing.B) { benchSoftWrite(b, size, true) })
		b.Run(name+"/rawtcp", func(b *testing.B) { benchRawWrite(b, size) })
	}
}

func BenchmarkRoundTrip64(b *testing.B) {
	b.Run("softrdma", benchSoftRoundTrip)
	b.Run("rawtcp", benchRawRoundTrip)
}

// writeWindow is how many bytes of RDMA WRITEs the benchmark keeps in
// flight, as a client keeping several 1 MiB reads outstanding would.
const writeWindow = 8 << 20

func benchSoftWrite(b *testing.B, size int, sealed bool) {
	cli, srv := pair(b, New(Options{}), New(Options{}), transport.Config{})
	if sealed {
		sealPair(b, cli, srv, false)
	}
	depth := max(writeWindow/size, 2)
	src := mustAlloc(b, cli, size, transport.AccessLocal)
	dst := mustAlloc(b, srv, size*depth, transport.AccessLocal|transport.AccessRemoteWrite)
	ctx := context.Background()
	comps := make([]transport.Completion, 64)
	wrs := []transport.SendWR{{Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(src)}, RKey: dst.Handle()}}
	wr := &wrs[0]
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	posted, done := 0, 0
	for done < b.N {
		for posted < b.N && posted-done < depth {
			wr.ID = uint64(posted)
			wr.RemoteAddr = dst.Addr() + uint64((posted%depth)*size)
			if err := cli.Post(wrs...); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		done += len(conformance.WaitOK(ctx, b, cli, comps))
	}
}

// tcpPair returns a connected loopback TCP pair.
func tcpPair(b *testing.B) (cli, srv net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			b.Error(err)
		}
		ch <- c
	}()
	cli, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	srv = <-ch
	b.Cleanup(func() { cli.Close(); srv.Close() })
	return cli, srv
}

func benchRawWrite(b *testing.B, size int) {
	cli, srv := tcpPair(b)
	src := make([]byte, size)
	dst := make([]byte, size)
	done := make(chan error, 1)
	n := b.N
	go func() {
		var err error
		for i := 0; i < n && err == nil; i++ {
			_, err = io.ReadFull(srv, dst)
		}
		done <- err
	}()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < n; i++ {
		if _, err := cli.Write(src); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

func benchSoftRoundTrip(b *testing.B) {
	cli, srv := pair(b, New(Options{}), New(Options{}), transport.Config{})
	const size = 64
	csrc := mustAlloc(b, cli, size, transport.AccessLocal)
	cdst := mustAlloc(b, cli, size, transport.AccessLocal)
	sbuf := mustAlloc(b, srv, size, transport.AccessLocal)
	ssrc := mustAlloc(b, srv, size, transport.AccessLocal)
	if err := srv.PostRecv(transport.RecvWR{Buf: transport.Whole(sbuf)}); err != nil {
		b.Fatal(err)
	}
	// The server echoes: every receive is answered with a SEND.
	go func() {
		comps := make([]transport.Completion, 16)
		// Reused slices: a variadic call through an interface would
		// otherwise allocate its argument slice on every call.
		reply := []transport.SendWR{{Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(ssrc)}}}
		rearm := []transport.RecvWR{{Buf: transport.Whole(sbuf)}}
		for {
			n, err := srv.CQ().Wait(context.Background(), comps)
			if err != nil {
				return
			}
			for _, c := range comps[:n] {
				if c.Status != transport.StatusSuccess {
					return
				}
				if c.Op == transport.OpRecv {
					_ = srv.PostRecv(rearm...)
					_ = srv.Post(reply...)
				}
			}
		}
	}()
	ctx := context.Background()
	comps := make([]transport.Completion, 16)
	req := []transport.SendWR{{Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(csrc)}}}
	recv := []transport.RecvWR{{Buf: transport.Whole(cdst)}}
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := cli.PostRecv(recv...); err != nil {
			b.Fatal(err)
		}
		if err := cli.Post(req...); err != nil {
			b.Fatal(err)
		}
		for got := false; !got; {
			for _, c := range conformance.WaitOK(ctx, b, cli, comps) {
				got = got || c.Op == transport.OpRecv
			}
		}
	}
}

func benchRawRoundTrip(b *testing.B) {
	cli, srv := tcpPair(b)
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(srv, buf); err != nil {
				return
			}
			if _, err := srv.Write(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64)
	b.SetBytes(64)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := cli.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(cli, buf); err != nil {
			b.Fatal(err)
		}
	}
}
