package main

import (
	"io"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// ssOutput is `ss -Htin state established '( sport = :4450 )'` with two
// connections, one that has sent nothing yet (no bytes_sent field).
const ssOutput = `0      0      127.0.0.1:4450 127.0.0.1:51234
	 cubic wscale:7,7 rto:204 rtt:0.05/0.02 mss:32768 bytes_sent:1000 bytes_acked:1001 bytes_received:200 segs_out:3
0      0      127.0.0.1:4450 127.0.0.1:51236
	 cubic wscale:7,7 rto:204 bytes_received:64 segs_in:2
`

func TestParseSS(t *testing.T) {
	got := parseSS(ssOutput)
	want := wireSample{"127.0.0.1:4450 127.0.0.1:51234": 1200, "127.0.0.1:4450 127.0.0.1:51236": 64}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseSS = %v, want %v", got, want)
	}
}

func TestWireBetween(t *testing.T) {
	a := wireSample{"x": 100, "y": 50, "gone": 7}
	b := wireSample{"x": 150, "y": 50, "new": 30}
	if got := wireBetween(a, b); got != 80 {
		t.Errorf("wireBetween = %d, want 80 (50 more on x, 30 on a new socket)", got)
	}
}

// TestWireSampleOfLiveSocket counts, through ss, what a loopback
// connection carries both ways, on the listening side only.
func TestWireSampleOfLiveSocket(t *testing.T) {
	port, cli, srv := loopbackPair(t)
	a, err := wireSampleOf([]int{port})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Write(make([]byte, 3000)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(srv, make([]byte, 3000)); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Write(make([]byte, 500)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(cli, make([]byte, 500)); err != nil {
		t.Fatal(err)
	}
	b, err := wireSampleOf([]int{port})
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 1 {
		t.Errorf("ss saw %d sockets on the listening port, want 1 (the server's end): %v", len(b), b)
	}
	if got := wireBetween(a, b); got != 3500 {
		t.Errorf("wire bytes = %d, want 3500", got)
	}
	if s, err := wireSampleOf(nil); s != nil || err != nil {
		t.Errorf("no ports: %v, %v; want nothing", s, err)
	}
}

// loopbackPair is a TCP connection over loopback: the listening port, the
// dialling end and the accepted end, closed when t ends.
func loopbackPair(t *testing.T) (int, net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cli, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port, cli, srv
}

func TestParseProcStat(t *testing.T) {
	// user nice system idle iowait irq softirq steal: busy = 100+2+30+4+5.
	got, err := parseProcStat("cpu  100 2 30 9000 70 4 5 8 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
	if err != nil || got != 1.41 {
		t.Errorf("parseProcStat = %v, %v; want 1.41 s", got, err)
	}
	if _, err := parseProcStat("intr 1 2 3\n"); err == nil {
		t.Error("a /proc/stat without a cpu line parsed")
	}
	if _, err := machineBusy(); err != nil {
		t.Errorf("machineBusy on this machine: %v", err)
	}
}

func TestParseEngine(t *testing.T) {
	out := `goos: linux
BenchmarkRandRead4KiB/interrupt/qd1-2         	    1250	     61234 ns/op	   0.07 MB/s	     16330 IOPS
BenchmarkRandRead4KiB/polling/qd1-2           	    1250	     80500 ns/op	   0.05 MB/s	     12422 IOPS
BenchmarkRandRead4KiB/polling/qd32-2          	    1250	     20000 ns/op
PASS
`
	got := parseEngine(out)
	want := []probeRecord{{Name: "engine-interrupt", N: 1250, MeanUs: 61.234}, {Name: "engine-polling", N: 1250, MeanUs: 80.5}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseEngine = %+v, want %+v", got, want)
	}
}

func TestParseLWIOSpec(t *testing.T) {
	for _, c := range []struct {
		in   string
		want lwioSpec
	}{
		{"lwio-auto=completion=auto", lwioSpec{Name: "lwio-auto", Mount: "completion=auto"}},
		{"lwio-sealed=mount=completion=interrupt,seal;server=-encrypt=required,-x",
			lwioSpec{Name: "lwio-sealed", Mount: "completion=interrupt,seal", Server: []string{"-encrypt=required", "-x"}}},
		{"before=bin=/tmp/b;mount=completion=polling", lwioSpec{Name: "before", Bin: "/tmp/b", Mount: "completion=polling"}},
		{"plain=", lwioSpec{Name: "plain"}},
	} {
		got, err := parseLWIOSpec(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("parseLWIOSpec(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"noequals", "=x", "nullfs=completion=polling", "x=mount=a;colour=red"} {
		if _, err := parseLWIOSpec(bad); err == nil {
			t.Errorf("parseLWIOSpec(%q) did not fail", bad)
		}
	}
}

// TestLWIOTargetsSealedDefault: the default run measures lwio-sealed
// (required sealing, both ends) beside lwio-auto.
func TestLWIOTargetsSealedDefault(t *testing.T) {
	targets, specs, err := lwioTargets(strings.Split(defaultTargets, ","), nil, "", "", "bin")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(targets, "lwio-sealed") || !slices.Contains(targets, "lwio-auto") {
		t.Fatalf("default targets %v lack the sealed/unsealed pair", targets)
	}
	want := lwioSpec{Name: "lwio-sealed", Bin: "bin", Mount: "completion=auto,seal", Server: []string{"-encrypt=required"}}
	for _, s := range specs {
		if s.Name == "lwio-sealed" && !reflect.DeepEqual(s, want) {
			t.Errorf("lwio-sealed = %+v, want %+v", s, want)
		}
	}
}

func TestLWIOTargets(t *testing.T) {
	names := strings.Split(defaultTargets, ",")
	targets, specs, err := lwioTargets(names, []string{"lwio-sealed=mount=seal;server=-encrypt=required"},
		"lwio-polling=completion=polling,conns=4", "/old", "bin")
	if err != nil {
		t.Fatal(err)
	}
	wantT := []string{"dir", "nullfs", "sshfs", "lwio-auto", "lwio-interrupt", "lwio-polling", "lwio-sealed",
		"lwio-auto-old", "lwio-interrupt-old", "lwio-polling-old", "lwio-sealed-old"}
	if !reflect.DeepEqual(targets, wantT) {
		t.Errorf("targets = %v, want %v", targets, wantT)
	}
	byName := map[string]lwioSpec{}
	for _, s := range specs {
		byName[s.Name] = s
	}
	for name, want := range map[string]lwioSpec{
		"lwio-interrupt":   {Name: "lwio-interrupt", Bin: "bin", Mount: "completion=interrupt"},
		"lwio-polling":     {Name: "lwio-polling", Bin: "bin", Mount: "completion=polling,conns=4"},
		"lwio-auto":        {Name: "lwio-auto", Bin: "bin", Mount: "completion=auto"},
		"lwio-sealed":      {Name: "lwio-sealed", Bin: "bin", Mount: "seal", Server: []string{"-encrypt=required"}},
		"lwio-polling-old": {Name: "lwio-polling-old", Bin: "/old", Mount: "completion=polling,conns=4"},
	} {
		if got := byName[name]; !reflect.DeepEqual(got, want) {
			t.Errorf("spec %s = %+v, want %+v", name, got, want)
		}
	}
	if _, _, err := lwioTargets([]string{"dir", "nfs"}, nil, "", "", "bin"); err == nil {
		t.Error("an unknown target name was accepted")
	}
}

func TestPickJobs(t *testing.T) {
	js := pickJobs(everyJob(), "meta,seqread-qd16-buffered,seqread-qd1-direct,cp")
	var names []string
	for _, j := range js {
		names = append(names, j.Name())
	}
	if want := []string{"seqread-qd1-direct", "seqread-qd16-buffered", "cp", "meta"}; !reflect.DeepEqual(names, want) {
		t.Errorf("pickJobs = %v, want %v (run order)", names, want)
	}
	for _, j := range pickJobs(everyJob(), strings.Join(headlineJobs, ",")) {
		if !j.Direct || j.Kind != kindFIO {
			t.Errorf("headline job %s is not an O_DIRECT fio job", j.Name())
		}
	}
}

func TestDefaultJobs(t *testing.T) {
	count := func(js []job) (direct, buffered int, names map[string]bool) {
		names = map[string]bool{}
		for _, j := range js {
			names[j.Name()] = true
			if j.Kind == kindFIO && j.Direct {
				direct++
			} else if j.Kind == kindFIO {
				buffered++
			}
		}
		return direct, buffered, names
	}
	d, b, full := count(defaultJobs(false))
	if d != len(allJobFiles) || b != 4 || !full["cp"] || !full["meta"] || full["randread-qd16-buffered"] || !full["randwrite-qd1-buffered"] {
		t.Errorf("full mode: %d O_DIRECT, %d buffered jobs (%v); want every file O_DIRECT, the 4 qd1 ones buffered, cp and meta", d, b, full)
	}
	d, b, quick := count(defaultJobs(true))
	if d != len(allJobFiles)-2 || b != 3 || !quick["cp"] || !quick["meta"] || quick["randread-4jobs-direct"] {
		t.Errorf("quick mode: %d O_DIRECT, %d buffered jobs (%v)", d, b, quick)
	}
	for _, h := range headlineJobs {
		if !quick[h] || !full[h] {
			t.Errorf("headline job %s is not in both modes", h)
		}
	}
}
