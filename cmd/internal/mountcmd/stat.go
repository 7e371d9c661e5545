package mountcmd

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/cmd/internal/ctl"
	"github.com/lwiofs/lwiofs/fs"
	"github.com/lwiofs/lwiofs/protocol/stats"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
	"github.com/lwiofs/lwiofs/transport/verbs"
)

// StatReport is what `lwio stat MOUNTPOINT -json` prints: the running
// mount's own figures since it was mounted (across reconnects), and the
// RDMA device ports its verbs connections use.
type StatReport struct {
	Mountpoint string `json:"mountpoint"`
	Source     string `json:"source"`
	// DataPath is "lwio/verbs", "lwio/softrdma", "session" (no RDMA) or
	// "disconnected" (reconnecting).
	DataPath string `json:"data_path"`
	// Completion is the completion= option (auto, interrupt, polling).
	Completion  string       `json:"completion"`
	Connections []ConnReport `json:"connections"`
	// Ops are the LWIO requests by opcode.
	Ops   map[string]stats.OpSnapshot `json:"ops"`
	Bytes BytesReport                 `json:"bytes"`
	// Completions are the LWIO I/O requests by the mode they completed in.
	Completions map[string]uint64 `json:"completions"`
	Reconnects  uint64            `json:"reconnects"`
	// Interrupts are the INTERRUPT requests polling waits sent (FIG. 9A).
	Interrupts int64 `json:"interrupts"`
	// CollapsedWrites are VEC_WRITEs sent as one page (FIG. 17B).
	CollapsedWrites int64 `json:"collapsed_writes"`
	// SplitReads are reads sent as pieces over idle connections at once.
	SplitReads int64 `json:"split_reads"`
	// Ports are the RDMA ports of the verbs connections with their
	// device-wide counters, read by `lwio stat` from sysfs.
	Ports []PortReport `json:"ports,omitempty"`
}

// ConnReport is one LWIO connection.
type ConnReport struct {
	Provider string `json:"provider"`
	// Device and Port are the RDMA device and port that carry a verbs
	// connection (rdmamap and sysfs, from its local address).
	Device string `json:"device,omitempty"`
	Port   int    `json:"port,omitempty"`
	// Carrier is the socket under a softrdma connection: "tcp", or "unix"
	// to a server on the same host ("unix+shm" when the mount's registered
	// memory is shared with it; "pipe", "pipe+shm" when the frames go on
	// pipes, as unless LWIO_SOFT_NOPIPES=1).
	Carrier     string `json:"carrier,omitempty"`
	Local       string `json:"local"`
	Remote      string `json:"remote"`
	Completion  string `json:"completion"`
	Credits     int    `json:"credits"`
	Alive       bool   `json:"alive"`
	Requests    uint64 `json:"requests"`
	Bytes       uint64 `json:"bytes"`
	Polled      uint64 `json:"polled"`
	Interrupted uint64 `json:"interrupted"`
	Switches    uint64 `json:"mode_switches"`
	// AutoLoad is completion=auto's moving average of the requests pending
	// on the connection, which it polls by (docs/engine.md).
	AutoLoad float64 `json:"auto_load,omitempty"`
}

// BytesReport says what carried the file data.
type BytesReport struct {
	// RDMA is the file data LWIO connections moved by RDMA WRITE and
	// SEND, on every provider; Providers splits it.
	RDMA      uint64            `json:"rdma"`
	Providers map[string]uint64 `json:"providers"`
	// Session is the file data over the session channel (TCP): the
	// fallback data path and the first bytes a handle writes.
	Session        uint64 `json:"session"`
	SessionRead    uint64 `json:"session_read"`
	SessionWritten uint64 `json:"session_written"`
}

// PortReport is an RDMA port a connection uses, with its counters.
type PortReport struct {
	Device     string            `json:"device"`
	Port       int               `json:"port"`
	Counters   map[string]uint64 `json:"counters,omitempty"`
	HWCounters map[string]uint64 `json:"hw_counters,omitempty"`
}

// statReport is the mount side of `lwio stat`: the control endpoint's
// "stat" handler.
func statReport(o *Options, r *fs.Reconnector, st *fs.Stats) StatReport {
	snap := st.LWIO.Snapshot()
	rep := StatReport{
		Mountpoint: o.Mountpoint, Source: o.Source(), DataPath: r.Name(), Completion: o.Completion,
		Connections: []ConnReport{}, Ops: snap.Ops, Completions: snap.Completions,
		Reconnects: st.Reconnects(), Interrupts: snap.Interrupts, CollapsedWrites: snap.Collapsed, SplitReads: snap.SplitReads,
		Bytes: BytesReport{Providers: snap.RDMABytes},
	}
	for _, n := range snap.RDMABytes {
		rep.Bytes.RDMA += n
	}
	rep.Bytes.SessionRead, rep.Bytes.SessionWritten = st.SessionBytes()
	rep.Bytes.Session = rep.Bytes.SessionRead + rep.Bytes.SessionWritten
	s := r.Current()
	if s == nil || s.LWIO == nil {
		return rep
	}
	var devs []transport.DeviceInfo
	for _, ci := range s.LWIO.Conns() {
		cr := ConnReport{
			Provider: ci.Provider, Carrier: ci.Carrier, Local: ci.LocalAddr, Remote: ci.RemoteAddr, Completion: ci.Completion,
			Credits: ci.Credits, Alive: ci.Alive, Requests: ci.Requests, Bytes: ci.Bytes,
			Polled: ci.Polled, Interrupted: ci.Interrupted, Switches: ci.Switches, AutoLoad: ci.Load,
		}
		if ci.Provider == verbs.Name {
			if devs == nil {
				devs, _ = transport.RDMADeviceInfos()
			}
			host, _, _ := net.SplitHostPort(ci.LocalAddr)
			cr.Device, cr.Port, _ = transport.PortForAddr(devs, net.ParseIP(host), transport.InterfaceAddrs)
		}
		rep.Connections = append(rep.Connections, cr)
	}
	return rep
}

// startControl opens the mount's control endpoint (cmd/internal/ctl) with
// its "stat" handler. A mount without one still works: the failure is
// logged and nil returned.
func startControl(o *Options, r *fs.Reconnector, st *fs.Stats, log logrus.FieldLogger) *ctl.Server {
	m, err := ctl.Find(o.Mountpoint)
	if err == nil {
		owner := os.Geteuid()
		var srv *ctl.Server
		srv, err = ctl.Listen(ctl.Dir(owner), m.Dev, owner, o.AllowOther, log.WithField("component", "control"))
		if err == nil {
			srv.Handle("stat", func(ctl.Request) (any, error) { return statReport(o, r, st), nil })
			log.WithField("socket", srv.Path()).Debug("control endpoint up (lwio stat)")
			return srv
		}
	}
	log.WithError(err).Warn("no control endpoint: lwio stat cannot read this mount")
	return nil
}

// runStat is `lwio stat MOUNTPOINT [-json]`.
func runStat(args []string, stdout, stderr io.Writer) int {
	asJSON := false
	var mnt string
	for _, a := range args {
		switch a {
		case "-json":
			asJSON = true
		case "-h", "-help", "--help":
			fmt.Fprint(stdout, statUsage)
			return 0
		default:
			if mnt != "" || strings.HasPrefix(a, "-") {
				fmt.Fprint(stderr, statUsage)
				return 2
			}
			mnt = a
		}
	}
	if mnt == "" {
		fmt.Fprint(stderr, statUsage)
		return 2
	}
	m, err := ctl.Find(mnt)
	if err != nil {
		fmt.Fprintf(stderr, "lwio stat: %v\n", err)
		return 1
	}
	var rep StatReport
	if err := ctl.Call(m.Socket(), m.Owner, "stat", nil, &rep); err != nil {
		fmt.Fprintf(stderr, "lwio stat: %s: %v\n", m.Point, err)
		return 1
	}
	rep.Ports = portReports(rep.Connections, transport.RDMAClassDir)
	if asJSON {
		printJSON(stdout, rep)
	} else {
		printStat(stdout, &rep)
	}
	return 0
}

// printJSON is the -json output of lwio stat and lwio devices: indented,
// one field a line, so that a shell script can grep it.
func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

const statUsage = `usage: lwio stat MOUNTPOINT [-json]
  what a running lwiofs mount moves and how: its connections (provider,
  RDMA device and port, completion mode, credits), requests by opcode with
  bytes and p50/p99 latency, and the bytes RDMA carried against those the
  session channel (TCP) carried, and how many no RDMA NIC carried
  (softrdma's and the session channel's)
`

// portReports reads the counters of the RDMA ports the connections use.
func portReports(conns []ConnReport, class string) []PortReport {
	var out []PortReport
	seen := map[string]bool{}
	for _, c := range conns {
		key := fmt.Sprintf("%s/%d", c.Device, c.Port)
		if c.Device == "" || seen[key] {
			continue
		}
		seen[key] = true
		d, err := transport.ReadRDMADevice(class, c.Device)
		if err != nil {
			continue
		}
		for _, p := range d.Ports {
			if p.Port == c.Port {
				out = append(out, PortReport{Device: c.Device, Port: c.Port, Counters: p.Counters, HWCounters: p.HWCounters})
			}
		}
	}
	return out
}

// printStat writes the human table.
func printStat(w io.Writer, r *StatReport) {
	fmt.Fprintf(w, "%s  %s  data path %s  completion=%s\n", r.Mountpoint, r.Source, r.DataPath, r.Completion)

	total := r.Bytes.RDMA + r.Bytes.Session
	// What no RDMA NIC carried: the session channel, and softrdma
	// whatever its carrier (TCP, or pipes, a unix socket and shared
	// memory to a server on this host: the device column says which).
	noNIC := r.Bytes.Session + r.Bytes.Providers[soft.Name]
	fmt.Fprintf(w, "\nfile data       %10s\n", size(total))
	fmt.Fprintf(w, "  by RDMA       %10s %s", size(r.Bytes.RDMA), pct(r.Bytes.RDMA, total))
	for _, p := range slices.Sorted(maps.Keys(r.Bytes.Providers)) {
		fmt.Fprintf(w, "  %s %s", p, size(r.Bytes.Providers[p]))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  by session    %10s %s  (TCP: read %s, written %s)\n", size(r.Bytes.Session), pct(r.Bytes.Session, total),
		size(r.Bytes.SessionRead), size(r.Bytes.SessionWritten))
	fmt.Fprintf(w, "  => no NIC     %10s %s  (the session channel, and softrdma: RDMA emulated in software, over TCP, or pipes or a unix socket and shared memory to a server on this host)\n", size(noNIC), pct(noNIC, total))

	fmt.Fprintf(w, "\nconnections\n")
	if len(r.Connections) == 0 {
		fmt.Fprintf(w, "  none: file data goes over the session channel\n")
	} else {
		fmt.Fprintf(w, "  %-3s %-9s %-8s %-22s %-16s %7s %9s %10s %8s %8s\n", "#", "provider", "device", "remote", "completion", "credits", "requests", "bytes", "polled", "intr")
		for i, c := range r.Connections {
			dev := "-"
			if c.Device != "" {
				dev = fmt.Sprintf("%s/%d", c.Device, c.Port)
			} else if c.Carrier != "" {
				dev = c.Carrier
			}
			state := ""
			if !c.Alive {
				state = "  (dead)"
			}
			fmt.Fprintf(w, "  %-3d %-9s %-8s %-22s %-16s %7d %9d %10s %8d %8d%s\n", i, c.Provider, dev, c.Remote, c.Completion,
				c.Credits, c.Requests, size(c.Bytes), c.Polled, c.Interrupted, state)
		}
	}

	fmt.Fprintf(w, "\nrequests\n  %-10s %9s %10s %7s %9s %9s\n", "opcode", "count", "bytes", "errors", "p50 µs", "p99 µs")
	for _, name := range slices.Sorted(maps.Keys(r.Ops)) {
		op := r.Ops[name]
		fmt.Fprintf(w, "  %-10s %9d %10s %7d %9.1f %9.1f\n", name, op.Count, size(op.Bytes), op.Errors, op.P50us, op.P99us)
	}
	fmt.Fprintf(w, "\ncompletions: interrupt %d, polling %d; INTERRUPT requests %d; reconnects %d; collapsed writes %d; split reads %d\n",
		r.Completions["interrupt"], r.Completions["polling"], r.Interrupts, r.Reconnects, r.CollapsedWrites, r.SplitReads)

	for _, p := range r.Ports {
		fmt.Fprintf(w, "\nRDMA port %s/%d (device counters: every user of the port, not this mount alone)\n", p.Device, p.Port)
		if v, ok := p.Counters["port_xmit_data"]; ok {
			fmt.Fprintf(w, "  sent %s, received %s (port_xmit_data, port_rcv_data × 4)\n", size(4*v), size(4*p.Counters["port_rcv_data"]))
		}
		for _, set := range []struct {
			name string
			m    map[string]uint64
		}{{"counters", p.Counters}, {"hw_counters", p.HWCounters}} {
			var nz []string
			for _, k := range slices.Sorted(maps.Keys(set.m)) {
				if set.m[k] != 0 {
					nz = append(nz, fmt.Sprintf("%s=%d", k, set.m[k]))
				}
			}
			if len(nz) > 0 {
				fmt.Fprintf(w, "  %s: %s\n", set.name, strings.Join(nz, " "))
			}
		}
	}
}

// size prints a byte count in binary units.
func size(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, u := float64(n)/unit, 0
	for v >= unit && u < 4 {
		v /= unit
		u++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[u])
}

func pct(n, total uint64) string {
	if total == 0 {
		return "     "
	}
	return fmt.Sprintf("%5.1f%%", 100*float64(n)/float64(total))
}
