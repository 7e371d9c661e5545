// Command runner is `make bench`: it mounts the same exported directory
// through every target (the directory itself, the no-op FUSE passthrough
// bench/nullfs, sshfs over 127.0.0.1, lwiofs over softrdma in interrupt and
// polling mode), runs the fio jobs of bench/fio and the metadata job
// bench/meta.sh against each, interleaved and repeated (A B C A B C …), and
// writes results/: raw.json, results.md (tables and target ratios) and
// bench.png (gnuplot).
//
//	runner -bin bin -out results [-quick] [-targets dir,nullfs,...]
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
	"os/exec"
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
	Size     string // the data file, fio size syntax
	MetaN    int    // files the metadata job creates
	MetaTree string // the source tree tar -x unpacks
	Jobs     []job
	Targets  []string
}

// job is one fio job file run buffered or O_DIRECT.
type job struct {
	File   string // bench/fio/NAME.fio
	Direct bool
}

func (j job) Name() string {
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

func main() {
	var (
		binDir   = flag.String("bin", "bin", "directory with lwio-server and lwio-mount (missing: lwiofs targets are skipped, saying so)")
		nullfs   = flag.String("nullfs", "", "the bench/nullfs binary (default: built into the work directory)")
		out      = flag.String("out", "results", "results directory")
		quick    = flag.Bool("quick", os.Getenv("BENCH_QUICK") == "1", "CI mode: smaller file, shorter runs, one repetition, fewer buffered jobs (default from BENCH_QUICK=1)")
		targets  = flag.String("targets", "dir,nullfs,sshfs,lwio-interrupt,lwio-polling", "targets, in interleaving order")
		repeat   = flag.Int("repeat", 0, "repetitions (0: 2, quick 1)")
		rt       = flag.Int("runtime", 0, "seconds per fio job (0: 2, quick 1)")
		size     = flag.String("size", "", "data file size (default 1g, quick 256m)")
		workRoot = flag.String("work", "/var/tmp", "where the exported directory and mountpoints are made (a real disk, not tmpfs)")
		report   = flag.String("report", "", "only regenerate tables and plot from this raw.json")
		label    = flag.String("label", os.Getenv("BENCH_LABEL"), "what was measured, e.g. the commit the binaries were built from (written into results.md)")
		only     = flag.String("jobs", "", "comma-separated job names to run (default all; e.g. seqread-qd1-direct,meta)")
	)
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
	cfg := config{Quick: *quick, Repeat: 2, Runtime: 2, Size: "1g", MetaN: 10000, MetaTree: "crypto"}
	if cfg.Quick {
		cfg.Repeat, cfg.Runtime, cfg.Size, cfg.MetaN, cfg.MetaTree = 1, 1, "256m", 2000, "net"
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
	cfg.Targets = strings.Split(*targets, ",")
	for _, f := range allJobFiles {
		for _, direct := range []bool{true, false} {
			j := job{File: filepath.Join("bench", "fio", f+".fio"), Direct: direct}
			// Quick mode keeps O_DIRECT everywhere and buffered only at qd1
			// for sequential I/O and random reads.
			if cfg.Quick && !direct && f != "seqread-qd1" && f != "seqwrite-qd1" && f != "randread-qd1" {
				continue
			}
			cfg.Jobs = append(cfg.Jobs, j)
		}
	}
	if *only != "" {
		keep := map[string]bool{}
		for _, n := range strings.Split(*only, ",") {
			keep[n] = true
		}
		var js []job
		for _, j := range cfg.Jobs {
			if keep[j.Name()] {
				js = append(js, j)
			}
		}
		cfg.Jobs = js
		if !keep["meta"] {
			cfg.MetaN = 0
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := run(ctx, cfg, *binDir, *nullfs, *workRoot)
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
}

type machine struct {
	CPU, Kernel, GoVersion, FIO string
	CPUs                        int
	MemGiB                      float64
	Load                        string // /proc/loadavg at start
}

// record is one job on one target, one repetition.
type record struct {
	Target, Job string
	Rep         int
	Err         string `json:",omitempty"`
	// fio: sums over read and write.
	MiBps, IOPS        float64
	P50us, P99us       float64
	Bytes              int64
	ClientCPU          float64            // seconds, the mount process tree
	ServerCPU          float64            // seconds, the server process tree
	Seconds            float64            // wall
	Meta               map[string]float64 `json:",omitempty"` // metadata job steps, seconds
	HasClient, HasSrvr bool
}

func run(ctx context.Context, cfg config, binDir, nullfs, workRoot string) (*runResult, error) {
	start := time.Now()
	r := &runResult{Started: start.UTC(), Config: cfg, Machine: describeMachine()}
	work, err := os.MkdirTemp(workRoot, "lwiofs-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	export := filepath.Join(work, "export")
	if err := os.Mkdir(export, 0o755); err != nil {
		return nil, err
	}
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	if nullfs == "" {
		nullfs = filepath.Join(work, "nullfs")
		if out, err := exec.Command(goTool(), "build", "-o", nullfs, "./bench/nullfs").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build bench/nullfs: %v\n%s", err, out)
		}
	}
	var tgs []*target
	env := &setupEnv{work: work, export: export, binDir: binDir, nullfs: nullfs}
	for _, name := range cfg.Targets {
		t, cleanup, err := env.setupTarget(ctx, name)
		if cleanup != nil {
			cleanups = append(cleanups, cleanup)
		}
		if err != nil {
			note := fmt.Sprintf("%s: not measured: %v", name, err)
			logf("%s", note)
			r.Notes = append(r.Notes, note)
			continue
		}
		logf("target %s ready at %s", name, t.Dir)
		if t.DataPath != "" {
			note := fmt.Sprintf("%s: data path %s", name, t.DataPath)
			logf("%s", note)
			r.Notes = append(r.Notes, note)
		}
		tgs = append(tgs, t)
	}
	if len(tgs) == 0 {
		return r, fmt.Errorf("no target could be set up")
	}
	// Lay the data file out once, on the directory itself, so no target
	// pays for it and all read the same blocks.
	logf("laying out the %s data file", cfg.Size)
	if err := layout(ctx, export, cfg.Size); err != nil {
		return r, err
	}
	tarball := filepath.Join(work, "tree.tar")
	if cfg.MetaN > 0 {
		src := filepath.Join(runtime.GOROOT(), "src")
		if out, err := exec.Command(goTool(), "env", "GOROOT").Output(); err == nil {
			src = filepath.Join(strings.TrimSpace(string(out)), "src")
		}
		if out, err := exec.Command("tar", "-cf", tarball, "-C", src, cfg.MetaTree).CombinedOutput(); err != nil {
			return r, fmt.Errorf("tar of the source tree: %v\n%s", err, out)
		}
	}
	for rep := 0; rep < cfg.Repeat; rep++ {
		for _, j := range cfg.Jobs {
			for _, t := range tgs {
				if ctx.Err() != nil {
					return r, ctx.Err()
				}
				rec := runFIO(ctx, t, j, cfg)
				rec.Rep = rep
				logRecord(rec)
				r.Records = append(r.Records, rec)
			}
		}
		if cfg.MetaN > 0 {
			for _, t := range tgs {
				if ctx.Err() != nil {
					return r, ctx.Err()
				}
				rec := runMeta(ctx, t, tarball, cfg.MetaN)
				rec.Rep = rep
				logRecord(rec)
				r.Records = append(r.Records, rec)
			}
		}
		// Stop the mount processes from dying unseen.
		for _, t := range tgs {
			if err := t.alive(); err != nil {
				r.Notes = append(r.Notes, fmt.Sprintf("%s: %v", t.Name, err))
			}
		}
	}
	r.Duration = time.Since(start).Seconds()
	logf("done in %.0fs", r.Duration)
	return r, nil
}

func logRecord(rec record) {
	if rec.Err != "" {
		logf("%-15s %-26s rep %d: FAILED: %s", rec.Target, rec.Job, rec.Rep, rec.Err)
		return
	}
	if rec.Meta != nil {
		logf("%-15s %-26s rep %d: create %.2fs ls %.2fs tar %.2fs rm %.2fs", rec.Target, rec.Job, rec.Rep,
			rec.Meta["create_s"], rec.Meta["ls_s"], rec.Meta["tar_s"], rec.Meta["rm_s"])
		return
	}
	logf("%-15s %-26s rep %d: %8.1f MiB/s %9.0f IOPS p50 %7.1fus p99 %8.1fus cpu c/s %.2f/%.2fs",
		rec.Target, rec.Job, rec.Rep, rec.MiBps, rec.IOPS, rec.P50us, rec.P99us, rec.ClientCPU, rec.ServerCPU)
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

func describeMachine() machine {
	m := machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
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
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.Load = strings.TrimSpace(string(b))
	}
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) == nil {
		m.MemGiB = float64(si.Totalram) * float64(si.Unit) / (1 << 30)
	}
	if out, err := exec.Command("fio", "--version").Output(); err == nil {
		m.FIO = strings.TrimSpace(string(out))
	}
	return m
}
