package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// agg is the median over repetitions of one job on one target.
type agg struct {
	n                             int
	MiBps, IOPS, P50us, P99us     float64
	Bytes, Seconds                float64
	ClientCPU, ServerCPU          float64
	AppCPU, MachineCPU, WireBytes float64
	Meta                          map[string]float64
	errs                          []string
	hasClient, hasServer, hasWire bool
	measured                      bool
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

// table is one export's records, aggregated per job and target.
type table struct {
	targets []string
	jobs    []string
	cells   map[string]map[string]*agg // job → target
}

// exportOf is the export a record was measured on; runs before exports
// existed served a directory on disk.
func exportOf(rec record) string {
	if rec.Export == "" {
		return exportDisk
	}
	return rec.Export
}

// exportsOf lists the exports a run measured, in run order.
func exportsOf(r *runResult) []string {
	var es []string
	seen := map[string]bool{}
	for _, rec := range r.Records {
		if e := exportOf(rec); !seen[e] {
			seen[e] = true
			es = append(es, e)
		}
	}
	return es
}

func aggregate(r *runResult, export string) *table {
	tb := &table{cells: map[string]map[string]*agg{}}
	type key struct{ t, j string }
	vals := map[key]map[string][]float64{}
	seenT, seenJ := map[string]bool{}, map[string]bool{}
	for _, rec := range r.Records {
		if exportOf(rec) != export {
			continue
		}
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
		a.hasWire = a.hasWire || rec.HasWire
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
		add("Seconds", rec.Seconds)
		add("ClientCPU", rec.ClientCPU)
		add("ServerCPU", rec.ServerCPU)
		add("AppCPU", rec.AppCPU)
		add("MachineCPU", rec.MachineCPU)
		add("WireBytes", float64(rec.WireBytes))
		for mk, mv := range rec.Meta {
			add("meta:"+mk, mv)
		}
	}
	for k, v := range vals {
		a := tb.cells[k.j][k.t]
		a.measured = true
		a.MiBps, a.IOPS, a.P50us, a.P99us = median(v["MiBps"]), median(v["IOPS"]), median(v["P50us"]), median(v["P99us"])
		a.Bytes, a.Seconds = median(v["Bytes"]), median(v["Seconds"])
		a.ClientCPU, a.ServerCPU = median(v["ClientCPU"]), median(v["ServerCPU"])
		a.AppCPU, a.MachineCPU, a.WireBytes = median(v["AppCPU"]), median(v["MachineCPU"]), median(v["WireBytes"])
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

// metric is f of a job on a target, NaN when not measured.
func (tb *table) metric(job, target string, f func(*agg) float64) float64 {
	if a := tb.get(job, target); a != nil {
		return f(a)
	}
	return math.NaN()
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

func fmtRatio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "–"
	}
	return fmt.Sprintf("%.2f×", x)
}

func ratio(a, b float64) float64 {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return a / b
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

func isFIO(job string) bool { return job != kindMeta && job != kindCp }

// md collects a markdown document.
type md struct{ strings.Builder }

func (b *md) w(format string, a ...any) { fmt.Fprintf(b, format, a...) }

// header writes a table header: the first column, then one per target.
func (b *md) header(first string, targets []string) {
	b.w("| %s |", first)
	for _, t := range targets {
		b.w(" %s |", t)
	}
	b.w("\n|---|")
	for range targets {
		b.w("---:|")
	}
	b.w("\n")
}

// row writes one table row: a label, then f of each target.
func (b *md) row(label string, targets []string, f func(t string) string) {
	b.w("| %s |", label)
	for _, t := range targets {
		b.w(" %s |", f(t))
	}
	b.w("\n")
}

func writeReport(out string, r *runResult) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	exports := exportsOf(r)
	if len(exports) == 0 {
		return fmt.Errorf("no records")
	}
	tables := map[string]*table{}
	for _, e := range exports {
		tables[e] = aggregate(r, e)
	}
	first := tables[exports[0]]
	var b md
	mode := "full"
	if r.Config.Quick {
		mode = "quick (BENCH_QUICK=1)"
	}
	b.w("# lwiofs bench — %s\n\n", r.Started.Format("2006-01-02 15:04 UTC"))
	b.w("Mode %s: exports %s, data file %s, fio runtime cap %ds per job, %d repetition(s), interleaved "+
		"(every job runs on every target before the next job). Medians over repetitions. Run took %.0fs.\n\n",
		mode, strings.Join(exports, " then "), r.Config.Size, r.Config.Runtime, r.Config.Repeat, r.Duration)
	if r.Label != "" {
		b.w("Measured: %s.\n\n", r.Label)
	}
	b.w("Machine: %s, %d CPUs, %.0f GiB RAM, kernel %s, %s, %s; load average at start: %s",
		r.Machine.CPU, r.Machine.CPUs, r.Machine.MemGiB, r.Machine.Kernel, r.Machine.GoVersion, r.Machine.FIO, r.Machine.Load)
	if r.Machine.LoadEnd != "" {
		b.w("; at the end: %s", r.Machine.LoadEnd)
	}
	b.w(".\n\n")
	for _, n := range r.Notes {
		b.w("- **Note:** %s\n", strings.ReplaceAll(n, "\n", " "))
	}
	if len(r.Notes) > 0 {
		b.w("\n")
	}
	b.w("## The ceiling comparison, %s export\n\n", exports[0])
	headline(&b, first)
	probes := aggregateProbes(r.Probes)
	if len(probes) > 0 {
		b.w("\n## Where a 4 KiB qd1 read's time goes (%s export)\n\n", exports[0])
		breakdown(&b, first, probes)
	}
	b.w("\n## CPU per GiB of 1 MiB O_DIRECT I/O (%s export)\n\n", exports[0])
	cpuHeadline(&b, first)
	b.w("\n## Targets (%s export, ratios from this run)\n\n", exports[0])
	b.w("| goal | measured | limit | |\n|---|---:|---:|---|\n")
	for _, g := range goals(first, probes) {
		b.w("%s\n", g)
	}
	for _, e := range exports[1:] {
		b.w("\n## The same comparison, %s export\n\n", e)
		headline(&b, tables[e])
	}
	for _, e := range exports {
		b.w("\n## Every job, %s export\n\n", e)
		allTables(&b, tables[e], r.Config)
	}
	failed := 0
	for _, rec := range r.Records {
		if rec.Err != "" {
			failed++
		}
	}
	for _, p := range r.Probes {
		if p.Err != "" {
			failed++
		}
	}
	if failed > 0 {
		b.w("\n## Failed runs\n\n")
		for _, rec := range r.Records {
			if rec.Err != "" {
				b.w("- %s %s %s rep %d: %s\n", exportOf(rec), rec.Target, rec.Job, rec.Rep, strings.ReplaceAll(rec.Err, "\n", " "))
			}
		}
		for _, p := range r.Probes {
			if p.Err != "" {
				b.w("- probe %s rep %d: %s\n", p.Name, p.Rep, strings.ReplaceAll(p.Err, "\n", " "))
			}
		}
	}
	b.w("\n![bench](bench.png)\n")
	if err := os.WriteFile(filepath.Join(out, "results.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return plot(out, first, exports[0])
}

// allTables writes every job of one export: throughput, latency, CPU and
// wire bytes per kind of job, cp, metadata.
func allTables(b *md, tb *table, cfg config) {
	var dataJobs []string
	for _, j := range tb.jobs {
		if isFIO(j) {
			dataJobs = append(dataJobs, j)
		}
	}
	if len(dataJobs) > 0 {
		b.w("Throughput: 1 MiB jobs in MiB/s, 4 KiB jobs in IOPS.\n\n")
		b.header("job", tb.targets)
		for _, j := range dataJobs {
			b.row(j, tb.targets, func(t string) string {
				return tb.cell(j, t, func(a *agg) string {
					if isBig(j) {
						return fmtNum(a.MiBps)
					}
					return fmtNum(a.IOPS)
				})
			})
		}
		b.w("\nCompletion latency p50 / p99 (µs):\n\n")
		b.header("job", tb.targets)
		for _, j := range dataJobs {
			b.row(j, tb.targets, func(t string) string {
				return tb.cell(j, t, func(a *agg) string { return fmtNum(a.P50us) + " / " + fmtNum(a.P99us) })
			})
		}
		b.w("\nCPU seconds per GiB moved, client (mount process tree) / server (server process tree), summed over the jobs of each kind. " +
			"sshfs: client = sshfs + ssh, server = sshd and its session; lwiofs: lwio-mount / lwio-server; nullfs has no server; the export has neither.\n\n")
		b.w("| target | 1 MiB read | 1 MiB write | 4 KiB read | 4 KiB write |\n|---|---:|---:|---:|---:|\n")
		for _, t := range tb.targets {
			b.w("| %s |", t)
			for _, kind := range cpuKinds {
				c := tb.perGiB(t, kindJobs(tb, kind))
				b.w(" %s / %s |", fmtNum(c.client), fmtNum(c.server))
			}
			b.w("\n")
		}
		b.w("\nBytes on the target's connections per byte of file data (%s):\n\n", wireWhat)
		b.w("| target | 1 MiB read | 1 MiB write | 4 KiB read | 4 KiB write |\n|---|---:|---:|---:|---:|\n")
		for _, t := range tb.targets {
			b.w("| %s |", t)
			for _, kind := range cpuKinds {
				b.w(" %s |", fmtNum(tb.perGiB(t, kindJobs(tb, kind)).wire))
			}
			b.w("\n")
		}
	}
	if _, ok := tb.cells[kindCp]; ok {
		b.w("\n`cp` of the %s data file inside the mount, then fsync of the copy (caches dropped first); "+
			"MiB on the connections: %s:\n\n", cfg.Size, wireWhat)
		b.w("| target | seconds | MiB/s | MiB on the connections | CPU client / server (s) |\n|---|---:|---:|---:|---:|\n")
		for _, t := range tb.targets {
			a := tb.get(kindCp, t)
			if a == nil {
				b.w("| %s | %s | | | |\n", t, tb.cell(kindCp, t, nil))
				continue
			}
			wire := "–"
			if a.hasWire {
				wire = fmtNum(a.WireBytes / (1 << 20))
			}
			b.w("| %s | %s | %s | %s | %s / %s |\n", t, fmtNum(a.Seconds), fmtNum(a.MiBps), wire,
				cpuCell(a.ClientCPU, a.hasClient), cpuCell(a.ServerCPU, a.hasServer))
		}
	}
	if _, ok := tb.cells[kindMeta]; ok {
		b.w("\nMetadata job (seconds; %d files created and `ls -l` cold then warm, tar -x of $GOROOT/src/%s, `ls -lR` of it, rm -rf of all):\n\n",
			cfg.MetaN, cfg.MetaTree)
		b.header("step", tb.targets)
		for _, step := range metaSteps {
			b.row(step.label, tb.targets, func(t string) string {
				return tb.cell(kindMeta, t, func(a *agg) string {
					if v, ok := a.Meta[step.key]; ok {
						return fmtNum(v)
					}
					return "–"
				})
			})
		}
	}
}

// metaSteps are bench/meta.sh's figures, in its order.
var metaSteps = []struct{ key, label string }{
	{"create_s", "create"}, {"ls_s", "ls -l"}, {"ls_warm_s", "ls -l, warm"}, {"tar_s", "tar -x"},
	{"lsr_s", "ls -lR"}, {"rm_s", "rm -rf"},
}

func cpuCell(x float64, has bool) string {
	if !has {
		return "–"
	}
	return fmtNum(x)
}

// cpuKinds are the job prefixes the per-kind CPU and wire tables sum over.
var cpuKinds = []string{"seqread", "seqwrite", "randread", "randwrite"}

func kindJobs(tb *table, kind string) []string {
	var js []string
	for _, j := range tb.jobs {
		if strings.HasPrefix(j, kind+"-") {
			js = append(js, j)
		}
	}
	return js
}

// perGiB is what a set of jobs cost per GiB of file data they moved.
type perGiB struct {
	client, server, app, machine float64 // CPU seconds per GiB; NaN: no such process
	wire                         float64 // bytes on the connections per byte moved
	// others is how many CPUs were busy, on average over the jobs, with
	// work outside the processes measured: other users, kernel threads.
	others float64
}

// perGiB sums the jobs' medians on target t and divides by the GiB moved.
func (tb *table) perGiB(t string, jobs []string) perGiB {
	var c, s, app, mach, wire, bytes, secs float64
	var hasC, hasS, hasW bool
	for _, j := range jobs {
		a := tb.get(j, t)
		if a == nil {
			continue
		}
		c, s, app, mach, wire, bytes = c+a.ClientCPU, s+a.ServerCPU, app+a.AppCPU, mach+a.MachineCPU, wire+a.WireBytes, bytes+a.Bytes
		secs += a.Seconds
		hasC, hasS, hasW = a.hasClient, a.hasServer, a.hasWire
	}
	nan := math.NaN()
	p := perGiB{client: nan, server: nan, app: nan, machine: nan, wire: nan, others: nan}
	if bytes == 0 {
		return p
	}
	gib := bytes / (1 << 30)
	// Runs before these figures existed recorded no machine CPU at all.
	if mach > 0 {
		p.app, p.machine = app/gib, mach/gib
		if secs > 0 {
			p.others = (mach - app - c - s) / secs
		}
	}
	if hasC {
		p.client = c / gib
	}
	if hasS {
		p.server = s / gib
	}
	if hasW {
		p.wire = wire / bytes
	}
	return p
}
