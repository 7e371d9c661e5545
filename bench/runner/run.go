package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The exports a run can serve: a tmpfs, where the export, the no-op
// passthrough and lwio-server all read memory (the ceiling comparison),
// and a directory on the -work disk.
const (
	exportTmpfs = "tmpfs"
	exportDisk  = "disk"
)

// tools are the programs the bench drives; "" means build it from the
// tree into the work directory.
type tools struct {
	bin     string // lwio-server, lwio-mount and lwio
	nullfs  string // bench/nullfs
	latency string // bench/latency
	engine  string // protocol/client's test binary
}

// build fills in the tools not given, building them into dir.
func (tl *tools) build(dir string) error {
	for _, b := range []struct {
		path      *string
		name, cmd string // cmd: the go subcommand
		pkg       string
	}{
		{&tl.nullfs, "nullfs", "build", "./bench/nullfs"},
		{&tl.latency, "latency", "build", "./bench/latency"},
		{&tl.engine, "client.test", "test -c", "./protocol/client"},
	} {
		if *b.path != "" {
			continue
		}
		*b.path = filepath.Join(dir, b.name)
		args := append(strings.Fields(b.cmd), "-o", *b.path, b.pkg)
		if out, err := exec.Command(goTool(), args...).CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

func run(ctx context.Context, cfg config, tl tools, workRoot string) (*runResult, error) {
	start := time.Now()
	r := &runResult{Started: start.UTC(), Config: cfg, Machine: describeMachine()}
	defer func() {
		r.Duration = time.Since(start).Seconds()
		r.Machine.LoadEnd = loadavg()
		logf("done in %.0fs; load average %s", r.Duration, r.Machine.LoadEnd)
	}()
	work, err := os.MkdirTemp(workRoot, "lwiofs-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	if err := tl.build(work); err != nil {
		return nil, err
	}
	tarball := filepath.Join(work, "tree.tar")
	if hasJob(cfg.Jobs, kindMeta) || hasJob(cfg.DiskJobs, kindMeta) {
		src := filepath.Join(runtime.GOROOT(), "src")
		if out, err := runOutput(goTool(), "env", "GOROOT"); err == nil {
			src = filepath.Join(strings.TrimSpace(out), "src")
		}
		if out, err := exec.Command("tar", "-cf", tarball, "-C", src, cfg.MetaTree).CombinedOutput(); err != nil {
			return r, fmt.Errorf("tar of the source tree: %v\n%s", err, out)
		}
	}
	for i, export := range cfg.Exports {
		jobs := cfg.Jobs
		if export == exportDisk && len(cfg.Exports) > 1 {
			jobs = cfg.DiskJobs
		}
		// The pieces of a 4 KiB read are measured beside the first
		// export's jobs, where the pread reads its data file.
		s := section{cfg: cfg, tl: tl, export: export, jobs: jobs, probes: i == 0, tarball: tarball,
			dir: filepath.Join(work, export)}
		if err := s.run(ctx, r); err != nil {
			return r, err
		}
	}
	return r, nil
}

func hasJob(js []job, kind string) bool {
	for _, j := range js {
		if j.Kind == kind {
			return true
		}
	}
	return false
}

// section is one export served through every target, and the jobs run
// against them, interleaved and repeated.
type section struct {
	cfg          config
	tl           tools
	export       string
	jobs         []job
	probes       bool
	tarball, dir string
}

func (s *section) run(ctx context.Context, r *runResult) error {
	if len(s.jobs) == 0 {
		return nil
	}
	logf("%s export: %d jobs × %d targets × %d repetitions", s.export, len(s.jobs), len(s.cfg.Targets), s.cfg.Repeat)
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	exp := filepath.Join(s.dir, "export")
	if err := os.MkdirAll(exp, 0o755); err != nil {
		return err
	}
	if s.export == exportTmpfs {
		if err := unix.Mount("lwiofs-bench", exp, "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("mount a tmpfs export at %s (the bench runs as root): %v", exp, err)
		}
		cleanups = append(cleanups, func() {
			if err := unix.Unmount(exp, unix.MNT_DETACH); err != nil {
				logf("unmount the tmpfs export %s: %v", exp, err)
			}
		})
	}
	env := &setupEnv{work: s.dir, export: exp, nullfs: s.tl.nullfs, lwio: map[string]lwioSpec{}, servers: map[string]*lwioServer{}}
	for _, spec := range s.cfg.LWIO {
		env.lwio[spec.Name] = spec
	}
	var tgs []*target
	for _, name := range s.cfg.Targets {
		t, cleanup, err := env.setupTarget(ctx, name)
		if cleanup != nil {
			cleanups = append(cleanups, cleanup)
		}
		if err != nil {
			note := fmt.Sprintf("%s %s: not measured: %v", s.export, name, err)
			logf("%s", note)
			r.Notes = append(r.Notes, note)
			continue
		}
		logf("%s target %s ready at %s", s.export, name, t.Dir)
		if t.DataPath != "" {
			note := fmt.Sprintf("%s %s: data path %s", s.export, name, t.DataPath)
			logf("%s", note)
			r.Notes = append(r.Notes, note)
		}
		tgs = append(tgs, t)
	}
	if len(tgs) == 0 {
		return fmt.Errorf("%s export: no target could be set up", s.export)
	}
	// Lay the data file out once, on the export itself, so no target
	// pays for it and all read the same blocks.
	logf("laying out the %s data file on the %s export", s.cfg.Size, s.export)
	if err := layout(ctx, exp, s.cfg.Size); err != nil {
		return err
	}
	for rep := 0; rep < s.cfg.Repeat; rep++ {
		if s.probes {
			r.Probes = append(r.Probes, runProbes(ctx, s.tl, s.cfg, filepath.Join(exp, dataFile), s.export, s.dir, rep)...)
		}
		for _, j := range s.jobs {
			for _, t := range tgs {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				rec := s.runJob(ctx, t, j)
				rec.Rep, rec.Export = rep, s.export
				logRecord(rec)
				r.Records = append(r.Records, rec)
			}
		}
		// Stop the mount processes from dying unseen.
		for _, t := range tgs {
			if err := t.alive(); err != nil {
				r.Notes = append(r.Notes, fmt.Sprintf("%s %s: %v", s.export, t.Name, err))
			}
		}
	}
	return nil
}

func (s *section) runJob(ctx context.Context, t *target, j job) record {
	switch j.Kind {
	case kindMeta:
		return runMeta(ctx, t, s.tarball, s.cfg.MetaN)
	case kindCp:
		return runCp(ctx, t)
	}
	return runFIO(ctx, t, j, s.cfg)
}

// measure runs cmd as a job's work on t and records what it cost: wall
// time, the CPU of the target's process trees, of cmd itself (with the
// children it waited for) and of the whole machine, and the bytes on the
// target's connections.
func measure(t *target, rec *record, cmd *exec.Cmd) error {
	rec.HasClient, rec.HasSrvr = t.client != nil, t.server != nil
	c0, s0 := sampleTree(t.client), sampleTree(t.server)
	w0, werr := sampleWire(t)
	m0, _ := machineBusy()
	start := time.Now()
	err := cmd.Run()
	rec.Seconds = time.Since(start).Seconds()
	m1, merr := machineBusy()
	if merr == nil {
		rec.MachineCPU = m1 - m0
	}
	if ps := cmd.ProcessState; ps != nil {
		rec.AppCPU = (ps.UserTime() + ps.SystemTime()).Seconds()
	}
	rec.ClientCPU, rec.ServerCPU = cpuBetween(c0, sampleTree(t.client)), cpuBetween(s0, sampleTree(t.server))
	if (len(t.ports) > 0 || t.lwioStat != "") && werr == nil {
		if w1, err := sampleWire(t); err == nil {
			rec.WireBytes, rec.HasWire = wireBetween(w0, w1), true
		}
	}
	return err
}

// dropCaches writes dirty data back and empties the page, dentry and inode
// caches, so every job starts cold (needs root; otherwise a no-op). A
// tmpfs export keeps its data: there is no disk to fall back to.
func dropCaches() {
	syscall.Sync()
	_ = os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

func runOutput(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	return string(out), err
}
