// Command runner is `make bench`: it serves one exported directory through
// every target (the directory itself, the no-op FUSE passthrough
// bench/nullfs, sshfs over 127.0.0.1, lwiofs over softrdma in each
// completion mode, and any further lwiofs configuration asked for), runs
// the fio jobs of bench/fio, a cp and the metadata job bench/meta.sh
// against each, interleaved and repeated (A B C A B C …), measures the
// pieces of a 4 KiB read on their own (bench/latency, the engine
// benchmark), and writes results/: raw.json, results.md (tables and the
// issues' target ratios) and bench.png (gnuplot).
//
// The export is a tmpfs first, where the export and the FUSE targets all
// read memory and the comparison is against the ceiling; then, in full
// mode, a directory on disk (a second table).
//
//	runner -bin bin -out results [-quick] [-targets dir,nullfs,...] [-exports tmpfs,disk]
//	runner -report results/raw.json -out results   # tables and plot again
//
// Everything it starts (mounts, servers, sshd) is stopped on exit, on
// SIGINT/SIGTERM too.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// config is one bench run's shape.
type config struct {
	Quick    bool
	Repeat   int
	Runtime  int    // seconds, a cap per fio job
	Size     string // the data file (and what cp copies), fio size syntax
	MetaN    int    // files the metadata job creates
	MetaTree string // the source tree tar -x unpacks
	ProbeN   int    // round trips (and preads) per latency probe
	Jobs     []job  // on the first export
	// DiskJobs are the jobs run on the disk export, a second table: the
	// headline by default, to keep a full run within 15 minutes.
	DiskJobs []job
	Targets  []string
	Exports  []string // "tmpfs", "disk", in order
	LWIO     []lwioSpec
}

// Job kinds: a fio job file, the cp job, the metadata script.
const (
	kindFIO  = "fio"
	kindCp   = "cp"
	kindMeta = "meta"
)

// job is one fio job file run buffered or O_DIRECT, or the cp or metadata job.
type job struct {
	Kind   string `json:",omitempty"` // "" is kindFIO (raw.json of older runs)
	File   string `json:",omitempty"` // bench/fio/NAME.fio
	Direct bool   `json:",omitempty"`
}

func (j job) Name() string {
	switch j.Kind {
	case kindCp, kindMeta:
		return j.Kind
	}
	n := strings.TrimSuffix(filepath.Base(j.File), ".fio")
	if j.Direct {
		return n + "-direct"
	}
	return n + "-buffered"
}

var allJobFiles = []string{
	"seqread-qd1", "seqread-qd16", "seqwrite-qd1", "seqwrite-qd16",
	"randread-qd1", "randread-qd16", "randread-4jobs",
	"randwrite-qd1", "randwrite-qd16", "randwrite-4jobs",
}

// headlineJobs are issue 16's table: 1 MiB O_DIRECT at qd1 (psync) and
// qd16 (io_uring), 4 KiB random qd1 p50.
var headlineJobs = []string{
	"seqread-qd1-direct", "seqread-qd16-direct", "seqwrite-qd1-direct", "seqwrite-qd16-direct",
	"randread-qd1-direct", "randwrite-qd1-direct",
}

const defaultTargets = "dir,nullfs,sshfs,lwio-auto,lwio-interrupt,lwio-polling,lwio-sealed"

func main() {
	var (
		binDir   = flag.String("bin", "bin", "directory with lwio-server and lwio-mount (missing: lwiofs targets are skipped, saying so), and lwio (its stat counts the wire of unix-socket connections)")
		nullfs   = flag.String("nullfs", "", "the bench/nullfs binary (default: built into the work directory)")
		latency  = flag.String("latency", "", "the bench/latency binary (default: built into the work directory)")
		engine   = flag.String("engine", "", "protocol/client's test binary, for the engine benchmark (default: built into the work directory)")
		out      = flag.String("out", "results", "results directory")
		quick    = flag.Bool("quick", os.Getenv("BENCH_QUICK") == "1", "CI mode: smaller file, shorter runs, one repetition, fewer buffered jobs, tmpfs only (default from BENCH_QUICK=1)")
		targets  = flag.String("targets", defaultTargets, "targets, in interleaving order; lwio-MODE is lwio-mount with completion=MODE unless -lwio defines it")
		exports  = flag.String("exports", os.Getenv("BENCH_EXPORTS"), "exports to run, in order: tmpfs, disk (default tmpfs,disk; quick tmpfs; from BENCH_EXPORTS)")
		repeat   = flag.Int("repeat", 0, "repetitions (0: 2, quick 1)")
		rt       = flag.Int("runtime", 0, "seconds per fio job (0: 2, quick 1)")
		size     = flag.String("size", "", "data file size, also what cp copies (default 1g, quick 256m)")
		workRoot = flag.String("work", "/var/tmp", "where the disk export, mountpoints and logs are made (a real disk, not tmpfs)")
		report   = flag.String("report", "", "only regenerate tables and plot from this raw.json")
		label    = flag.String("label", os.Getenv("BENCH_LABEL"), "what was measured, e.g. the commit the binaries were built from (written into results.md)")
		only     = flag.String("jobs", "", "comma-separated job names to run (default: see docs/bench.md; any fio job file NAME-direct or NAME-buffered, cp, meta)")
		disk     = flag.String("disk-jobs", strings.Join(headlineJobs, ","), "comma-separated job names to run on the disk export")
		lwios    lwioFlags
	)
	flag.Var(&lwios, "lwio", "another lwio-mount configuration, NAME=MOUNT_OPTIONS or NAME=mount=OPTS;server=FLAGS;bin=DIR (repeatable; also BENCH_LWIO, space-separated; BENCH_LWIO_BIN_OLD=DIR adds the default lwio targets on the binaries in DIR)")
	flag.Parse()
	if *report != "" {
		var r runResult
		b, err := os.ReadFile(*report)
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err == nil {
			err = writeReport(*out, &r)
		}
		if err != nil {
			fatalf("%v", err)
		}
		return
	}
	cfg := config{Quick: *quick, Repeat: 2, Runtime: 2, Size: "1g", MetaN: 5000, MetaTree: "crypto", ProbeN: 20000,
		Exports: []string{exportTmpfs, exportDisk}}
	if cfg.Quick {
		cfg.Repeat, cfg.Runtime, cfg.Size, cfg.MetaN, cfg.MetaTree, cfg.ProbeN = 1, 1, "256m", 2000, "net", 5000
		cfg.Exports = []string{exportTmpfs}
	}
	if *repeat > 0 {
		cfg.Repeat = *repeat
	}
	if *rt > 0 {
		cfg.Runtime = *rt
	}
	if *size != "" {
		cfg.Size = *size
	}
	if *exports != "" {
		cfg.Exports = strings.Split(*exports, ",")
	}
	for _, e := range cfg.Exports {
		if e != exportTmpfs && e != exportDisk {
			fatalf("-exports: %q is neither %s nor %s", e, exportTmpfs, exportDisk)
		}
	}
	var err error
	cfg.Targets, cfg.LWIO, err = lwioTargets(strings.Split(*targets, ","), lwios, os.Getenv("BENCH_LWIO"), os.Getenv("BENCH_LWIO_BIN_OLD"), *binDir)
	if err != nil {
		fatalf("%v", err)
	}
	cfg.Jobs = defaultJobs(cfg.Quick)
	if *only != "" {
		cfg.Jobs = pickJobs(everyJob(), *only)
	}
	cfg.DiskJobs = pickJobs(everyJob(), *disk)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := run(ctx, cfg, tools{bin: *binDir, nullfs: *nullfs, latency: *latency, engine: *engine}, *workRoot)
	if r != nil {
		r.Label = *label
	}
	if r != nil && len(r.Records) > 0 {
		if werr := os.MkdirAll(*out, 0o755); werr != nil {
			fatalf("%v", werr)
		}
		b, _ := json.MarshalIndent(r, "", " ")
		if werr := os.WriteFile(filepath.Join(*out, "raw.json"), b, 0o644); werr != nil {
			fatalf("%v", werr)
		}
		if werr := writeReport(*out, r); werr != nil {
			fatalf("report: %v", werr)
		}
		fmt.Printf("bench: wrote %s/results.md, %s/bench.png, %s/raw.json\n", *out, *out, *out)
	}
	if err != nil {
		fatalf("%v", err)
	}
}

// everyJob is every job in run order: each fio job file O_DIRECT then
// buffered, then cp, then the metadata job.
func everyJob() []job {
	var js []job
	for _, f := range allJobFiles {
		for _, direct := range []bool{true, false} {
			js = append(js, job{Kind: kindFIO, File: filepath.Join("bench", "fio", f+".fio"), Direct: direct})
		}
	}
	return append(js, job{Kind: kindCp}, job{Kind: kindMeta})
}

// defaultJobs is what a run does unless -jobs says otherwise, sized to
// finish in about 2 minutes (quick) or well within 15 (full) on this
// machine under load: every fio job O_DIRECT (quick: but the 4-job ones),
// buffered at qd1 where the page cache changes the picture (quick:
// sequential qd1 and random read qd1; full: every qd1 job), then cp and
// the metadata job.
func defaultJobs(quick bool) []job {
	var js []job
	for _, j := range everyJob() {
		name := j.Name()
		switch {
		case j.Kind != kindFIO:
		case quick && strings.Contains(name, "-4jobs-"):
			continue
		case quick && !j.Direct && name == "randwrite-qd1-buffered":
			continue
		case !j.Direct && !strings.Contains(name, "-qd1-"):
			continue
		}
		js = append(js, j)
	}
	return js
}

// pickJobs keeps the jobs named in the comma-separated list, in run order.
func pickJobs(all []job, names string) []job {
	keep := map[string]bool{}
	for _, n := range strings.Split(names, ",") {
		keep[strings.TrimSpace(n)] = true
	}
	var js []job
	for _, j := range all {
		if keep[j.Name()] {
			js = append(js, j)
			delete(keep, j.Name())
		}
	}
	for n := range keep {
		if n != "" {
			fatalf("no job named %q", n)
		}
	}
	return js
}

func fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...)
	os.Exit(1)
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench %s: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
}

// runResult is everything one run measured; raw.json holds it.
type runResult struct {
	Started  time.Time
	Label    string  // what was measured (-label)
	Duration float64 // seconds
	Config   config
	Machine  machine
	Notes    []string // targets skipped and why, failures
	Records  []record
	Probes   []probeRecord `json:",omitempty"`
}

type machine struct {
	CPU, Kernel, GoVersion, FIO string
	CPUs                        int
	MemGiB                      float64
	Load                        string // /proc/loadavg at start
	LoadEnd                     string `json:",omitempty"` // and at the end
}

// record is one job on one target, one repetition.
type record struct {
	Export      string `json:",omitempty"` // "" in older runs: the disk
	Target, Job string
	Rep         int
	Err         string `json:",omitempty"`
	// fio: sums over read and write.
	MiBps, IOPS  float64
	P50us, P99us float64
	Bytes        int64
	ClientCPU    float64 // seconds, the mount process tree
	ServerCPU    float64 // seconds, the server process tree
	// AppCPU is the CPU of the job's own processes (fio, cp, the script),
	// from their rusage; MachineCPU is every CPU's busy time from
	// /proc/stat, other users' work included.
	AppCPU, MachineCPU float64 `json:",omitempty"`
	// WireBytes is what crossed the target's TCP connections (both ways,
	// counted on the server's sockets); HasWire says it was counted.
	WireBytes          int64              `json:",omitempty"`
	HasWire            bool               `json:",omitempty"`
	Seconds            float64            // wall
	Meta               map[string]float64 `json:",omitempty"` // metadata job steps, seconds
	HasClient, HasSrvr bool
}

func logRecord(rec record) {
	where := rec.Export + " " + rec.Target
	switch {
	case rec.Err != "":
		logf("%-22s %-24s rep %d: FAILED: %s", where, rec.Job, rec.Rep, rec.Err)
	case rec.Meta != nil:
		logf("%-22s %-24s rep %d: create %.2fs ls %.2fs warm %.2fs tar %.2fs ls -lR %.2fs rm %.2fs", where, rec.Job, rec.Rep,
			rec.Meta["create_s"], rec.Meta["ls_s"], rec.Meta["ls_warm_s"], rec.Meta["tar_s"], rec.Meta["lsr_s"], rec.Meta["rm_s"])
	case rec.Job == kindCp:
		wire := "–"
		if rec.HasWire {
			wire = fmt.Sprintf("%.1f", float64(rec.WireBytes)/(1<<20))
		}
		logf("%-22s %-24s rep %d: %.2fs, %s MiB on the wire, cpu c/s %.2f/%.2fs", where, rec.Job, rec.Rep,
			rec.Seconds, wire, rec.ClientCPU, rec.ServerCPU)
	default:
		logf("%-22s %-24s rep %d: %8.1f MiB/s %9.0f IOPS p50 %7.1fus p99 %8.1fus cpu c/s %.2f/%.2fs",
			where, rec.Job, rec.Rep, rec.MiBps, rec.IOPS, rec.P50us, rec.P99us, rec.ClientCPU, rec.ServerCPU)
	}
}

func describeMachine() machine {
	m := machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Load: loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				m.CPU = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) == nil {
		m.MemGiB = float64(si.Totalram) * float64(si.Unit) / (1 << 30)
	}
	if out, err := runOutput("fio", "--version"); err == nil {
		m.FIO = strings.TrimSpace(out)
	}
	return m
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}
