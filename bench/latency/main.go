// Command latency measures the pieces a 4 KiB qd1 read through lwio-mount
// is made of, each on its own, so `make bench` can set them beside the
// mount's own p50 (docs/bench.md, "Where a 4K read's time goes"):
//
//	latency serve -net soft|tcp|unix|pipe [-listen ADDR] # the echoing peer; prints "listening ADDR"
//	latency ping  -net soft|tcp|unix|pipe -addr ADDR [-n 20000] # round trips from another process
//	latency pread -file F [-n 20000]                    # 4 KiB preads at random offsets
//
// A round trip has the shape of a READ: a 64-byte request one way, 4 KiB
// back. Over softrdma the request is a SEND and the answer an RDMA WRITE
// WITH IMMEDIATE into a region the pinger registered (the data and the
// completion in one message, the cheapest way a READ can complete); over
// TCP it is a 64-byte write answered by a 4 KiB write. Both ends wait for
// completions by blocking (CQ.Wait, a blocking read), as the engines do in
// interrupt mode. Each command prints one JSON line: n, p50_us, p99_us,
// mean_us.
//
// -net unix and -net pipe are the plain-socket round trip of -net tcp over
// the carriers a same-host connection could use: an AF_UNIX stream socket
// (what softrdma moves to on one host) and two FIFOs, one per direction
// (ADDR is a directory serve makes). They differ in who the kernel wakes:
// a unix socket wakes the writer's poller whenever the reader consumes
// (unix_write_space), a pipe only when it was full (docs/bench.md, "4 KiB
// at qd1 over the unix socket").
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

const (
	defaultListen = "127.0.0.1:0"
	reqSize       = 64
	respSize      = 4096
	warmup        = 500
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	network := fs.String("net", "soft", "soft (softrdma), tcp, unix or pipe")
	listen := fs.String("listen", defaultListen, "serve: address to listen on (-net unix: a path or @abstract name)")
	addr := fs.String("addr", "", "ping: the server's address")
	n := fs.Int("n", 20000, "ping, pread: timed operations (after warm-up)")
	file := fs.String("file", "", "pread: the file to read")
	timeout := fs.Duration("timeout", 60*time.Second, "ping, pread: give up after this long")
	_ = fs.Parse(os.Args[2:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(ctx, *network, *listen, func(addr string) { fmt.Printf("listening %s\n", addr) })
	case "ping":
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		var d []time.Duration
		if d, err = ping(ctx, *network, *addr, *n); err == nil {
			err = report(d)
		}
	case "pread":
		var d []time.Duration
		if d, err = preads(*file, *n); err == nil {
			err = report(d)
		}
	default:
		usage()
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "latency %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: latency serve|ping|pread [flags] (latency CMD -h)")
	os.Exit(2)
}

// result is what every command prints, one JSON line.
type result struct {
	N      int     `json:"n"`
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	MeanUs float64 `json:"mean_us"`
}

func report(d []time.Duration) error {
	if len(d) == 0 {
		return errors.New("nothing measured")
	}
	slices.Sort(d)
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	us := func(x time.Duration) float64 { return float64(x) / float64(time.Microsecond) }
	return json.NewEncoder(os.Stdout).Encode(result{
		N: len(d), P50us: us(d[len(d)/2]), P99us: us(d[len(d)*99/100]), MeanUs: us(sum / time.Duration(len(d))),
	})
}

// timed runs op warmup times untimed, then n times timed.
func timed(n int, op func() error) ([]time.Duration, error) {
	return timedUntil(n, func(time.Time) (time.Duration, error) {
		t0 := time.Now()
		err := op()
		return time.Since(t0), err
	})
}

// timedUntil is timed for an op that says itself how long it took: one
// whose end of measurement comes before the end of its work.
func timedUntil(n int, op func(time.Time) (time.Duration, error)) ([]time.Duration, error) {
	d := make([]time.Duration, 0, n)
	for i := 0; i < warmup+n; i++ {
		took, err := op(time.Now())
		if err != nil {
			return nil, err
		}
		if i >= warmup {
			d = append(d, took)
		}
	}
	return d, nil
}

// preads reads 4 KiB at random aligned offsets of file, as lwio-server
// does for a READ: the server's own share of a 4 KiB read.
func preads(file string, n int) ([]time.Duration, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	blocks := fi.Size() / respSize
	if blocks < 1 {
		return nil, fmt.Errorf("%s is smaller than %d bytes", file, respSize)
	}
	buf := make([]byte, respSize)
	rng := rand.New(rand.NewSource(1))
	fd := int(f.Fd())
	return timed(n, func() error {
		_, err := unix.Pread(fd, buf, rng.Int63n(blocks)*respSize)
		return err
	})
}

// serve answers round trips until ctx ends; ready hears the address once
// it listens.
func serve(ctx context.Context, network, addr string, ready func(addr string)) error {
	switch network {
	case "tcp", "unix":
		if network == "unix" && addr == defaultListen {
			addr = fmt.Sprintf("@lwiofs-latency-%d", os.Getpid())
		}
		ln, err := net.Listen(network, addr)
		if err != nil {
			return err
		}
		ready(ln.Addr().String())
		go func() { <-ctx.Done(); ln.Close() }()
		for {
			c, err := ln.Accept()
			if err != nil {
				return ctx.Err()
			}
			go func() { defer c.Close(); echoStream(c, c) }()
		}
	case "pipe":
		return servePipe(ctx, ready)
	case "soft":
		ln, err := soft.New(soft.Options{NoPipes: soft.NoPipesFromEnv()}).Listen(addr, transport.Config{})
		if err != nil {
			return err
		}
		ready(ln.Addr())
		go func() { <-ctx.Done(); ln.Close() }()
		for {
			c, err := ln.Accept(ctx)
			if err != nil {
				return ctx.Err()
			}
			// It ends when the pinger goes; a real failure shows there.
			go func() { _ = echoSoft(ctx, c) }()
		}
	}
	return fmt.Errorf("-net %q: want soft, tcp, unix or pipe", network)
}

// echoStream answers a tcp, unix or pipe pinger: reads requests from r,
// writes answers to w.
func echoStream(r io.Reader, w io.Writer) {
	req, resp := make([]byte, reqSize), make([]byte, respSize)
	for {
		if _, err := io.ReadFull(r, req); err != nil {
			return
		}
		if _, err := w.Write(resp); err != nil {
			return
		}
	}
}

// echoSoft answers every SEND with an RDMA WRITE WITH IMMEDIATE of 4 KiB
// into the region the pinger named in its first SEND (address, handle).
func echoSoft(ctx context.Context, c transport.Conn) error {
	defer c.Close()
	in, err := c.Domain().Alloc(reqSize, transport.AccessLocal)
	if err != nil {
		return err
	}
	out, err := c.Domain().Alloc(respSize, transport.AccessLocal)
	if err != nil {
		return err
	}
	// Slices reused across calls: a variadic call through an interface
	// would otherwise allocate on every request.
	rearm := []transport.RecvWR{{Buf: transport.Whole(in)}}
	reply := []transport.SendWR{{Op: transport.OpWrite, SGL: []transport.Segment{transport.Whole(out)}, HasImm: true}}
	if err := c.PostRecv(rearm...); err != nil {
		return err
	}
	comps := make([]transport.Completion, 16)
	for {
		n, err := c.CQ().Wait(ctx, comps)
		if err != nil {
			return err
		}
		for _, cp := range comps[:n] {
			if err := cp.Err(); err != nil {
				return err
			}
			if cp.Op != transport.OpRecv {
				continue
			}
			if reply[0].RKey == 0 {
				// The first SEND names the pinger's region.
				b := in.Bytes()
				reply[0].RemoteAddr, reply[0].RKey = binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint32(b[8:])
			}
			if err := c.PostRecv(rearm...); err != nil {
				return err
			}
			if err := c.Post(reply...); err != nil {
				return err
			}
		}
	}
}

func ping(ctx context.Context, network, addr string, n int) ([]time.Duration, error) {
	switch network {
	case "tcp", "unix":
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		return pingStream(c, c, n)
	case "pipe":
		r, w, err := dialPipe(addr)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		defer w.Close()
		return pingStream(r, w, n)
	case "soft":
		c, err := soft.New(soft.Options{NoPipes: soft.NoPipesFromEnv()}).Dial(ctx, addr, transport.Config{})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return pingSoft(ctx, c, n)
	}
	return nil, fmt.Errorf("-net %q: want soft, tcp, unix or pipe", network)
}

// pingStream times round trips over a byte stream: the request written to
// w, the answer read from r.
func pingStream(r io.Reader, w io.Writer, n int) ([]time.Duration, error) {
	req, resp := make([]byte, reqSize), make([]byte, respSize)
	return timed(n, func() error {
		if _, err := w.Write(req); err != nil {
			return err
		}
		_, err := io.ReadFull(r, resp)
		return err
	})
}

func pingSoft(ctx context.Context, c transport.Conn, n int) ([]time.Duration, error) {
	req, err := c.Domain().Alloc(reqSize, transport.AccessLocal)
	if err != nil {
		return nil, err
	}
	dst, err := c.Domain().Alloc(respSize, transport.AccessLocal|transport.AccessRemoteWrite)
	if err != nil {
		return nil, err
	}
	binary.LittleEndian.PutUint64(req.Bytes(), dst.Addr())
	binary.LittleEndian.PutUint32(req.Bytes()[8:], dst.Handle())
	// The WRITE WITH IMMEDIATE consumes a posted receive; its buffer is
	// never written.
	recv := []transport.RecvWR{{Buf: transport.Segment{Region: req, Length: 0}}}
	send := []transport.SendWR{{Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(req)}}}
	comps := make([]transport.Completion, 16)
	return timedUntil(n, func(t0 time.Time) (took time.Duration, err error) {
		if err := c.PostRecv(recv...); err != nil {
			return 0, err
		}
		if err := c.Post(send...); err != nil {
			return 0, err
		}
		// The round trip ends when the answer lands; the SEND's own
		// completion (the peer's acknowledgement) is reaped before the
		// next iteration, untimed, so the send queue never fills.
		for gotRecv, gotSend := false, false; !gotRecv || !gotSend; {
			k, err := c.CQ().Wait(ctx, comps)
			if err != nil {
				return 0, err
			}
			for _, cp := range comps[:k] {
				if err := cp.Err(); err != nil {
					return 0, err
				}
				if cp.Op == transport.OpRecv && !gotRecv {
					gotRecv, took = true, time.Since(t0)
				}
				gotSend = gotSend || cp.Op == transport.OpSend
			}
		}
		return took, nil
	})
}
