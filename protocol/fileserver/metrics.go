package fileserver

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/protocol/stats"
)

// Metrics is the server's Prometheus registry: what `lwio-server -metrics
// ADDR` serves at /metrics in the text exposition format. Every metric is
// computed when scraped from the engines' own counters (Server.Stats of
// the LWIO engine, the session server's), so nothing is counted twice and
// the data path pays nothing for the endpoint.
//
// Adding a metric is one call in newMetrics (or anywhere with the Server):
//
//	m.Func("lwio_open_handles", "Open handles, by user.", prometheus.GaugeValue, []string{"user"},
//		func(emit func(v float64, labels ...string)) {
//			for user, n := range srv.Session().Stats().Handles {
//				emit(float64(n), user)
//			}
//		})
//
// Names start with lwio_; counters end in _total; durations are seconds.
type Metrics struct {
	reg *prometheus.Registry
}

// Func registers a metric computed at scrape time: collect calls emit once
// per label combination (labels in the order of the names given). kind is
// prometheus.CounterValue or prometheus.GaugeValue. It panics on a
// duplicate name, as a programming error.
func (m *Metrics) Func(name, help string, kind prometheus.ValueType, labels []string, collect func(emit func(v float64, labels ...string))) {
	m.reg.MustRegister(&funcCollector{desc: prometheus.NewDesc(name, help, labels, nil), kind: kind, collect: collect})
}

// Register adds any other collector (a histogram, say).
func (m *Metrics) Register(c prometheus.Collector) error { return m.reg.Register(c) }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// funcCollector is one metric family computed by a function.
type funcCollector struct {
	desc    *prometheus.Desc
	kind    prometheus.ValueType
	collect func(emit func(v float64, labels ...string))
}

func (f *funcCollector) Describe(ch chan<- *prometheus.Desc) { ch <- f.desc }

func (f *funcCollector) Collect(ch chan<- prometheus.Metric) {
	f.collect(func(v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(f.desc, f.kind, v, labels...)
	})
}

// newMetrics registers the server's metrics: the LWIO engine's, the
// session server's, and the Go runtime's and process's.
func newMetrics(s *Server) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(&engineCollector{s: s})
	m.Func("lwio_sessions", "Sessions logged on over the session channel.", prometheus.GaugeValue, nil,
		func(emit func(float64, ...string)) { emit(float64(s.sess.Sessions())) })
	registerSessionStats(m, s.sess)
	return m
}

// registerSessionStats publishes the session server's Stats: open handles
// by user (against max_open_files_per_user) and in all, logon failures
// and the logons the throttle held back. Read once per metric per scrape.
func registerSessionStats(m *Metrics, ss *session.Server) {
	m.Func("lwio_open_handles", "Open handles (files, directories, pipes) by user over all its sessions, durable opens kept for a reconnect included.", prometheus.GaugeValue, []string{"user"},
		func(emit func(float64, ...string)) {
			for user, n := range ss.Stats().Handles {
				emit(float64(n), user)
			}
		})
	m.Func("lwio_open_handles_all", "Open handles of all users together (bounded by limits.max_open_files).", prometheus.GaugeValue, nil,
		func(emit func(float64, ...string)) { emit(float64(ss.Stats().HandlesTotal)) })
	m.Func("lwio_logon_failures_total", "Logons refused for a wrong user name or password.", prometheus.CounterValue, nil,
		func(emit func(float64, ...string)) { emit(float64(ss.Stats().LogonFailures)) })
	m.Func("lwio_logons_throttled_total", "Logon attempts the throttle held back after earlier failures.", prometheus.CounterValue, nil,
		func(emit func(float64, ...string)) { emit(float64(ss.Stats().LogonsThrottled)) })
	m.Func("lwio_logon_throttle_seconds_total", "Time the throttle held logon attempts back, in all.", prometheus.CounterValue, nil,
		func(emit func(float64, ...string)) { emit(ss.Stats().ThrottleWait.Seconds()) })
}

// engineCollector exposes the LWIO engine's Stats, read once per scrape.
type engineCollector struct{ s *Server }

var (
	descConns      = prometheus.NewDesc("lwio_connections", "Live LWIO (RDMA) connections, by provider.", []string{"provider"}, nil)
	descRDMASess   = prometheus.NewDesc("lwio_rdma_sessions", "Sessions with at least one live LWIO connection.", nil, nil)
	descRequests   = prometheus.NewDesc("lwio_requests_total", "LWIO requests completed, by opcode.", []string{"opcode"}, nil)
	descErrors     = prometheus.NewDesc("lwio_request_errors_total", "LWIO requests that failed (a status other than success or end of file), by opcode.", []string{"opcode"}, nil)
	descBytes      = prometheus.NewDesc("lwio_bytes_total", "File bytes read and written by LWIO requests, by opcode.", []string{"opcode"}, nil)
	descLatency    = prometheus.NewDesc("lwio_request_duration_seconds", "Time from a request's arrival to its completion's post, by opcode.", []string{"opcode"}, nil)
	descRDMABytes  = prometheus.NewDesc("lwio_rdma_bytes_total", "File data moved by RDMA (read data written, write data received), by provider.", []string{"provider"}, nil)
	descComplete   = prometheus.NewDesc("lwio_completions_total", "I/O requests completed, by mode: immediate (RDMA WRITE WITH IMMEDIATE), status (STATUS_RESPONSE), polling (IO_STATUS_BLOCK).", []string{"mode"}, nil)
	descGranted    = prometheus.NewDesc("lwio_credits_granted", "Credits granted over the live LWIO connections.", nil, nil)
	descInUse      = prometheus.NewDesc("lwio_credits_in_use", "Credits held by requests not yet completed.", nil, nil)
	descBudget     = prometheus.NewDesc("lwio_credit_budget", "The server-wide credit budget.", nil, nil)
	descAuthRefuse = prometheus.NewDesc("lwio_auth_refused_total", "LWIO AUTH requests refused.", nil, nil)
	descInPlace    = prometheus.NewDesc("lwio_reads_in_place_total", "LWIO READs read straight into the client's memory (same-host shared memory).", nil, nil)
	descWrInPlace  = prometheus.NewDesc("lwio_writes_in_place_total", "LWIO WRITEs written straight from the client's memory (same-host shared memory).", nil, nil)
	descBufMemory  = prometheus.NewDesc("lwio_buffer_memory_bytes", "The receive-memory budget credits are granted against (max_buffer_memory).", nil, nil)
	descRecvBytes  = prometheus.NewDesc("lwio_recv_buffer_bytes", "Receive buffers registered now, posted or spare.", nil, nil)
)

func (e *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConns, descRDMASess, descRequests, descErrors, descBytes, descLatency,
		descRDMABytes, descComplete, descGranted, descInUse, descBudget, descAuthRefuse, descInPlace, descWrInPlace, descBufMemory, descRecvBytes} {
		ch <- d
	}
}

func (e *engineCollector) Collect(ch chan<- prometheus.Metric) {
	st := e.s.engine.Stats()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for p, n := range st.Connections {
		gauge(descConns, float64(n), p)
	}
	// A provider listened on but with no connection now still shows 0.
	for _, l := range e.s.info {
		if _, ok := st.Connections[l.Provider]; !ok {
			st.Connections[l.Provider] = 0
			gauge(descConns, 0, l.Provider)
		}
	}
	gauge(descRDMASess, float64(st.Sessions))
	bounds := stats.PowerOfTwoBounds()
	for name, op := range st.Ops {
		counter(descRequests, op.Count, name)
		counter(descErrors, op.Errors, name)
		counter(descBytes, op.Bytes, name)
		cum := op.Latency.Cumulative(bounds)
		buckets := make(map[float64]uint64, len(bounds))
		for i, b := range bounds {
			buckets[b.Seconds()] = cum[i]
		}
		ch <- prometheus.MustNewConstHistogram(descLatency, op.Latency.Count, op.Latency.Sum.Seconds(), buckets, name)
	}
	for p, n := range st.RDMABytes {
		counter(descRDMABytes, n, p)
	}
	for mode, n := range st.Completions {
		counter(descComplete, n, mode)
	}
	gauge(descGranted, float64(st.CreditsGranted))
	gauge(descInUse, float64(st.CreditsInUse))
	gauge(descBudget, float64(st.CreditBudget))
	counter(descAuthRefuse, st.AuthRefused)
	counter(descInPlace, st.ReadsInPlace)
	counter(descWrInPlace, st.WritesInPlace)
	gauge(descBufMemory, float64(st.BufferMemory))
	gauge(descRecvBytes, float64(st.RecvBufferBytes))
}

// serveMetrics listens on addr and serves /metrics until Close.
func (s *Server) serveMetrics(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.metrics.Handler())
	s.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	s.metricsAddr = l.Addr().String()
	s.serve("metrics", s.metricsAddr, func() error {
		if err := s.httpSrv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	return nil
}

// Metrics is the server's metric registry (see Metrics); a caller may add
// its own metrics to it.
func (s *Server) Metrics() *Metrics { return s.metrics }

// MetricsAddr is where /metrics is served ("" when Config.MetricsAddr was
// empty).
func (s *Server) MetricsAddr() string { return s.metricsAddr }
