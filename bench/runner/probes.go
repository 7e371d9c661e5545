package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// probeRecord is one piece of a 4 KiB qd1 read measured on its own, once
// per repetition, beside the jobs (docs/bench.md, "Where a 4K read's time
// goes").
type probeRecord struct {
	Export string
	Name   string // probePread, probeTCP, probeSoft, probeEngine+MODE
	Rep    int
	N      int
	// P50us and P99us are 0 where the probe does not time each operation:
	// the engine benchmark gives a mean (ns/op).
	P50us, P99us, MeanUs float64
	Err                  string `json:",omitempty"`
}

const (
	probePread  = "pread"        // 4 KiB pread on the export's data file
	probeTCP    = "tcp-rtt"      // loopback TCP request/response, two processes
	probeSoft   = "softrdma-rtt" // softrdma SEND → RDMA WRITE WITH IMMEDIATE, two processes
	probeEngine = "engine-"      // + completion mode: protocol/client BenchmarkRandRead4KiB qd1
)

func runProbes(ctx context.Context, tl tools, cfg config, file, export, dir string, rep int) []probeRecord {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	n := strconv.Itoa(cfg.ProbeN)
	var prs []probeRecord
	add := func(p probeRecord) {
		p.Export, p.Rep = export, rep
		switch {
		case p.Err != "":
			logf("probe %s rep %d: FAILED: %s", p.Name, rep, p.Err)
		case strings.HasPrefix(p.Name, probeEngine):
			logf("probe %-22s rep %d: mean %6.1fus (n %d)", p.Name, rep, p.MeanUs, p.N)
		default:
			logf("probe %-22s rep %d: p50 %6.1fus p99 %7.1fus mean %6.1fus (n %d)", p.Name, rep, p.P50us, p.P99us, p.MeanUs, p.N)
		}
		prs = append(prs, p)
	}
	add(latencyCmd(ctx, probePread, tl.latency, "pread", "-file", file, "-n", n))
	for _, p := range []struct{ name, net string }{{probeTCP, "tcp"}, {probeSoft, "soft"}} {
		add(pingPong(ctx, tl.latency, p.name, p.net, n, dir))
	}
	for _, p := range engineBench(ctx, tl.engine, max(cfg.ProbeN/4, 100)) {
		add(p)
	}
	return prs
}

// latencyCmd runs bench/latency and reads its one JSON line.
func latencyCmd(ctx context.Context, name, bin string, args ...string) probeRecord {
	p := probeRecord{Name: name}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		p.Err = fmt.Sprintf("%v: %s", err, tailString(stderr.String(), 300))
		return p
	}
	var res struct {
		N      int     `json:"n"`
		P50us  float64 `json:"p50_us"`
		P99us  float64 `json:"p99_us"`
		MeanUs float64 `json:"mean_us"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		p.Err = fmt.Sprintf("output %q: %v", tailString(stdout.String(), 200), err)
		return p
	}
	p.N, p.P50us, p.P99us, p.MeanUs = res.N, res.P50us, res.P99us, res.MeanUs
	return p
}

// pingPong starts `latency serve` and runs `latency ping` against it: two
// processes, as the mount and the server are.
func pingPong(ctx context.Context, bin, name, network, n, dir string) probeRecord {
	d, err := startDaemon("latency serve", filepath.Join(dir, "latency-"+network+".log"), nil, bin, "serve", "-net", network)
	if err != nil {
		return probeRecord{Name: name, Err: err.Error()}
	}
	defer d.stop()
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == ""; {
		b, _ := os.ReadFile(d.log)
		if a, ok := strings.CutPrefix(string(b), "listening "); ok {
			addr, _, _ = strings.Cut(a, "\n")
		}
		if addr == "" && (d.exited() || time.Now().After(deadline)) {
			return probeRecord{Name: name, Err: "latency serve did not listen: " + d.logTail()}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return latencyCmd(ctx, name, bin, "ping", "-net", network, "-addr", addr, "-n", n)
}

// engineLine matches a result line of protocol/client's
// BenchmarkRandRead4KiB at qd1, e.g.
// "BenchmarkRandRead4KiB/interrupt/qd1-2   1250   61234 ns/op   0.07 MB/s".
var engineLine = regexp.MustCompile(`^BenchmarkRandRead4KiB/([^/\s]+)/qd1(?:-\d+)?\s+(\d+)\s+([\d.]+) ns/op`)

// engineBench runs the LWIO engines in one process (client and server
// over softrdma on loopback, a tmpfs file): a 4 KiB READ at qd1 in every
// completion mode the test binary knows, n reads each. It gives a mean.
func engineBench(ctx context.Context, bin string, n int) []probeRecord {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "-test.run", "^$", "-test.bench", `^BenchmarkRandRead4KiB$/.*/^qd1$`,
		"-test.benchtime", fmt.Sprintf("%dx", n))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	prs := parseEngine(stdout.String())
	if err != nil || len(prs) == 0 {
		return []probeRecord{{Name: probeEngine + "?", Err: fmt.Sprintf("%v: %s", err, tailString(stdout.String()+stderr.String(), 300))}}
	}
	return prs
}

func parseEngine(out string) []probeRecord {
	var prs []probeRecord
	for _, l := range strings.Split(out, "\n") {
		m := engineLine.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[2])
		ns, _ := strconv.ParseFloat(m[3], 64)
		prs = append(prs, probeRecord{Name: probeEngine + m[1], N: n, MeanUs: ns / 1000})
	}
	return prs
}
