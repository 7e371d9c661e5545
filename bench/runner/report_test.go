package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if !math.IsNaN(median(nil)) {
		t.Errorf("median(nil) is not NaN")
	}
}

// records builds one repetition's records on the tmpfs export: each target
// a scale of nullfs's figures; every job moves 1 GiB with 1 s client and
// 2 s server CPU, and the lwiofs and sshfs targets 2 GiB on the wire.
func records() []record {
	var rs []record
	add := func(target, job string, mibps, iops, p50 float64) {
		hasServer := target == "sshfs" || strings.HasPrefix(target, "lwio")
		rs = append(rs, record{Export: exportTmpfs, Target: target, Job: job, MiBps: mibps, IOPS: iops, P50us: p50, Seconds: 1000 / mibps,
			Bytes: 1 << 30, ClientCPU: 1, ServerCPU: 2, AppCPU: 0.5, MachineCPU: 4, WireBytes: 2 << 30, HasWire: hasServer,
			HasClient: target != "dir", HasSrvr: hasServer})
	}
	for _, tg := range []struct {
		name  string
		scale float64
	}{{"dir", 2}, {"nullfs", 1}, {"sshfs", 0.1}, {"lwio-polling", 0.95}} {
		for _, j := range bigDirect {
			add(tg.name, j, 1000*tg.scale, 1000*tg.scale, 1000/tg.scale)
		}
		add(tg.name, "randread-qd1-direct", 40*tg.scale, 10000*tg.scale, 100/tg.scale)
		add(tg.name, "randread-qd16-direct", 160*tg.scale, 40000*tg.scale, 400/tg.scale)
		add(tg.name, kindCp, 1000*tg.scale, 0, 0)
	}
	return rs
}

func probes() []probeRecord {
	return []probeRecord{
		{Name: probeTCP, N: 100, P50us: 20, P99us: 50, MeanUs: 22},
		{Name: probeSoft, N: 100, P50us: 30, P99us: 60, MeanUs: 33},
		{Name: probePread, N: 100, P50us: 2, P99us: 5, MeanUs: 2.2},
		{Name: probeEngine + "interrupt", N: 100, MeanUs: 70},
	}
}

func TestGoals(t *testing.T) {
	r := &runResult{Records: records()}
	// A second repetition with other figures: the median is the mean of two.
	for _, rec := range records() {
		rec.Rep = 1
		rec.MiBps *= 3
		r.Records = append(r.Records, rec)
	}
	tb := aggregate(r, exportTmpfs)
	if a := tb.get("seqread-qd1-direct", "nullfs"); a == nil || a.MiBps != 2000 {
		t.Fatalf("median of 1000 and 3000 MiB/s: %+v", a)
	}
	if p := tb.perGiB("nullfs", kindJobs(tb, "randread")); p.client != 1 || !math.IsNaN(p.server) || !math.IsNaN(p.wire) {
		t.Errorf("nullfs per GiB of random reads: %+v, want client 1, no server, no wire", p)
	}
	// A run from before machine CPU was recorded: no whole-machine figure,
	// rather than 0.
	old := aggregate(&runResult{Records: []record{{Target: "nullfs", Job: "seqread-qd1-direct", Bytes: 1 << 30, ClientCPU: 1, HasClient: true}}}, exportDisk)
	if p := old.perGiB("nullfs", bigDirect); p.client != 1 || !math.IsNaN(p.machine) || !math.IsNaN(p.others) || !math.IsNaN(p.app) {
		t.Errorf("per GiB of an old record: %+v, want client 1 and no app, machine or others figure", p)
	}
	lines := strings.Join(goals(tb, aggregateProbes(probes())), "\n")
	containsAll(t, lines,
		"| 16: lwio-polling 1 MiB read qd1 ÷ passthrough | 0.95× | ≥ 0.90× | met |",
		"| 16: lwio-polling 1 MiB write qd16 ÷ passthrough | 0.95× | ≥ 0.90× | met |",
		// 100/0.95 µs against nullfs's 100 + 1.5 × 20.
		"| 16: lwio-polling randread-qd1 p50 ≤ passthrough p50 + 1.5 × TCP round trip | 105 µs | ≤ 130 µs | met |",
		"| 16: lwio-polling randwrite-qd1 p50 ≤ passthrough p50 + 1.5 × TCP round trip | – µs | ≤ – µs | not measured |",
		// (1 + 2) s per GiB against sshfs's 3.
		"| 16: lwio-polling client + server CPU per GiB of 1 MiB I/O ÷ sshfs's | 1.00× | ≤ 0.50× | **missed** |",
		"| 16: lwio-polling whole-machine CPU per GiB of 1 MiB I/O | 4.00 s | ≤ 0.70 s | **missed** |",
		"| 23: lwio-polling cp time ÷ passthrough | 1.05× | ≤ 2.00× | met |",
		"| 23: lwio-polling cp, data on the connections | 2048 MiB | ≤ 1.00 MiB | **missed** |",
		"| 9: lwio-polling 1 MiB read qd1 ÷ sshfs | 9.50× | ≥ 8.00× | met |",
		"| 9: lwio-polling 4 KiB random read qd16 IOPS ÷ its qd1 | 4.00× | ≥ 3.00× | met |",
		"| (reference) sshfs client + server CPU per GiB of 1 MiB I/O | 3.00 s | | |",
	)
}

func TestWriteReport(t *testing.T) {
	r := &runResult{Records: records(), Probes: probes()}
	// The same jobs on a second export, and a record of a run from before
	// exports existed: the disk.
	for _, rec := range records() {
		rec.Export = exportDisk
		rec.MiBps /= 2
		r.Records = append(r.Records, rec)
	}
	r.Records = append(r.Records, record{Target: "lwio-polling", Job: kindMeta, Meta: map[string]float64{"tar_s": 7}, HasClient: true})
	r.Records = append(r.Records, record{Export: exportTmpfs, Target: "lwio-polling", Job: "seqwrite-qd1-buffered", Err: "fio: exit status 1"})
	out := t.TempDir()
	if err := writeReport(out, r); err != nil && !strings.Contains(err.Error(), "gnuplot") {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, want := range []string{
		"## The ceiling comparison, tmpfs export",
		"| 1 MiB read qd1 psync (MiB/s) | 2000 (2.00×) | 1000 | 100 (0.10×) | 950 (0.95×) |",
		"| cp + fsync of the data file (s) | 0.50 (0.50×) | 1.00 | 10.0 (10.00×) | 1.05 (1.05×) |",
		"## The same comparison, disk export",
		"| 1 MiB read qd1 psync (MiB/s) | 1000 (2.00×) | 500 | 50.0 (0.10×) | 475 (0.95×) |",
		"| the server's pread: 4 KiB at random offsets of the data file | 2.00 | 5.00 | bench/latency pread (n 100) |",
		"| LWIO engines in one process, 4 KiB READ, interrupt (mean) | 70.0 | – |",
		"| **target**: passthrough p50 + 1.5 × TCP round trip | 130 | | issue 16 |",
		"| lwio-polling through the mount | 105 (0.81× the target) |",
		"lwio-polling -24.74 µs;", // 105.26 − 100 (nullfs) − 30 (softrdma)
		"| lwio-polling | 1.00 | 2.00 | 3.00 | 1.00× | 0.50 | 3.50 | 4.00 | 0.48 | 2.00 |", // others: (16 − 2 − 4 − 8) CPU-s over 4 × 1.05 s
		"| tar -x | – | – | – | 7.00 |",
		"- tmpfs lwio-polling seqwrite-qd1-buffered rep 0: fio: exit status 1",
		"| seqwrite-qd1-buffered | – | – | – | FAILED |",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("results.md lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("results.md:\n%s", doc)
	}
}

func TestFailedRunIsShown(t *testing.T) {
	var rs []record
	for _, rec := range records() {
		if rec.Target != "lwio-polling" || rec.Job != "seqwrite-qd1-direct" {
			rs = append(rs, rec)
		}
	}
	rs = append(rs, record{Export: exportTmpfs, Target: "lwio-polling", Job: "seqwrite-qd1-direct", Err: "fio: exit status 1"})
	tb := aggregate(&runResult{Records: rs}, exportTmpfs)
	if got := tb.cell("seqwrite-qd1-direct", "lwio-polling", func(*agg) string { return "x" }); got != "FAILED" {
		t.Errorf("a job that only failed shows %q, want FAILED", got)
	}
}

func TestCPUBetween(t *testing.T) {
	a := cpuSample{1: {utime: 100, stime: 50, start: "7"}, 2: {utime: 10, start: "9"}}
	b := cpuSample{
		1: {utime: 150, stime: 60, start: "7"}, // +60 ticks
		2: {utime: 5, start: "11"},             // PID reused: counts whole, 5
		3: {utime: 20, stime: 5, start: "12"},  // born in between: 25
	}
	if got := cpuBetween(a, b); got != 0.9 {
		t.Errorf("cpuBetween = %v s, want 0.9 (90 ticks)", got)
	}
}

func TestReadStatSelf(t *testing.T) {
	st, ok := readStat(os.Getpid())
	if !ok || st.ppid != os.Getppid() || st.start == "" {
		t.Fatalf("readStat(self) = %+v, %v; want ppid %d", st, ok, os.Getppid())
	}
	found := false
	for _, pid := range descendants(os.Getppid()) {
		found = found || pid == os.Getpid()
	}
	if !found {
		t.Errorf("descendants(parent) does not list this process")
	}
}

func TestAutoGoals(t *testing.T) {
	var rs []record
	add := func(target, job string, mibps, secs, tar float64) {
		rec := record{Export: exportTmpfs, Target: target, Job: job, MiBps: mibps, Seconds: secs}
		if tar > 0 {
			rec.Meta = map[string]float64{"tar_s": tar}
		}
		rs = append(rs, rec)
	}
	// Job by job, the better fixed mode is 100 MiB/s (or 1 s, for cp and
	// tar -x); polling is the better one in some, interrupt in others.
	for _, c := range []struct {
		job              string
		auto, intr, poll float64
	}{
		{"seqwrite-qd16-direct", 95, 100, 80},   // 0.95: met
		{"randread-qd16-direct", 85, 60, 100},   // 0.85: missed
		{"seqwrite-qd1-buffered", 120, 100, 90}, // 1.20: met
	} {
		add(autoTarget, c.job, c.auto, 0, 0)
		add(interruptTarget, c.job, c.intr, 0, 0)
		add(pollingTarget, c.job, c.poll, 0, 0)
	}
	add(autoTarget, kindCp, 0, 1.25, 0) // 1 ÷ 1.25: missed
	add(interruptTarget, kindCp, 0, 1, 0)
	add(pollingTarget, kindCp, 0, 2, 0)
	add(autoTarget, kindMeta, 0, 0, 2) // 1 ÷ 2 s against polling's 1 s
	add(interruptTarget, kindMeta, 0, 0, 4)
	add(pollingTarget, kindMeta, 0, 0, 1)
	// A failed fixed-mode run: no ratio, rather than one against the other mode.
	add(autoTarget, "randread-qd1-direct", 100, 0, 0)
	add(interruptTarget, "randread-qd1-direct", 50, 0, 0)
	rs = append(rs, record{Export: exportTmpfs, Target: pollingTarget, Job: "randread-qd1-direct", Err: "fio: boom"})
	lines := strings.Join(goals(aggregate(&runResult{Records: rs}, exportTmpfs), nil), "\n")
	containsAll(t, lines,
		"| 17: lwio-auto seqwrite-qd16-direct ÷ the better of lwio-interrupt and lwio-polling | 0.95× | ≥ 0.90× | met |",
		"| 17: lwio-auto randread-qd16-direct ÷ the better of lwio-interrupt and lwio-polling | 0.85× | ≥ 0.90× | **missed** |",
		"| 17: lwio-auto seqwrite-qd1-buffered ÷ the better of lwio-interrupt and lwio-polling | 1.20× | ≥ 0.90× | met |",
		"| 17: lwio-auto cp ÷ the better of lwio-interrupt and lwio-polling | 0.80× | ≥ 0.90× | **missed** |",
		"| 17: lwio-auto meta ÷ the better of lwio-interrupt and lwio-polling | 0.50× | ≥ 0.90× | **missed** |",
		"| 17: lwio-auto randread-qd1-direct ÷ the better of lwio-interrupt and lwio-polling | – | ≥ 0.90× | not measured |",
	)
	if strings.Contains(lines, "skipped") {
		t.Errorf("a goal skipped with all three targets in the run:\n%s", lines)
	}

	// Without lwio-auto and lwio-interrupt (TestGoals' run): one row, skipped.
	lines = strings.Join(goals(aggregate(&runResult{Records: records()}, exportTmpfs), nil), "\n")
	containsAll(t, lines, "| 17: lwio-auto ÷ the better of lwio-interrupt and lwio-polling | – | ≥ 0.90× | skipped: lwio-auto and lwio-interrupt not in this run |")
	if n := strings.Count(lines, "| 17: "); n != 1 {
		t.Errorf("%d issue-17 rows without the targets, want 1:\n%s", n, lines)
	}
}

// containsAll reports each of want that the goals' lines lack.
func containsAll(t *testing.T, lines string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(lines, w) {
			t.Errorf("goals lack %q; got:\n%s", w, lines)
		}
	}
}
