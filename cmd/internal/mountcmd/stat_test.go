package mountcmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lwiofs/lwiofs/protocol/stats"
)

// The ports a mount's verbs connections use are shown with their sysfs
// counters beside the mount's own bytes (issue 17 item 6); a softrdma
// connection has no port, and shows the socket it runs on.
func TestStatShowsPortCounters(t *testing.T) {
	class := t.TempDir()
	for name, v := range map[string]string{
		"counters/port_xmit_data":   "262144",
		"counters/port_rcv_data":    "1024",
		"hw_counters/sent_pkts":     "300",
		"hw_counters/rcvd_pkts":     "0",
		"hw_counters/duplicate_req": "2",
	} {
		p := filepath.Join(class, "rxe0", "ports", "1", name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rep := StatReport{
		Mountpoint: "/mnt/x", Source: "//h/s", DataPath: "lwio/verbs", Completion: "auto",
		Connections: []ConnReport{
			{Provider: "verbs", Device: "rxe0", Port: 1, Remote: "10.0.0.1:7446", Completion: "auto/polling", Alive: true, Bytes: 3 << 20},
			{Provider: "verbs", Device: "rxe0", Port: 1, Remote: "10.0.0.1:7446", Completion: "auto/interrupt", Alive: true, Bytes: 1 << 20},
			{Provider: "softrdma", Carrier: "unix", Remote: "10.0.0.1:7447", Completion: "auto/interrupt"},
		},
		Ops:   map[string]stats.OpSnapshot{"READ": {Count: 4, Bytes: 4 << 20, P50us: 20, P99us: 90}},
		Bytes: BytesReport{RDMA: 4 << 20, Providers: map[string]uint64{"verbs": 4 << 20}, Session: 1 << 20, SessionWritten: 1 << 20},
	}
	rep.Ports = portReports(rep.Connections, class)
	if len(rep.Ports) != 1 || rep.Ports[0].Device != "rxe0" || rep.Ports[0].HWCounters["sent_pkts"] != 300 || rep.Ports[0].Counters["port_xmit_data"] != 262144 {
		t.Fatalf("ports %+v: want rxe0/1 once, with its counters", rep.Ports)
	}
	var b bytes.Buffer
	printStat(&b, &rep)
	out := b.String()
	for _, want := range []string{
		"RDMA port rxe0/1", "sent 1.0 MiB, received 4.0 KiB", "sent_pkts=300", "duplicate_req=2",
		"by RDMA          4.0 MiB  80.0%  verbs 4.0 MiB", "by session       1.0 MiB  20.0%", "auto/polling", "rxe0/1",
		"softrdma  unix", // the socket under a softrdma connection
	} {
		if !strings.Contains(out, want) {
			t.Errorf("lwio stat output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "rcvd_pkts=") {
		t.Errorf("a zero counter is shown:\n%s", out)
	}
}
