package transport

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// fakeSysfs writes the parts of /sys/class/infiniband that ReadRDMADevice
// reads: rxe0 with one RoCE port on dum0 (an IPv6 link-local GID and an
// IPv4-mapped one, two empty entries) and its counters.
func fakeSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	port := filepath.Join(root, "rxe0", "ports", "1")
	files := map[string]string{
		"state":                      "4: ACTIVE\n",
		"phys_state":                 "5: LinkUp\n",
		"link_layer":                 "Ethernet\n",
		"rate":                       "10 Gb/sec (1X QDR)\n",
		"gids/0":                     "fe80:0000:0000:0000:0000:0000:0000:0001\n",
		"gids/1":                     "0000:0000:0000:0000:0000:ffff:0a4d:0001\n",
		"gids/2":                     "0000:0000:0000:0000:0000:0000:0000:0000\n",
		"gids/3":                     "0000:0000:0000:0000:0000:0000:0000:0000\n",
		"gid_attrs/types/0":          "RoCE v2\n",
		"gid_attrs/types/1":          "RoCE v2\n",
		"gid_attrs/ndevs/0":          "dum0\n",
		"gid_attrs/ndevs/1":          "dum0\n",
		"counters/port_xmit_data":    "262144\n",
		"counters/port_rcv_data":     "1024\n",
		"counters/port_xmit_packets": "300\n",
		"hw_counters/sent_pkts":      "300\n",
		"hw_counters/rcvd_pkts":      "12\n",
		"hw_counters/lifespan":       "10\n",
		"hw_counters/garbage":        "not a number\n",
	}
	for name, v := range files {
		p := filepath.Join(port, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestReadRDMADevice(t *testing.T) {
	root := fakeSysfs(t)
	d, err := ReadRDMADevice(root, "rxe0")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Ports) != 1 {
		t.Fatalf("ports %+v", d.Ports)
	}
	p := d.Ports[0]
	if p.Port != 1 || p.State != "ACTIVE" || p.PhysState != "LinkUp" || p.LinkLayer != "Ethernet" || p.Rate == "" {
		t.Errorf("port %+v", p)
	}
	if len(p.GIDs) != 2 || p.GIDs[1].Index != 1 || p.GIDs[1].Type != "RoCE v2" || p.GIDs[1].Netdev != "dum0" {
		t.Errorf("GIDs %+v: want the two non-empty entries on dum0", p.GIDs)
	}
	if nd := p.Netdevs(); len(nd) != 1 || nd[0] != "dum0" {
		t.Errorf("netdevs %v", nd)
	}
	if p.Counters["port_xmit_data"] != 262144 || p.HWCounters["sent_pkts"] != 300 || len(p.HWCounters) != 3 {
		t.Errorf("counters %v hw %v", p.Counters, p.HWCounters)
	}
	if _, err := ReadRDMADevice(root, "mlx5_0"); err == nil {
		t.Error("a missing device read without error")
	}

	addrs := func(nd string) []net.IP {
		if nd == "dum0" {
			return []net.IP{net.ParseIP("10.77.0.1")}
		}
		return nil
	}
	if dev, port, ok := PortForAddr([]DeviceInfo{d}, net.ParseIP("10.77.0.1"), addrs); !ok || dev != "rxe0" || port != 1 {
		t.Errorf("PortForAddr(10.77.0.1) = %s %d %v", dev, port, ok)
	}
	if _, _, ok := PortForAddr([]DeviceInfo{d}, net.ParseIP("127.0.0.1"), addrs); ok {
		t.Error("loopback found on an RDMA port")
	}
}
