package main

import (
	"math"
	"os"
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

// records builds one repetition's records: MiB/s, IOPS and p50 per target.
func records() []record {
	var rs []record
	add := func(target, job string, mibps, iops, p50 float64) {
		rs = append(rs, record{Target: target, Job: job, MiBps: mibps, IOPS: iops, P50us: p50,
			Bytes: 1 << 30, ClientCPU: 1, ServerCPU: 2, HasClient: target != "dir", HasSrvr: target != "dir" && target != "nullfs"})
	}
	for _, tg := range []struct {
		name  string
		scale float64
	}{{"dir", 2}, {"nullfs", 1}, {"sshfs", 0.1}, {"lwio-polling", 0.95}} {
		add(tg.name, "seqread-qd1-direct", 1000*tg.scale, 1000*tg.scale, 1000/tg.scale)
		add(tg.name, "randread-qd1-direct", 40*tg.scale, 10000*tg.scale, 100/tg.scale)
		add(tg.name, "randread-qd16-direct", 160*tg.scale, 40000*tg.scale, 400/tg.scale)
	}
	return rs
}

func TestTargetRatios(t *testing.T) {
	r := &runResult{Records: records()}
	// A second repetition with other figures: the median is the mean of two.
	for _, rec := range records() {
		rec.Rep = 1
		rec.MiBps *= 3
		r.Records = append(r.Records, rec)
	}
	tb := aggregate(r)
	if a := tb.get("seqread-qd1-direct", "nullfs"); a == nil || a.MiBps != 2000 {
		t.Fatalf("median of 1000 and 3000 MiB/s: %+v", a)
	}
	cpu := map[string]map[string][2]float64{}
	for _, kind := range cpuKinds {
		for tg, v := range cpuPerGiB(tb, kind) {
			if cpu[tg] == nil {
				cpu[tg] = map[string][2]float64{}
			}
			cpu[tg][kind] = v
		}
	}
	if c := cpu["nullfs"]["randread"]; c[0] != 1 || !math.IsNaN(c[1]) {
		t.Errorf("nullfs CPU per GiB of random reads: %v, want [1 NaN] (no server)", c)
	}
	lines := strings.Join(targetRatios(tb, cpu), "\n")
	for _, want := range []string{
		"| lwio-polling: seqread-qd1-direct MiB/s ÷ nullfs | 0.95× | ≥ 0.90× | met |",
		"| lwio-polling: seqread-qd1-direct MiB/s ÷ sshfs | 9.50× | ≥ 8.00× | met |",
		"| lwio-polling: randread-qd1-direct p50 ÷ nullfs | 1.05× | ≤ 1.30× | met |",
		"| lwio-polling: randread-qd16-direct IOPS ÷ its qd1 | 4.00× | ≥ 3.00× | met |",
		"| lwio-polling: seqwrite-qd1-direct MiB/s ÷ nullfs | – | ≥ 0.90× | not measured |",
		"| lwio-polling: client CPU per GiB of 1 MiB reads ÷ sshfs | 1.00× | ≤ 0.50× | **missed** |",
	} {
		if !strings.Contains(lines, want) {
			t.Errorf("ratios lack %q; got:\n%s", want, lines)
		}
	}
}

func TestFailedRunIsShown(t *testing.T) {
	r := &runResult{Records: append(records(), record{Target: "lwio-polling", Job: "seqwrite-qd1-direct", Err: "fio: exit status 1"})}
	tb := aggregate(r)
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
