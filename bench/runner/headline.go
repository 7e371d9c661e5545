package main

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// The metrics the summary tables read.
func mibps(a *agg) float64   { return a.MiBps }
func iops(a *agg) float64    { return a.IOPS }
func p50(a *agg) float64     { return a.P50us }
func seconds(a *agg) float64 { return a.Seconds }
func tarX(a *agg) float64    { return a.Meta["tar_s"] }
func lsWarm(a *agg) float64  { return a.Meta["ls_warm_s"] }

// headlineRows are issue 16's table (1 MiB O_DIRECT at qd1 and qd16, 4 KiB
// qd1 p50) and issue 23's cp, each with its ratio to the no-op passthrough.
var headlineRows = []struct {
	label, job string
	val        func(*agg) float64
}{
	{"1 MiB read qd1 psync (MiB/s)", "seqread-qd1-direct", mibps},
	{"1 MiB read qd16 io_uring (MiB/s)", "seqread-qd16-direct", mibps},
	{"1 MiB write qd1 psync (MiB/s)", "seqwrite-qd1-direct", mibps},
	{"1 MiB write qd16 io_uring (MiB/s)", "seqwrite-qd16-direct", mibps},
	{"4 KiB random read qd1 p50 (µs)", "randread-qd1-direct", p50},
	{"4 KiB random write qd1 p50 (µs)", "randwrite-qd1-direct", p50},
	{"cp + fsync of the data file (s)", kindCp, seconds},
	{"tar -x (s)", kindMeta, tarX},
}

// headline writes the headline rows with each target's ratio to nullfs.
func headline(b *md, tb *table) {
	b.w("All O_DIRECT; in parentheses the ratio to the no-op passthrough (nullfs) in the same run.\n\n")
	b.header("job", tb.targets)
	for _, row := range headlineRows {
		if _, ok := tb.cells[row.job]; !ok {
			continue
		}
		ceiling := tb.metric(row.job, "nullfs", row.val)
		b.row(row.label, tb.targets, func(t string) string {
			return tb.cell(row.job, t, func(a *agg) string {
				v := row.val(a)
				if t == "nullfs" || math.IsNaN(ceiling) {
					return fmtNum(v)
				}
				return fmt.Sprintf("%s (%s)", fmtNum(v), fmtRatio(ratio(v, ceiling)))
			})
		})
	}
}

// probeAgg is one probe's medians over repetitions.
type probeAgg struct {
	name                 string
	n                    int
	p50us, p99us, meanUs float64
}

func aggregateProbes(prs []probeRecord) map[string]probeAgg {
	vals := map[string][][3]float64{}
	ns := map[string]int{}
	for _, p := range prs {
		if p.Err != "" {
			continue
		}
		vals[p.Name] = append(vals[p.Name], [3]float64{p.P50us, p.P99us, p.MeanUs})
		ns[p.Name] = p.N
	}
	out := map[string]probeAgg{}
	for name, vs := range vals {
		col := func(i int) float64 {
			var xs []float64
			for _, v := range vs {
				xs = append(xs, v[i])
			}
			return median(xs)
		}
		out[name] = probeAgg{name: name, n: ns[name], p50us: col(0), p99us: col(1), meanUs: col(2)}
	}
	return out
}

// engineModes lists the completion modes the engine benchmark measured.
func engineModes(probes map[string]probeAgg) []string {
	var ms []string
	for name := range probes {
		if m, ok := strings.CutPrefix(name, probeEngine); ok {
			ms = append(ms, m)
		}
	}
	sort.Strings(ms)
	return ms
}

// latencyTarget is issue 16's limit for a 4 KiB qd1 p50: the passthrough's
// p50 plus 1.5 loopback TCP round trips.
func latencyTarget(tb *table, probes map[string]probeAgg, job string) float64 {
	tcp, ok := probes[probeTCP]
	if !ok {
		return math.NaN()
	}
	return tb.metric(job, "nullfs", p50) + 1.5*tcp.p50us
}

func lwioTargetsOf(tb *table) []string {
	var lw []string
	for _, t := range tb.targets {
		if t != "dir" && t != "nullfs" && t != "sshfs" {
			lw = append(lw, t)
		}
	}
	return lw
}

// breakdown sets the pieces of a 4 KiB qd1 read, each measured on its own
// in this run, beside the mount's p50 and issue 16's target.
func breakdown(b *md, tb *table, probes map[string]probeAgg) {
	const job = "randread-qd1-direct"
	b.w("| piece | p50 µs | p99 µs | measured by |\n|---|---:|---:|---|\n")
	probe := func(label, name, how string) {
		if p, ok := probes[name]; ok {
			b.w("| %s | %s | %s | %s (n %d) |\n", label, fmtNum(p.p50us), fmtNum(p.p99us), how, p.n)
		}
	}
	fio := func(label, t string) {
		if a := tb.get(job, t); a != nil {
			b.w("| %s | %s | %s | fio %s on %s |\n", label, fmtNum(a.P50us), fmtNum(a.P99us), job, t)
		}
	}
	probe("the server's pread: 4 KiB at random offsets of the data file", probePread, "bench/latency pread")
	fio("the export itself", "dir")
	fio("FUSE round trip: the no-op passthrough", "nullfs")
	probe("loopback TCP round trip, 64 B → 4 KiB, two processes", probeTCP, "bench/latency ping -net tcp")
	probe("softrdma round trip, SEND 64 B → RDMA WRITE WITH IMMEDIATE 4 KiB, two processes", probeSoft, "bench/latency ping -net soft")
	for _, m := range engineModes(probes) {
		p := probes[probeEngine+m]
		b.w("| LWIO engines in one process, 4 KiB READ, %s (mean) | %s | – | go test protocol/client BenchmarkRandRead4KiB/%s/qd1 (n %d) |\n",
			m, fmtNum(p.meanUs), m, p.n)
	}
	target := latencyTarget(tb, probes, job)
	b.w("| **target**: passthrough p50 + 1.5 × TCP round trip | %s | | issue 16 |\n", fmtNum(target))
	for _, t := range append(lwioTargetsOf(tb), "sshfs") {
		if a := tb.get(job, t); a != nil {
			b.w("| %s through the mount | %s (%s the target) | %s | fio %s on %s |\n",
				t, fmtNum(a.P50us), fmtRatio(ratio(a.P50us, target)), fmtNum(a.P99us), job, t)
		}
	}
	soft, okSoft := probes[probeSoft]
	ceiling := tb.metric(job, "nullfs", p50)
	if !okSoft || math.IsNaN(ceiling) {
		return
	}
	b.w("\nWhat is left beyond one FUSE round trip and one softrdma round trip (p50 − passthrough p50 − softrdma p50), the engines' and the mount's own cost:")
	for _, t := range lwioTargetsOf(tb) {
		if a := tb.get(job, t); a != nil {
			b.w(" %s %s µs;", t, fmtNum(a.P50us-ceiling-soft.p50us))
		}
	}
	b.w("\n")
}

// bigDirect are the 1 MiB O_DIRECT jobs CPU per GiB is taken over.
var bigDirect = []string{"seqread-qd1-direct", "seqread-qd16-direct", "seqwrite-qd1-direct", "seqwrite-qd16-direct"}

// cpuHeadline writes CPU seconds per GiB of 1 MiB O_DIRECT I/O: the
// target's processes, the app, the whole machine, and the wire bytes.
func cpuHeadline(b *md, tb *table) {
	b.w("Summed over %s. Client: the mount's process tree (nullfs; sshfs + ssh; lwio-mount); server: the server's (sshd and its session; lwio-server). "+
		"fio: the application's own CPU (its rusage). Whole machine: /proc/stat busy time, other users' work included. "+
		"Others: CPUs busy, on average during these jobs, outside the processes measured (other users, kernel threads): "+
		"what the whole-machine figure owes to the machine's other work. "+
		"Wire: bytes on the target's connections per byte of file data (%s).\n\n", strings.Join(bigDirect, ", "), wireWhat)
	b.w("| target | client | server | client + server | ÷ sshfs | fio | fio + client + server | whole machine | others (CPUs) | wire |\n")
	b.w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	sshfs := clientServer(tb.perGiB("sshfs", bigDirect))
	for _, t := range tb.targets {
		p := tb.perGiB(t, bigDirect)
		cs := clientServer(p)
		b.w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", t, fmtNum(p.client), fmtNum(p.server), fmtNum(cs),
			fmtRatio(ratio(cs, sshfs)), fmtNum(p.app), fmtNum(p.app+zeroNaN(p.client)+zeroNaN(p.server)), fmtNum(p.machine),
			fmtNum(p.others), fmtNum(p.wire))
	}
}

// clientServer is client + server CPU per GiB; a target without a server
// process (nullfs) is its client alone.
func clientServer(p perGiB) float64 {
	if math.IsNaN(p.client) && math.IsNaN(p.server) {
		return math.NaN()
	}
	return zeroNaN(p.client) + zeroNaN(p.server)
}

func zeroNaN(x float64) float64 {
	if math.IsNaN(x) {
		return 0
	}
	return x
}

// goals computes the issues' targets for every lwiofs target from one
// export's table; a later issue's goal is one more add here.
func goals(tb *table, probes map[string]probeAgg) []string {
	var lines []string
	add := func(what string, x, limit float64, atLeast bool, unit string) {
		f := func(v float64) string {
			if unit == "×" {
				return fmtRatio(v)
			}
			return fmtNum(v) + " " + unit
		}
		op, verdict := "≥", "**missed**"
		if !atLeast {
			op = "≤"
		}
		switch {
		case math.IsNaN(x) || math.IsNaN(limit):
			verdict = "not measured"
		case atLeast && x >= limit, !atLeast && x <= limit:
			verdict = "met"
		}
		lines = append(lines, fmt.Sprintf("| %s | %s | %s %s | %s |", what, f(x), op, f(limit), verdict))
	}
	ref := func(what, value string) {
		lines = append(lines, fmt.Sprintf("| (reference) %s | %s | | |", what, value))
	}
	m := tb.metric
	bigLabels := map[string]string{
		"seqread-qd1-direct": "1 MiB read qd1", "seqread-qd16-direct": "1 MiB read qd16",
		"seqwrite-qd1-direct": "1 MiB write qd1", "seqwrite-qd16-direct": "1 MiB write qd16",
	}
	sshfsCPU := clientServer(tb.perGiB("sshfs", bigDirect))
	for _, t := range lwioTargetsOf(tb) {
		for _, j := range bigDirect {
			add(fmt.Sprintf("16: %s %s ÷ passthrough", t, bigLabels[j]), ratio(m(j, t, mibps), m(j, "nullfs", mibps)), 0.9, true, "×")
		}
		for _, j := range []string{"randread-qd1-direct", "randwrite-qd1-direct"} {
			add(fmt.Sprintf("16: %s %s p50 ≤ passthrough p50 + 1.5 × TCP round trip", t, strings.TrimSuffix(j, "-direct")),
				m(j, t, p50), latencyTarget(tb, probes, j), false, "µs")
		}
		p := tb.perGiB(t, bigDirect)
		add(fmt.Sprintf("16: %s client + server CPU per GiB of 1 MiB I/O ÷ sshfs's", t), ratio(clientServer(p), sshfsCPU), 0.5, false, "×")
		add(fmt.Sprintf("16: %s whole-machine CPU per GiB of 1 MiB I/O", t), p.machine, 0.7, false, "s")
		add(fmt.Sprintf("23: %s cp time ÷ passthrough", t), ratio(m(kindCp, t, seconds), m(kindCp, "nullfs", seconds)), 2, false, "×")
		wire := math.NaN()
		if a := tb.get(kindCp, t); a != nil && a.hasWire {
			wire = a.WireBytes / (1 << 20)
		}
		add(fmt.Sprintf("23: %s cp, data on the connections", t), wire, 1, false, "MiB")
		add(fmt.Sprintf("9: %s 1 MiB read qd1 ÷ sshfs", t), ratio(m("seqread-qd1-direct", t, mibps), m("seqread-qd1-direct", "sshfs", mibps)), 8, true, "×")
		add(fmt.Sprintf("9: %s 4 KiB random read qd16 IOPS ÷ its qd1", t), ratio(m("randread-qd16-direct", t, iops), m("randread-qd1-direct", t, iops)), 3, true, "×")
		add(fmt.Sprintf("9, 15: %s tar -x ÷ passthrough", t), ratio(m(kindMeta, t, tarX), m(kindMeta, "nullfs", tarX)), 1.5, false, "×")
		add(fmt.Sprintf("15: %s ls -l of a warm (leased) directory ÷ passthrough", t), ratio(m(kindMeta, t, lsWarm), m(kindMeta, "nullfs", lsWarm)), 1, false, "×")
	}
	skip := func(what, limit, why string) {
		lines = append(lines, fmt.Sprintf("| %s | – | %s | skipped: %s |", what, limit, why))
	}
	autoGoals(tb, add, skip)
	ref("passthrough 1 MiB read qd1 ÷ sshfs", fmtRatio(ratio(m("seqread-qd1-direct", "nullfs", mibps), m("seqread-qd1-direct", "sshfs", mibps))))
	ref("passthrough 4 KiB random read qd16 IOPS ÷ its qd1", fmtRatio(ratio(m("randread-qd16-direct", "nullfs", iops), m("randread-qd1-direct", "nullfs", iops))))
	ref("sshfs client + server CPU per GiB of 1 MiB I/O", fmtNum(sshfsCPU)+" s")
	ref("passthrough whole-machine CPU per GiB of 1 MiB I/O", fmtNum(tb.perGiB("nullfs", bigDirect).machine)+" s")
	return lines
}

// The targets issue 17's goal compares: completion=auto against the better
// of the two fixed modes, job by job.
const (
	autoTarget      = "lwio-auto"
	interruptTarget = "lwio-interrupt"
	pollingTarget   = "lwio-polling"
)

// rate is how fast a job ran on a target, higher is better: MiB/s for an
// fio job, runs per second for cp and tar -x; NaN when not measured.
func rate(tb *table, job, target string) float64 {
	switch job {
	case kindCp:
		return 1 / tb.metric(job, target, seconds)
	case kindMeta:
		return 1 / tb.metric(job, target, tarX)
	}
	return tb.metric(job, target, mibps)
}

// autoGoals is issue 17's goal, one row per job: lwio-auto never more than
// 10 % below the better fixed completion mode. Without the three targets in
// the run there is nothing to compare: one row says which are missing.
func autoGoals(tb *table, add func(what string, x, limit float64, atLeast bool, unit string), skip func(what, limit, why string)) {
	var missing []string
	for _, t := range []string{autoTarget, interruptTarget, pollingTarget} {
		if !slices.Contains(tb.targets, t) {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		skip(fmt.Sprintf("17: %s ÷ the better of %s and %s", autoTarget, interruptTarget, pollingTarget),
			"≥ 0.90×", strings.Join(missing, " and ")+" not in this run")
		return
	}
	for _, j := range tb.jobs {
		// A fixed mode that failed leaves no "better" to compare with.
		best := math.Max(rate(tb, j, interruptTarget), rate(tb, j, pollingTarget))
		add(fmt.Sprintf("17: %s %s ÷ the better of %s and %s", autoTarget, j, interruptTarget, pollingTarget),
			ratio(rate(tb, j, autoTarget), best), 0.9, true, "×")
	}
}
