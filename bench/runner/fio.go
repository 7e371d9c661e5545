package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// dropCaches writes dirty data back and empties the page, dentry and inode
// caches, so every job starts cold (needs root; otherwise a no-op).
func dropCaches() {
	syscall.Sync()
	_ = os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}

// layout writes the data file once on local disk.
func layout(ctx context.Context, dir, size string) error {
	cmd := exec.CommandContext(ctx, "fio", "--name=layout", "--directory="+dir, "--filename=bench.dat",
		"--size="+size, "--rw=write", "--bs=1m", "--direct=1", "--ioengine=psync", "--end_fsync=1",
		"--output-format=terse")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("fio layout: %v\n%s", err, out)
	}
	return nil
}

// fioOutput is the part of fio's JSON output the bench reads.
type fioOutput struct {
	Jobs []struct {
		Error int `json:"error"`
		Read  fioDir
		Write fioDir
	} `json:"jobs"`
}

type fioDir struct {
	IOBytes int64   `json:"io_bytes"`
	BW      float64 `json:"bw_bytes"`
	IOPS    float64 `json:"iops"`
	ClatNS  struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
}

func runFIO(ctx context.Context, t *target, j job, cfg config) record {
	rec := record{Target: t.Name, Job: j.Name(), HasClient: t.client != nil, HasSrvr: t.server != nil}
	dropCaches()
	out := filepath.Join(os.TempDir(), fmt.Sprintf("lwiofs-bench-%d.json", os.Getpid()))
	defer os.Remove(out)
	direct := "0"
	if j.Direct {
		direct = "1"
	}
	cmd := exec.CommandContext(ctx, "fio", "--output-format=json", "--output="+out, j.File)
	cmd.Env = append(os.Environ(), "BENCH_DIR="+t.Dir, "BENCH_SIZE="+cfg.Size,
		"BENCH_RUNTIME="+strconv.Itoa(cfg.Runtime), "BENCH_DIRECT="+direct)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	c0, s0 := sampleTree(t.client), sampleTree(t.server)
	start := time.Now()
	err := cmd.Run()
	rec.Seconds = time.Since(start).Seconds()
	rec.ClientCPU, rec.ServerCPU = cpuBetween(c0, sampleTree(t.client)), cpuBetween(s0, sampleTree(t.server))
	b, rerr := os.ReadFile(out)
	if err != nil || rerr != nil {
		rec.Err = fmt.Sprintf("fio: %v %v: %s", err, rerr, strings.TrimSpace(tailString(stderr.String()+string(b), 500)))
		return rec
	}
	// fio may print warnings before the JSON document.
	if i := bytes.IndexByte(b, '{'); i > 0 {
		b = b[i:]
	}
	var fo fioOutput
	if err := json.Unmarshal(b, &fo); err != nil || len(fo.Jobs) == 0 {
		rec.Err = fmt.Sprintf("fio output: %v", err)
		return rec
	}
	jb := fo.Jobs[0]
	if jb.Error != 0 {
		rec.Err = fmt.Sprintf("fio job error %d: %s", jb.Error, tailString(stderr.String(), 500))
		return rec
	}
	lat := jb.Read
	if jb.Write.IOBytes > jb.Read.IOBytes {
		lat = jb.Write
	}
	rec.Bytes = jb.Read.IOBytes + jb.Write.IOBytes
	rec.MiBps = (jb.Read.BW + jb.Write.BW) / (1 << 20)
	rec.IOPS = jb.Read.IOPS + jb.Write.IOPS
	rec.P50us = lat.ClatNS.Percentile["50.000000"] / 1000
	rec.P99us = lat.ClatNS.Percentile["99.000000"] / 1000
	return rec
}

// runMeta runs bench/meta.sh on the target.
func runMeta(ctx context.Context, t *target, tarball string, n int) record {
	rec := record{Target: t.Name, Job: "meta", HasClient: t.client != nil, HasSrvr: t.server != nil}
	cmd := exec.CommandContext(ctx, "bench/meta.sh", t.Dir, tarball, strconv.Itoa(n))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	c0, s0 := sampleTree(t.client), sampleTree(t.server)
	start := time.Now()
	err := cmd.Run()
	rec.Seconds = time.Since(start).Seconds()
	rec.ClientCPU, rec.ServerCPU = cpuBetween(c0, sampleTree(t.client)), cpuBetween(s0, sampleTree(t.server))
	if err != nil {
		rec.Err = fmt.Sprintf("meta.sh: %v: %s", err, tailString(stderr.String(), 500))
		return rec
	}
	rec.Meta = map[string]float64{}
	for _, kv := range strings.Fields(stdout.String()) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err == nil {
			rec.Meta[k] = f
		}
	}
	return rec
}

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
