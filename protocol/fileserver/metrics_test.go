package fileserver

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// scrape GETs /metrics and parses the text exposition.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics: %s, %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// value is the value of family name's sample whose labels are labels
// ("k=v" pairs); a histogram's is its sample count. ok is false when there
// is no such sample.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// TestMetricsScrape: a client logs on, registers a file and reads and
// writes it over LWIO; the counters scraped from /metrics move by exactly
// that I/O, and every lwiofs metric is named lwio_….
func TestMetricsScrape(t *testing.T) {
	cfg := testConfig(t.TempDir(), 1)
	cfg.MetricsAddr = "127.0.0.1:0"
	srv := start(t, cfg)
	before := scrape(t, srv.MetricsAddr())
	if v, ok := value(before, "lwio_connections", "provider=softrdma"); !ok || v != 0 {
		t.Errorf("before: softrdma connections %v (present %v), want 0", v, ok)
	}
	if v, _ := value(before, "lwio_sessions"); v != 0 {
		t.Errorf("before: %v sessions", v)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, f := openOverLWIO(ctx, t, srv, 2)
	data := make([]byte, 8192)
	for i := 0; i < 3; i++ {
		if _, err := f.WriteAt(ctx, data, int64(i)*8192); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 5; i++ {
		if _, err := f.ReadAt(ctx, data, int64(i%3)*8192); err != nil {
			t.Fatal(err)
		}
	}

	after := scrape(t, srv.MetricsAddr())
	want := []struct {
		name   string
		labels []string
		v      float64
	}{
		{"lwio_sessions", nil, 1},
		{"lwio_rdma_sessions", nil, 1},
		{"lwio_connections", []string{"provider=softrdma"}, 2},
		{"lwio_requests_total", []string{"opcode=READ"}, 5},
		{"lwio_requests_total", []string{"opcode=WRITE"}, 3},
		{"lwio_requests_total", []string{"opcode=REGISTER"}, 1},
		{"lwio_requests_total", []string{"opcode=AUTH"}, 2},
		{"lwio_bytes_total", []string{"opcode=READ"}, 5 * 8192},
		{"lwio_bytes_total", []string{"opcode=WRITE"}, 3 * 8192},
		{"lwio_request_errors_total", []string{"opcode=READ"}, 0},
		{"lwio_request_duration_seconds", []string{"opcode=READ"}, 5},
		{"lwio_rdma_bytes_total", []string{"provider=softrdma"}, 8 * 8192},
		{"lwio_completions_total", []string{"mode=immediate"}, 5},
		{"lwio_completions_total", []string{"mode=status"}, 3},
		{"lwio_completions_total", []string{"mode=polling"}, 0},
		{"lwio_credit_budget", nil, float64(server.DefaultMaxBufferMemory / (server.DefaultMaxRecvBufferSize + 4096 - protocol.HeaderSize))},
		{"lwio_buffer_memory_bytes", nil, server.DefaultMaxBufferMemory},
		{"lwio_auth_refused_total", nil, 0},
	}
	for _, w := range want {
		got, ok := value(after, w.name, w.labels...)
		if !ok || got != w.v {
			t.Errorf("%s%v = %v (present %v), want %v", w.name, w.labels, got, ok, w.v)
		}
	}
	if v, _ := value(after, "lwio_credits_granted"); v < 2 {
		t.Errorf("credits granted %v, want at least one per connection", v)
	}
	// The latency histogram is cumulative and ends at its count.
	hist := after["lwio_request_duration_seconds"]
	for _, m := range hist.GetMetric() {
		var prev uint64
		for _, b := range m.Histogram.Bucket {
			if b.GetCumulativeCount() < prev {
				t.Errorf("histogram %v not cumulative", m.Label)
			}
			prev = b.GetCumulativeCount()
		}
		if prev > m.Histogram.GetSampleCount() || m.Histogram.GetSampleSum() <= 0 {
			t.Errorf("histogram %v: last bucket %d, count %d, sum %v", m.Label, prev, m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum())
		}
	}
	for name := range after {
		if !strings.HasPrefix(name, "lwio_") && !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") {
			t.Errorf("metric %q is not named lwio_…", name)
		}
	}
	if testing.Verbose() {
		for _, n := range []string{"lwio_requests_total", "lwio_rdma_bytes_total"} {
			fmt.Println(n, after[n].String())
		}
	}
}

// TestMetricsUsers: /metrics follows one user's open handles as it opens
// and closes files, and counts wrong passwords and the logon attempts the
// throttle held back after them.
func TestMetricsUsers(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 0)
	// An attempt after a failure waits up to 1 s: longer than a dial
	// takes, so each one after the first is held back.
	cfg.Session.LogonDelay, cfg.Session.LogonDelayMax = time.Second, time.Second
	cfg.MetricsAddr = "127.0.0.1:0"
	srv := start(t, cfg)
	get := func(name string, labels ...string) float64 {
		t.Helper()
		v, ok := value(scrape(t, srv.MetricsAddr()), name, labels...)
		if !ok && len(labels) == 0 {
			t.Errorf("%s missing from /metrics", name)
		}
		return v
	}
	if v := get("lwio_logon_failures_total"); v != 0 {
		t.Errorf("logon failures before any logon: %v", v)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 3 {
		if _, err := session.Dial(ctx, srv.SessionAddr(), session.ClientConfig{User: "u", Password: "wrong", KeepAlive: -1}); err == nil {
			t.Fatal("a wrong password logged on")
		}
	}
	if v := get("lwio_logon_failures_total"); v != 3 {
		t.Errorf("lwio_logon_failures_total = %v after 3 wrong passwords, want 3", v)
	}
	if v := get("lwio_logons_throttled_total"); v < 2 {
		t.Errorf("lwio_logons_throttled_total = %v, want the 2 attempts after the first failure at least", v)
	}
	if v := get("lwio_logon_throttle_seconds_total"); v <= 0 {
		t.Errorf("lwio_logon_throttle_seconds_total = %v, want > 0", v)
	}

	_, tr := dialTree(ctx, t, srv)
	var hs []session.Handle
	for i := range 3 {
		h, _, err := tr.Open(ctx, fmt.Sprintf("f%d", i), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	if v := get("lwio_open_handles", "user=u"); v != 3 {
		t.Errorf("lwio_open_handles{user=u} = %v with 3 files open, want 3", v)
	}
	if v := get("lwio_open_handles_all"); v != 3 {
		t.Errorf("lwio_open_handles_all = %v, want 3", v)
	}
	if err := tr.CloseHandle(ctx, hs[0]); err != nil {
		t.Fatal(err)
	}
	if v := get("lwio_open_handles", "user=u"); v != 2 {
		t.Errorf("lwio_open_handles{user=u} = %v after a close, want 2", v)
	}
	if st := srv.Session().Stats(); st.Handles["u"] != 2 || st.LogonFailures != 3 {
		t.Errorf("Session().Stats() = %+v", st)
	}
}
