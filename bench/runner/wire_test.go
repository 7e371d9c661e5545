package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// statJSON is `lwio stat MOUNTPOINT -json` cut to its connections (the
// fields of cmd/internal/mountcmd.ConnReport the bench reads): two
// softrdma connections over the same-host unix socket, which ss cannot
// see, and one over TCP, which it can; unix moved by the first's bytes,
// tcp by the third's.
func statJSON(unix, tcp int64) string {
	return fmt.Sprintf(`{"mountpoint":"/mnt","data_path":"lwio/softrdma","connections":[
{"provider":"softrdma","carrier":"unix","local":"@lwio-soft","remote":"/run/lwio-soft.sock","completion":"auto/interrupt","credits":32,"alive":true,"requests":9,"bytes":%d},
{"provider":"softrdma","carrier":"unix","local":"@lwio-soft","remote":"/run/lwio-soft.sock","completion":"auto/interrupt","credits":32,"alive":true,"requests":0,"bytes":4096},
{"provider":"softrdma","carrier":"tcp","local":"127.0.0.1:40000","remote":"127.0.0.1:4451","completion":"auto/interrupt","credits":32,"alive":true,"requests":3,"bytes":%d}],
"ops":{"READ":{"count":9,"bytes":%d}},"bytes":{"rdma":%d,"providers":{"softrdma":%d},"session":0,"session_read":0,"session_written":0}}`,
		unix, tcp, unix+tcp, unix+tcp+4096, unix+tcp+4096)
}

func TestLWIOStatSample(t *testing.T) {
	s, err := lwioStatSample([]byte(statJSON(1000, 5000)))
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, v := range s {
		sum += v
	}
	if len(s) != 2 || sum != 1000+4096 {
		t.Errorf("lwioStatSample = %v, want the two unix connections (5096 bytes), not the TCP one ss counts", s)
	}
	// A mount older than the unix socket names no carrier: its softrdma
	// is TCP, which ss counts; verbs has no carrier and no socket.
	s, _ = lwioStatSample([]byte(`{"connections":[{"provider":"softrdma","bytes":7},{"provider":"verbs","bytes":9}]}`))
	if len(s) != 1 || wireBetween(nil, s) != 9 {
		t.Errorf("old softrdma + verbs: %v, want the verbs connection only", s)
	}
	if _, err := lwioStatSample([]byte("lwio: no mount at /mnt\n")); err == nil {
		t.Error("a stat that is not JSON gave a sample")
	}
}

// TestMeasureLWIOWire measures a job on an lwiofs target whose file data
// crosses a unix socket (softrdma to a server on the same host) and whose
// session channel is TCP: the wire counts both, the first from the mount's
// counters (a fake lwio that answers `stat -json` from a file the job
// rewrites), the second through ss. Counting TCP sockets only, as before,
// reads 300 bytes for a MiB of file data.
func TestMeasureLWIOWire(t *testing.T) {
	dir := t.TempDir()
	port, session, _ := loopbackPair(t)

	counters := filepath.Join(dir, "stat.json")
	if err := os.WriteFile(counters, []byte(statJSON(1<<20, 5<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	after := filepath.Join(dir, "after.json")
	if err := os.WriteFile(after, []byte(statJSON(2<<20, 10<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	lwio := filepath.Join(dir, "lwio")
	script := fmt.Sprintf("#!/bin/sh\n[ \"$1 $2 $3\" = \"stat %s -json\" ] || { echo usage >&2; exit 2; }\ncat %s\n", dir, counters)
	if err := os.WriteFile(lwio, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	tg := &target{Name: "lwio-auto", Dir: dir, ports: []int{port}, lwioStat: lwio}
	// The job: the counters move by 1 MiB on the first unix connection
	// (and 5 MiB on the TCP one, which is the fake's: no socket carries
	// it, so ss must not see it and lwioStatSample must not count it), and
	// 300 bytes cross the session channel.
	job := exec.Command("sh", "-c", fmt.Sprintf("cp %s %s && head -c 300 /dev/zero", after, counters))
	job.Stdout = session
	var rec record
	if err := measure(tg, &rec, job); err != nil {
		t.Fatal(err)
	}
	if !rec.HasWire || rec.WireBytes != 1<<20+300 {
		t.Errorf("wire = %d (counted %v), want %d: 1 MiB over the unix socket + 300 B of session channel",
			rec.WireBytes, rec.HasWire, 1<<20+300)
	}

	// A mount whose lwio cannot answer has no wire figure, rather than ss's
	// part alone.
	tg.lwioStat = filepath.Join(dir, "missing")
	rec = record{}
	if err := measure(tg, &rec, exec.Command("true")); err != nil {
		t.Fatal(err)
	}
	if rec.HasWire {
		t.Errorf("wire counted (%d) without the mount's counters", rec.WireBytes)
	}
}
