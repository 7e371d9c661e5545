package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// agg is the median over repetitions of one job on one target.
type agg struct {
	n                              int
	MiBps, IOPS, P50us, P99us      float64
	Bytes                          float64
	ClientCPU, ServerCPU           float64
	Meta                           map[string]float64
	errs                           []string
	hasClient, hasServer, measured bool
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

type table struct {
	targets []string
	jobs    []string
	cells   map[string]map[string]*agg // job → target
}

func aggregate(r *runResult) *table {
	tb := &table{cells: map[string]map[string]*agg{}}
	type key struct{ t, j string }
	vals := map[key]map[string][]float64{}
	seenT, seenJ := map[string]bool{}, map[string]bool{}
	for _, rec := range r.Records {
		if !seenT[rec.Target] {
			seenT[rec.Target] = true
			tb.targets = append(tb.targets, rec.Target)
		}
		if !seenJ[rec.Job] {
			seenJ[rec.Job] = true
			tb.jobs = append(tb.jobs, rec.Job)
		}
		if tb.cells[rec.Job] == nil {
			tb.cells[rec.Job] = map[string]*agg{}
		}
		a := tb.cells[rec.Job][rec.Target]
		if a == nil {
			a = &agg{hasClient: rec.HasClient, hasServer: rec.HasSrvr}
			tb.cells[rec.Job][rec.Target] = a
		}
		if rec.Err != "" {
			a.errs = append(a.errs, rec.Err)
			continue
		}
		a.n++
		k := key{rec.Target, rec.Job}
		if vals[k] == nil {
			vals[k] = map[string][]float64{}
		}
		v := vals[k]
		add := func(name string, x float64) { v[name] = append(v[name], x) }
		add("MiBps", rec.MiBps)
		add("IOPS", rec.IOPS)
		add("P50us", rec.P50us)
		add("P99us", rec.P99us)
		add("Bytes", float64(rec.Bytes))
		add("ClientCPU", rec.ClientCPU)
		add("ServerCPU", rec.ServerCPU)
		for mk, mv := range rec.Meta {
			add("meta:"+mk, mv)
		}
	}
	for k, v := range vals {
		a := tb.cells[k.j][k.t]
		a.measured = true
		a.MiBps, a.IOPS, a.P50us, a.P99us = median(v["MiBps"]), median(v["IOPS"]), median(v["P50us"]), median(v["P99us"])
		a.Bytes, a.ClientCPU, a.ServerCPU = median(v["Bytes"]), median(v["ClientCPU"]), median(v["ServerCPU"])
		for name, xs := range v {
			if m, ok := strings.CutPrefix(name, "meta:"); ok {
				if a.Meta == nil {
					a.Meta = map[string]float64{}
				}
				a.Meta[m] = median(xs)
			}
		}
	}
	return tb
}

func (tb *table) get(job, target string) *agg {
	if a := tb.cells[job][target]; a != nil && a.measured {
		return a
	}
	return nil
}

func fmtNum(x float64) string {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return "–"
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

func (tb *table) cell(job, target string, f func(*agg) string) string {
	a := tb.cells[job][target]
	switch {
	case a == nil:
		return "–"
	case !a.measured:
		return "FAILED"
	}
	return f(a)
}

func isBig(job string) bool { return strings.HasPrefix(job, "seq") }

func writeReport(out string, r *runResult) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	tb := aggregate(r)
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	mode := "full"
	if r.Config.Quick {
		mode = "quick (BENCH_QUICK=1)"
	}
	w("# lwiofs bench — %s\n\n", r.Started.Format("2006-01-02 15:04 UTC"))
	w("Mode %s: data file %s, fio runtime cap %ds per job, %d repetition(s), interleaved "+
		"(every job runs on every target before the next job). Medians over repetitions. Run took %.0fs.\n\n",
		mode, r.Config.Size, r.Config.Runtime, r.Config.Repeat, r.Duration)
	if r.Label != "" {
		w("Measured: %s.\n\n", r.Label)
	}
	w("Machine: %s, %d CPUs, %.0f GiB RAM, kernel %s, %s, %s; load average at start: %s.\n\n",
		r.Machine.CPU, r.Machine.CPUs, r.Machine.MemGiB, r.Machine.Kernel, r.Machine.GoVersion, r.Machine.FIO, r.Machine.Load)
	for _, n := range r.Notes {
		w("- **Note:** %s\n", strings.ReplaceAll(n, "\n", " "))
	}
	if len(r.Notes) > 0 {
		w("\n")
	}
	header := func(first string) {
		w("| %s |", first)
		for _, t := range tb.targets {
			w(" %s |", t)
		}
		w("\n|---|")
		for range tb.targets {
			w("---:|")
		}
		w("\n")
	}
	var dataJobs []string
	for _, j := range tb.jobs {
		if j != "meta" {
			dataJobs = append(dataJobs, j)
		}
	}
	w("## Throughput\n\n1 MiB jobs in MiB/s, 4 KiB jobs in IOPS.\n\n")
	header("job")
	for _, j := range dataJobs {
		w("| %s |", j)
		for _, t := range tb.targets {
			w(" %s |", tb.cell(j, t, func(a *agg) string {
				if isBig(j) {
					return fmtNum(a.MiBps)
				}
				return fmtNum(a.IOPS)
			}))
		}
		w("\n")
	}
	w("\n## Completion latency p50 / p99 (µs)\n\n")
	header("job")
	for _, j := range dataJobs {
		w("| %s |", j)
		for _, t := range tb.targets {
			w(" %s |", tb.cell(j, t, func(a *agg) string { return fmtNum(a.P50us) + " / " + fmtNum(a.P99us) }))
		}
		w("\n")
	}
	w("\n## CPU seconds per GiB moved (client mount process tree / server process tree)\n\n")
	w("Summed over the jobs of each kind. sshfs: client = sshfs + ssh, server = the sshd session; lwiofs: lwio-mount / lwio-server; nullfs has no server; the directory has neither.\n\n")
	w("| target | 1 MiB read | 1 MiB write | 4 KiB read | 4 KiB write |\n|---|---:|---:|---:|---:|\n")
	cpu := map[string]map[string][2]float64{}
	for _, kind := range cpuKinds {
		for t, v := range cpuPerGiB(tb, kind) {
			if cpu[t] == nil {
				cpu[t] = map[string][2]float64{}
			}
			cpu[t][kind] = v
		}
	}
	for _, t := range tb.targets {
		w("| %s |", t)
		for _, kind := range cpuKinds {
			c := cpu[t][kind]
			w(" %s / %s |", fmtNum(c[0]), fmtNum(c[1]))
		}
		w("\n")
	}
	if _, ok := tb.cells["meta"]; ok {
		w("\n## Metadata job (seconds; %d files created, tar -x of $GOROOT/src/%s)\n\n", r.Config.MetaN, r.Config.MetaTree)
		header("step")
		for _, step := range []string{"create_s", "ls_s", "tar_s", "rm_s"} {
			w("| %s |", strings.TrimSuffix(step, "_s"))
			for _, t := range tb.targets {
				w(" %s |", tb.cell("meta", t, func(a *agg) string { return fmtNum(a.Meta[step]) }))
			}
			w("\n")
		}
	}
	w("\n## Targets of issue 9 (ratios from this run)\n\n")
	w("| target | measured | goal | |\n|---|---:|---:|---|\n")
	for _, line := range targetRatios(tb, cpu) {
		w("%s\n", line)
	}
	failed := 0
	for _, rec := range r.Records {
		if rec.Err != "" {
			failed++
		}
	}
	if failed > 0 {
		w("\n## Failed runs\n\n")
		for _, rec := range r.Records {
			if rec.Err != "" {
				w("- %s %s rep %d: %s\n", rec.Target, rec.Job, rec.Rep, strings.ReplaceAll(rec.Err, "\n", " "))
			}
		}
	}
	w("\n![bench](bench.png)\n")
	if err := os.WriteFile(filepath.Join(out, "results.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return plot(out, tb, dataJobs)
}

// cpuKinds are the job prefixes the CPU table sums over.
var cpuKinds = []string{"seqread", "seqwrite", "randread", "randwrite"}

// cpuPerGiB returns, per target, the client and server CPU seconds per GiB
// moved by the jobs whose name starts with kind (NaN: no such process).
func cpuPerGiB(tb *table, kind string) map[string][2]float64 {
	res := map[string][2]float64{}
	for _, t := range tb.targets {
		var c, s, bytes float64
		var hasC, hasS bool
		for _, j := range tb.jobs {
			a := tb.get(j, t)
			if a == nil || !strings.HasPrefix(j, kind+"-") {
				continue
			}
			c, s, bytes = c+a.ClientCPU, s+a.ServerCPU, bytes+a.Bytes
			hasC, hasS = a.hasClient, a.hasServer
		}
		v := [2]float64{math.NaN(), math.NaN()}
		if bytes > 0 && hasC {
			v[0] = c / (bytes / (1 << 30))
		}
		if bytes > 0 && hasS {
			v[1] = s / (bytes / (1 << 30))
		}
		res[t] = v
	}
	return res
}

// targetRatios computes issue 9's goals for each lwiofs target.
func targetRatios(tb *table, cpu map[string]map[string][2]float64) []string {
	var lines []string
	ratio := func(a, b float64) float64 {
		if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
			return math.NaN()
		}
		return a / b
	}
	verdict := func(x, goal float64, atLeast bool) string {
		switch {
		case math.IsNaN(x):
			return "not measured"
		case atLeast && x >= goal, !atLeast && x <= goal:
			return "met"
		}
		return "**missed**"
	}
	metric := func(job, t string, f func(*agg) float64) float64 {
		if a := tb.get(job, t); a != nil {
			return f(a)
		}
		return math.NaN()
	}
	mibps := func(a *agg) float64 { return a.MiBps }
	iops := func(a *agg) float64 { return a.IOPS }
	p50 := func(a *agg) float64 { return a.P50us }
	tar := func(a *agg) float64 { return a.Meta["tar_s"] }
	var lw []string
	for _, t := range tb.targets {
		if strings.HasPrefix(t, "lwio") {
			lw = append(lw, t)
		}
	}
	if len(lw) == 0 {
		lw = []string{"lwio-interrupt", "lwio-polling"}
	}
	add := func(what string, x, goal float64, atLeast bool) {
		op := "≥"
		if !atLeast {
			op = "≤"
		}
		lines = append(lines, fmt.Sprintf("| %s | %s | %s %s | %s |", what, fmtRatio(x), op, fmtRatio(goal), verdict(x, goal, atLeast)))
	}
	for _, t := range lw {
		for _, j := range []string{"seqread-qd1-direct", "seqread-qd16-direct", "seqwrite-qd1-direct", "seqwrite-qd16-direct"} {
			add(fmt.Sprintf("%s: %s MiB/s ÷ nullfs", t, j), ratio(metric(j, t, mibps), metric(j, "nullfs", mibps)), 0.9, true)
		}
		for _, j := range []string{"seqread-qd1-buffered", "seqread-qd1-direct"} {
			add(fmt.Sprintf("%s: %s MiB/s ÷ sshfs", t, j), ratio(metric(j, t, mibps), metric(j, "sshfs", mibps)), 8, true)
		}
		add(fmt.Sprintf("%s: randread-qd1-direct p50 ÷ nullfs", t), ratio(metric("randread-qd1-direct", t, p50), metric("randread-qd1-direct", "nullfs", p50)), 1.3, false)
		add(fmt.Sprintf("%s: randwrite-qd1-direct p50 ÷ nullfs", t), ratio(metric("randwrite-qd1-direct", t, p50), metric("randwrite-qd1-direct", "nullfs", p50)), 1.3, false)
		add(fmt.Sprintf("%s: randread-qd16-direct IOPS ÷ its qd1", t), ratio(metric("randread-qd16-direct", t, iops), metric("randread-qd1-direct", t, iops)), 3, true)
		add(fmt.Sprintf("%s: tar -x time ÷ nullfs", t), ratio(metric("meta", t, tar), metric("meta", "nullfs", tar)), 1.5, false)
		add(fmt.Sprintf("%s: client CPU per GiB of 1 MiB reads ÷ sshfs", t), ratio(cpu[t]["seqread"][0], cpu["sshfs"]["seqread"][0]), 0.5, false)
	}
	// The references, to read the goals against.
	lines = append(lines, fmt.Sprintf("| (reference) nullfs: randread-qd16-direct IOPS ÷ its qd1 | %s | | |",
		fmtRatio(ratio(metric("randread-qd16-direct", "nullfs", iops), metric("randread-qd1-direct", "nullfs", iops)))))
	lines = append(lines, fmt.Sprintf("| (reference) nullfs: seqread-qd1-direct MiB/s ÷ sshfs | %s | | |",
		fmtRatio(ratio(metric("seqread-qd1-direct", "nullfs", mibps), metric("seqread-qd1-direct", "sshfs", mibps)))))
	lines = append(lines, fmt.Sprintf("| (reference) nullfs: seqread-qd1-direct MiB/s ÷ dir | %s | | |",
		fmtRatio(ratio(metric("seqread-qd1-direct", "nullfs", mibps), metric("seqread-qd1-direct", "dir", mibps)))))
	return lines
}

func fmtRatio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "–"
	}
	return fmt.Sprintf("%.2f×", x)
}

// plot writes bench.dat and bench.gp and runs gnuplot to make bench.png:
// two clustered bar charts, 1 MiB MiB/s and 4 KiB IOPS, one bar per target.
func plot(out string, tb *table, jobs []string) error {
	var big, small []string
	for _, j := range jobs {
		if isBig(j) {
			big = append(big, j)
		} else {
			small = append(small, j)
		}
	}
	write := func(name string, js []string, f func(*agg) float64) error {
		var b strings.Builder
		b.WriteString("job")
		for _, t := range tb.targets {
			b.WriteString(" " + t)
		}
		b.WriteString("\n")
		for _, j := range js {
			b.WriteString(j)
			for _, t := range tb.targets {
				if a := tb.get(j, t); a != nil && f(a) > 0 {
					fmt.Fprintf(&b, " %.1f", f(a))
				} else {
					b.WriteString(" NaN")
				}
			}
			b.WriteString("\n")
		}
		return os.WriteFile(filepath.Join(out, name), []byte(b.String()), 0o644)
	}
	if err := write("bench-mibps.dat", big, func(a *agg) float64 { return a.MiBps }); err != nil {
		return err
	}
	if err := write("bench-iops.dat", small, func(a *agg) float64 { return a.IOPS }); err != nil {
		return err
	}
	cols := func(file string) string {
		var ps []string
		for i := range tb.targets {
			if i == 0 {
				ps = append(ps, fmt.Sprintf("'%s' using %d:xtic(1) title columnheader(%d)", file, i+2, i+2))
			} else {
				ps = append(ps, fmt.Sprintf("'' using %d title columnheader(%d)", i+2, i+2))
			}
		}
		return strings.Join(ps, ", ")
	}
	var panels []string
	if len(big) > 0 {
		panels = append(panels, "set ylabel \"MiB/s\"\nset title \"1 MiB sequential\"\nplot "+cols("bench-mibps.dat")+"\n")
	}
	if len(small) > 0 {
		panels = append(panels, "set ylabel \"IOPS\"\nset title \"4 KiB random\"\nplot "+cols("bench-iops.dat")+"\n")
	}
	if len(panels) == 0 {
		return nil
	}
	gp := fmt.Sprintf(`# Generated by bench/runner; run from the results directory: gnuplot bench.gp
set terminal pngcairo size 1400,%d font "sans,10" background "white"
set output 'bench.png'
set multiplot layout %d,1 title "lwiofs bench: medians over repetitions (log scale)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set logscale y
set grid ytics
set key outside right top
set xtics rotate by -30 font ",9"
%sunset multiplot
`, 500*len(panels), len(panels), strings.Join(panels, ""))
	if err := os.WriteFile(filepath.Join(out, "bench.gp"), []byte(gp), 0o644); err != nil {
		return err
	}
	if _, err := exec.LookPath("gnuplot"); err != nil {
		return fmt.Errorf("gnuplot is not installed (scripts/deps.sh bench): %v", err)
	}
	cmd := exec.Command("gnuplot", "bench.gp")
	cmd.Dir = out
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("gnuplot: %v\n%s", err, b)
	}
	return nil
}
