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
)

// dataFile is the file the fio jobs read and write and cp copies.
const dataFile = "bench.dat"

// layout writes the data file once on the export.
func layout(ctx context.Context, dir, size string) error {
	cmd := exec.CommandContext(ctx, "fio", "--name=layout", "--directory="+dir, "--filename="+dataFile,
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
	rec := record{Target: t.Name, Job: j.Name()}
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
	err := measure(t, &rec, cmd)
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

// runCp copies the data file to another file of the same directory with
// cp (coreutils: FICLONE, then copy_file_range, then read/write) and
// fsyncs the copy, caches dropped first: what a user copying a file on
// the share waits for (issue 23). The copy is removed afterwards, untimed.
func runCp(ctx context.Context, t *target) record {
	rec := record{Target: t.Name, Job: kindCp}
	src, dst := filepath.Join(t.Dir, dataFile), filepath.Join(t.Dir, "copy.bin")
	defer os.Remove(dst)
	fi, err := os.Stat(src)
	if err != nil {
		rec.Err = err.Error()
		return rec
	}
	dropCaches()
	cmd := exec.CommandContext(ctx, "sh", "-c", `cp -- "$1" "$2" && sync -- "$2"`, "cp", src, dst)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := measure(t, &rec, cmd); err != nil {
		rec.Err = fmt.Sprintf("cp: %v: %s", err, tailString(stderr.String(), 500))
		return rec
	}
	if cf, err := os.Stat(dst); err != nil || cf.Size() != fi.Size() {
		rec.Err = fmt.Sprintf("cp: the copy is not the file's size (%v)", err)
		return rec
	}
	rec.Bytes = fi.Size()
	rec.MiBps = float64(fi.Size()) / (1 << 20) / rec.Seconds
	return rec
}

// runMeta runs bench/meta.sh on the target.
func runMeta(ctx context.Context, t *target, tarball string, n int) record {
	rec := record{Target: t.Name, Job: kindMeta}
	cmd := exec.CommandContext(ctx, "bench/meta.sh", t.Dir, tarball, strconv.Itoa(n))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := measure(t, &rec, cmd); err != nil {
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
