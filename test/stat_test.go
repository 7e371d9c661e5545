package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// statJSON is the part of `lwio stat -json` the tests read (the full
// document is mountcmd.StatReport).
type statJSON struct {
	Mountpoint  string `json:"mountpoint"`
	DataPath    string `json:"data_path"`
	Completion  string `json:"completion"`
	Connections []struct {
		Provider   string `json:"provider"`
		Carrier    string `json:"carrier"`
		Remote     string `json:"remote"`
		Completion string `json:"completion"`
		Credits    int    `json:"credits"`
		Alive      bool   `json:"alive"`
		Requests   uint64 `json:"requests"`
		Bytes      uint64 `json:"bytes"`
	} `json:"connections"`
	Ops map[string]struct {
		Count  uint64  `json:"count"`
		Bytes  uint64  `json:"bytes"`
		Errors uint64  `json:"errors"`
		P50us  float64 `json:"p50_us"`
		P99us  float64 `json:"p99_us"`
	} `json:"ops"`
	Bytes struct {
		RDMA           uint64            `json:"rdma"`
		Providers      map[string]uint64 `json:"providers"`
		Session        uint64            `json:"session"`
		SessionWritten uint64            `json:"session_written"`
	} `json:"bytes"`
	Reconnects uint64 `json:"reconnects"`
	Interrupts *int64 `json:"interrupts"`
}

func lwioStat(t *testing.T, mnt string) statJSON {
	t.Helper()
	out := runCmd(t, "", nil, binaries.lwio, "stat", mnt, "-json")
	var st statJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("lwio stat -json: %v\n%s", err, out)
	}
	return st
}

// directIO writes n bytes of pattern to path with O_DIRECT and reads them
// back the same way: data the page cache cannot absorb.
func directIO(t *testing.T, path string, n int) {
	t.Helper()
	buf := alignedBuf(t, n)
	copy(buf, pattern(7, n))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	clear(buf)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, pattern(7, n)) {
		t.Fatalf("%s: the bytes read back differ from those written", path)
	}
}

// TestStat: `lwio stat` reads a running mount — its connections, requests
// by opcode with bytes and latency, and what carried the bytes — and the
// figures follow the I/O done: O_DIRECT data over RDMA (softrdma here), a
// small buffered file over the session channel, and the counters survive a
// server restart, which shows as a reconnect. The server's /metrics moves
// with the same I/O, and `lwio devices` lists the mount and exits 0.
func TestStat(t *testing.T) {
	needFUSE(t)
	metrics := freeAddr(t)
	s := startServer(t, ServerConfig{Args: []string{"-metrics", metrics}})
	// Without leases: under a Write lease a small new file's first bytes
	// are held back and go in the BATCH at close, over the session
	// channel (test/lease_test.go), which the figures below rule out.
	m := mountShare(t, s, MountConfig{Completion: "auto", Options: []string{"noleases"}})

	st := lwioStat(t, m.Dir)
	if st.DataPath != "lwio/softrdma" || st.Completion != "auto" || len(st.Connections) == 0 || st.Interrupts == nil {
		t.Fatalf("fresh mount: %+v", st)
	}
	for _, c := range st.Connections {
		if c.Provider != "softrdma" || c.Remote != s.Soft || !c.Alive || c.Credits <= 0 || !strings.HasPrefix(c.Completion, "auto/") {
			t.Errorf("connection %+v: want softrdma to %s, alive, with credits, completion auto/…", c, s.Soft)
		}
		if c.Carrier != "pipe+shm" { // the server is on this host
			t.Errorf("connection %+v: want it on the same-host pipes with shared memory", c)
		}
	}

	const n = 4 << 20
	directIO(t, filepath.Join(m.Dir, "big"), n)
	small := pattern(8, 10000)
	mustWrite(t, filepath.Join(m.Dir, "small"), small) // buffered: over LWIO too (registered at OPEN)

	st2 := lwioStat(t, m.Dir)
	r, w := st2.Ops["READ"], st2.Ops["WRITE"]
	if r.Bytes < n || r.Count == 0 || r.P50us <= 0 || r.P99us < r.P50us {
		t.Errorf("READ %+v: want ≥ %d bytes with latencies", r, n)
	}
	if w.Bytes+st2.Ops["VEC_WRITE"].Bytes < n {
		t.Errorf("WRITE %+v VEC_WRITE %+v: want ≥ %d bytes", w, st2.Ops["VEC_WRITE"], n)
	}
	if st2.Bytes.RDMA < 2*n || st2.Bytes.Providers["softrdma"] != st2.Bytes.RDMA {
		t.Errorf("bytes %+v: want ≥ %d by RDMA, all on softrdma", st2.Bytes, 2*n)
	}
	if st2.Bytes.SessionWritten != 0 || st2.Bytes.Session > n/8 {
		t.Errorf("session bytes %+v: want no file data written over the session channel (the small file's %d bytes go over LWIO), and not the O_DIRECT data", st2.Bytes, len(small))
	}
	var sum uint64
	for _, c := range st2.Connections {
		sum += c.Bytes
	}
	if sum != st2.Bytes.RDMA {
		t.Errorf("connections carried %d bytes, the mount %d by RDMA", sum, st2.Bytes.RDMA)
	}

	table := runCmd(t, "", nil, binaries.lwio, "stat", m.Dir)
	for _, want := range []string{"by RDMA", "by session", "no NIC", "softrdma", "READ", "p99"} {
		if !strings.Contains(table, want) {
			t.Errorf("lwio stat table has no %q:\n%s", want, table)
		}
	}

	// The server's /metrics moved by the same I/O.
	got := scrapeMetrics(t, metrics)
	if v := got[`lwio_rdma_bytes_total{provider="softrdma"}`]; v < float64(st2.Bytes.RDMA) {
		t.Errorf("server lwio_rdma_bytes_total %v, the mount moved %d", v, st2.Bytes.RDMA)
	}
	if v := got[`lwio_connections{provider="softrdma"}`]; int(v) != len(st2.Connections) {
		t.Errorf("server lwio_connections %v, the mount has %d", v, len(st2.Connections))
	}

	// A restart: one reconnect, and the figures go on from where they were.
	s.crashAndRestart(t)
	directIO(t, filepath.Join(m.Dir, "big"), 1<<20)
	st3 := lwioStat(t, m.Dir)
	if st3.Reconnects < 1 || st3.Ops["READ"].Count <= r.Count || st3.Bytes.RDMA <= st2.Bytes.RDMA {
		t.Errorf("after a server restart: reconnects %d, READs %d (were %d), RDMA bytes %d (were %d)",
			st3.Reconnects, st3.Ops["READ"].Count, r.Count, st3.Bytes.RDMA, st2.Bytes.RDMA)
	}

	devs := runCmd(t, "", nil, binaries.lwio, "devices")
	if !strings.Contains(devs, m.Dir) || !strings.Contains(devs, "lwio/softrdma") {
		t.Errorf("lwio devices does not list the mount %s on lwio/softrdma:\n%s", m.Dir, devs)
	}
	if _, err := os.Stat("/sys/class/infiniband"); os.IsNotExist(err) && !strings.Contains(devs, "rdma link add rxe0 type rxe netdev") {
		t.Errorf("lwio devices on a host without RDMA does not say how to get Soft-RoCE:\n%s", devs)
	}

	// Not a mount: a clear error and exit 1.
	out, err := exec.Command(binaries.lwio, "stat", t.TempDir()).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "not an lwiofs mount point") {
		t.Errorf("lwio stat on a plain directory: %v: %s", err, out)
	}
}

// scrapeMetrics reads the server's /metrics into "name{labels}" → value.
func scrapeMetrics(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// TestSameHostFallbackTCP: a server whose softrdma stays on TCP (as one
// from before the same-host path, or with LWIO_SOFT_TCP=1) serves a mount
// on this host over TCP, and `lwio stat` says so.
func TestSameHostFallbackTCP(t *testing.T) {
	needFUSE(t)
	s := startServer(t, ServerConfig{Env: []string{"LWIO_SOFT_TCP=1"}})
	m := mountShare(t, s, MountConfig{Options: []string{"noleases"}})
	directIO(t, filepath.Join(m.Dir, "big"), 4<<20)
	st := lwioStat(t, m.Dir)
	if len(st.Connections) == 0 || st.Bytes.Providers["softrdma"] < 8<<20 {
		t.Fatalf("stat %+v: want the data on softrdma", st)
	}
	for _, c := range st.Connections {
		if c.Provider != "softrdma" || c.Carrier != "tcp" || !c.Alive {
			t.Errorf("connection %+v: want softrdma over tcp", c)
		}
	}
}

// TestSameHostSharedMemory: a mount on the server's host shares its
// registered memory with the server (softrdma's same-host shared memory):
// the connections say pipe+shm (unix+shm without pipes), and 1 MiB O_DIRECT writes and reads, which
// go by copy through it, read back what was written and reach the
// export. A server that does not offer it (LWIO_SOFT_NOSHM=1, as one from
// before it) keeps every byte on the unix socket.
func TestSameHostSharedMemory(t *testing.T) {
	needFUSE(t)
	for _, tc := range []struct {
		name, env, carrier string
	}{
		{"shared", "", "pipe+shm"},
		{"server without", "LWIO_SOFT_NOSHM=1", "pipe"},
		{"server without pipes", "LWIO_SOFT_NOPIPES=1", "unix+shm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var env []string
			if tc.env != "" {
				env = []string{tc.env}
			}
			s := startServer(t, ServerConfig{Env: env})
			for _, mode := range []string{"interrupt", "polling"} {
				m := mountShare(t, s, MountConfig{Completion: mode, Options: []string{"noleases"}})
				name := "big-" + mode
				directIO(t, filepath.Join(m.Dir, name), 8<<20)
				got, err := os.ReadFile(filepath.Join(s.Shares["share"], name))
				if err != nil || !bytes.Equal(got, pattern(7, 8<<20)) {
					t.Fatalf("%s: the export holds other bytes (%v)", mode, err)
				}
				st := lwioStat(t, m.Dir)
				if len(st.Connections) == 0 || st.Bytes.Providers["softrdma"] < 16<<20 {
					t.Fatalf("stat %+v: want the data on softrdma", st)
				}
				for _, c := range st.Connections {
					if c.Provider != "softrdma" || c.Carrier != tc.carrier || !c.Alive {
						t.Errorf("%s: connection %+v: want softrdma over %s", mode, c, tc.carrier)
					}
				}
			}
		})
	}
}
