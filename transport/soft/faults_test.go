package soft

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
)

func TestParseFaults(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want *Faults
	}{
		{"", nil},
		{"  ", nil},
		{"reset_after=100", &Faults{ResetAfterOps: 100}},
		{"reset_after=100,delay=1ms", &Faults{ResetAfterOps: 100, DelayCompletions: time.Millisecond}},
		{"drop_after=7, conns=1 ,delay=250us", &Faults{DropAfterOps: 7, Conns: 1, DelayCompletions: 250 * time.Microsecond}},
		{"reset_after=1,drop_after=2,delay=3s,conns=4", &Faults{1, 2, 3 * time.Second, 4}},
	} {
		got, err := ParseFaults(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseFaults(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		if got == nil {
			continue
		}
		again, err := ParseFaults(got.String())
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Errorf("ParseFaults(%q.String() = %q) = %+v, %v", tc.in, got.String(), again, err)
		}
	}
	for _, bad := range []string{"reset_after", "reset_after=-1", "reset_after=x", "delay=-1ms", "delay=1", "nope=1", "reset_after=1,,", "conns=99999999999"} {
		if f, err := ParseFaults(bad); err == nil {
			t.Errorf("ParseFaults(%q) = %+v, want an error", bad, f)
		}
	}
}

func TestFaultsFromEnv(t *testing.T) {
	t.Setenv(EnvFaults, "reset_after=3")
	f, err := FaultsFromEnv()
	if err != nil || f == nil || f.ResetAfterOps != 3 {
		t.Fatalf("FaultsFromEnv = %+v, %v", f, err)
	}
}

// sendOneByOne posts n SENDs, each after the previous completed, and
// returns the statuses (the first failure ends the run).
func sendOneByOne(t *testing.T, cli transport.Conn, n int) []transport.Status {
	t.Helper()
	src := mustAlloc(t, cli, 16, transport.AccessLocal)
	var out []transport.Status
	for i := 0; i < n; i++ {
		if err := cli.Post(transport.SendWR{ID: uint64(i), Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}); err != nil {
			if !errors.Is(err, transport.ErrClosed) {
				t.Fatal(err)
			}
			return out
		}
		c := waitOne(t, cli, 10*time.Second)
		if c.ID != uint64(i) || c.Op != transport.OpSend {
			t.Fatalf("completion %+v for send %d", c, i)
		}
		out = append(out, c.Status)
		if c.Status != transport.StatusSuccess {
			return out
		}
	}
	return out
}

func postRecvs(t *testing.T, c transport.Conn, n int) {
	t.Helper()
	buf := mustAlloc(t, c, 16, transport.AccessLocal)
	wrs := make([]transport.RecvWR, n)
	for i := range wrs {
		wrs[i] = transport.RecvWR{ID: uint64(i), Buf: transport.Whole(buf)}
	}
	if err := c.PostRecv(wrs...); err != nil {
		t.Fatal(err)
	}
}

// drain collects completions until the CQ closes.
func drain(t *testing.T, c transport.Conn) []transport.Completion {
	t.Helper()
	return conformance.Drain(t, c, 10*time.Second)
}

func countStatus(cs []transport.Completion, st transport.Status) int {
	n := 0
	for _, c := range cs {
		if c.Status == st {
			n++
		}
	}
	return n
}

// TestFaultResetAfterOps: a connection with ResetAfterOps N carries
// exactly N operations, every time.
func TestFaultResetAfterOps(t *testing.T) {
	for run := 0; run < 3; run++ {
		cli, srv := pair(t, New(Options{Faults: &Faults{ResetAfterOps: 5}}), New(Options{}), transport.Config{})
		postRecvs(t, srv, 20)
		got := sendOneByOne(t, cli, 20)
		want := []transport.Status{0, 0, 0, 0, 0, transport.StatusFlushed}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("run %d: send statuses %v, want %v", run, got, want)
		}
		sc := drain(t, srv)
		if ok, fl := countStatus(sc, transport.StatusSuccess), countStatus(sc, transport.StatusFlushed); ok != 5 || fl != 15 {
			t.Fatalf("run %d: server saw %d receives and %d flushes, want 5 and 15", run, ok, fl)
		}
		drain(t, cli)
	}
}

// TestFaultResetCountsBothDirections: received requests count too.
func TestFaultResetCountsBothDirections(t *testing.T) {
	cli, srv := pair(t, New(Options{Faults: &Faults{ResetAfterOps: 4}}), New(Options{}), transport.Config{})
	postRecvs(t, srv, 10)
	postRecvs(t, cli, 10)
	src := mustAlloc(t, srv, 16, transport.AccessLocal)
	rounds := 0
	for ; rounds < 10; rounds++ {
		st := sendOneByOne(t, cli, 1)
		if len(st) != 1 || st[0] != transport.StatusSuccess {
			break
		}
		if c := waitOne(t, srv, 10*time.Second); c.Status != transport.StatusSuccess {
			t.Fatalf("server receive %+v", c)
		}
		if err := srv.Post(transport.SendWR{ID: 1, Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}); err != nil {
			t.Fatal(err)
		}
		if c := waitOne(t, cli, 10*time.Second); c.Op != transport.OpRecv || c.Status != transport.StatusSuccess {
			break
		}
	}
	// Rounds 1 and 2 carry ops 1-4; round 3's SEND would be the 5th.
	if rounds != 2 {
		t.Fatalf("%d ping-pong rounds before the reset, want 2", rounds)
	}
}

// TestFaultDropAfterOps: after N operations the connection goes silent
// and the initiator's transport timeout fails it.
func TestFaultDropAfterOps(t *testing.T) {
	opts := Options{RNRTimeout: 50 * time.Millisecond, TransportTimeout: 150 * time.Millisecond}
	faulty := opts
	faulty.Faults = &Faults{DropAfterOps: 3}
	cli, srv := pair(t, New(faulty), New(opts), transport.Config{})
	postRecvs(t, srv, 10)
	start := time.Now()
	got := sendOneByOne(t, cli, 10)
	want := []transport.Status{0, 0, 0, transport.StatusTransportError}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("send statuses %v, want %v", got, want)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("transport error after %v, before the timeout", d)
	}
	sc := drain(t, srv)
	if ok := countStatus(sc, transport.StatusSuccess); ok != 3 {
		t.Fatalf("server placed %d SENDs, want 3", ok)
	}
}

// TestFaultDelayCompletions: completions wait the delay, in order.
func TestFaultDelayCompletions(t *testing.T) {
	const delay = 80 * time.Millisecond
	cli, srv := pair(t, New(Options{Faults: &Faults{DelayCompletions: delay}}), New(Options{}), transport.Config{})
	postRecvs(t, srv, 4)
	src := mustAlloc(t, cli, 16, transport.AccessLocal)
	start := time.Now()
	for i := 0; i < 3; i++ {
		if err := cli.Post(transport.SendWR{ID: uint64(i), Op: transport.OpSend, SGL: []transport.Segment{transport.Whole(src)}}); err != nil {
			t.Fatal(err)
		}
	}
	// The server is not delayed: its receives are there at once.
	for i := 0; i < 3; i++ {
		waitOne(t, srv, 10*time.Second)
	}
	var buf [4]transport.Completion
	if n := cli.CQ().Poll(buf[:]); n != 0 && time.Since(start) < delay {
		t.Fatalf("completions before the delay: %v", buf[:n])
	}
	for i := 0; i < 3; i++ {
		c := waitOne(t, cli, 10*time.Second)
		if c.ID != uint64(i) || c.Status != transport.StatusSuccess {
			t.Fatalf("completion %d: %+v", i, c)
		}
	}
	if d := time.Since(start); d < delay {
		t.Errorf("completions after %v, want at least %v", d, delay)
	}
}

// TestFaultConnsLimit: Conns limits faults to the first connections, so
// a reconnect succeeds.
func TestFaultConnsLimit(t *testing.T) {
	p := New(Options{Faults: &Faults{ResetAfterOps: 1, Conns: 1}})
	srvP := New(Options{})
	cli1, srv1 := pair(t, p, srvP, transport.Config{})
	postRecvs(t, srv1, 4)
	if got := sendOneByOne(t, cli1, 3); len(got) != 2 || got[1] != transport.StatusFlushed {
		t.Fatalf("first connection: %v, want a reset after one send", got)
	}
	cli2, srv2 := pair(t, p, srvP, transport.Config{})
	postRecvs(t, srv2, 4)
	if got := sendOneByOne(t, cli2, 3); !reflect.DeepEqual(got, []transport.Status{0, 0, 0}) {
		t.Fatalf("second connection: %v, want no faults", got)
	}
}
