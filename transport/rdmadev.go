package transport

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/Mellanox/rdmamap"
)

// DeviceInfo is an RDMA device as sysfs shows it (/sys/class/infiniband/DEV),
// for `lwio devices` and `lwio stat`.
type DeviceInfo struct {
	Name  string     `json:"name"`
	Ports []PortInfo `json:"ports"`
}

// PortInfo is one port of an RDMA device.
type PortInfo struct {
	Port      int    `json:"port"`
	State     string `json:"state"`      // "ACTIVE", "DOWN"…
	PhysState string `json:"phys_state"` // "LinkUp"…
	LinkLayer string `json:"link_layer"` // "Ethernet" (RoCE) or "InfiniBand"
	Rate      string `json:"rate,omitempty"`
	// GIDs are the port's non-zero GID table entries.
	GIDs []GID `json:"gids"`
	// Counters and HWCounters are the port's counters and hw_counters
	// directories (the device's, for every user of the port). Standard
	// counters such as port_xmit_data count 4-byte words (IBA 16.1).
	Counters   map[string]uint64 `json:"counters,omitempty"`
	HWCounters map[string]uint64 `json:"hw_counters,omitempty"`
}

// GID is a GID table entry: the address RoCE puts on the wire, with the
// network interface it belongs to.
type GID struct {
	Index  int    `json:"index"`
	GID    string `json:"gid"`
	Type   string `json:"type,omitempty"` // "RoCE v2", "IB/RoCE v1"
	Netdev string `json:"netdev,omitempty"`
}

// Netdevs are the distinct network interfaces of the port's GIDs.
func (p PortInfo) Netdevs() []string {
	var out []string
	for _, g := range p.GIDs {
		if g.Netdev != "" && !slices.Contains(out, g.Netdev) {
			out = append(out, g.Netdev)
		}
	}
	return out
}

// RDMADeviceInfos reads every RDMA device rdmamap lists from sysfs. No
// devices is not an error (RDMAStatus says why).
func RDMADeviceInfos() ([]DeviceInfo, error) {
	names := rdmamap.GetRdmaDeviceList()
	sort.Strings(names)
	var out []DeviceInfo
	var errs []error
	for _, n := range names {
		d, err := ReadRDMADevice(RDMAClassDir, n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, d)
	}
	return out, errors.Join(errs...)
}

// ReadRDMADevice reads device name under class (RDMAClassDir, or a copy of
// it in tests): its ports' state, link layer, rate, GIDs with their netdevs
// and counters.
func ReadRDMADevice(class, name string) (DeviceInfo, error) {
	d := DeviceInfo{Name: name}
	dir := filepath.Join(class, name, "ports")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return d, err
	}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		d.Ports = append(d.Ports, readPort(filepath.Join(dir, e.Name()), n))
	}
	sort.Slice(d.Ports, func(i, j int) bool { return d.Ports[i].Port < d.Ports[j].Port })
	return d, nil
}

func readPort(dir string, n int) PortInfo {
	p := PortInfo{
		Port:      n,
		State:     afterColon(readLine(filepath.Join(dir, "state"))),
		PhysState: afterColon(readLine(filepath.Join(dir, "phys_state"))),
		LinkLayer: readLine(filepath.Join(dir, "link_layer")),
		Rate:      readLine(filepath.Join(dir, "rate")),
	}
	gids, _ := os.ReadDir(filepath.Join(dir, "gids"))
	for _, g := range gids {
		i, err := strconv.Atoi(g.Name())
		if err != nil {
			continue
		}
		v := readLine(filepath.Join(dir, "gids", g.Name()))
		if v == "" || strings.Trim(v, "0:") == "" {
			continue // an empty entry
		}
		p.GIDs = append(p.GIDs, GID{
			Index:  i,
			GID:    v,
			Type:   readLine(filepath.Join(dir, "gid_attrs", "types", g.Name())),
			Netdev: readLine(filepath.Join(dir, "gid_attrs", "ndevs", g.Name())),
		})
	}
	sort.Slice(p.GIDs, func(i, j int) bool { return p.GIDs[i].Index < p.GIDs[j].Index })
	p.Counters = readCounters(filepath.Join(dir, "counters"))
	p.HWCounters = readCounters(filepath.Join(dir, "hw_counters"))
	return p
}

// readLine is a sysfs attribute's first line, "" when it cannot be read
// (some attributes fail with EINVAL by design, e.g. an unused GID's type).
func readLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(s)
}

// afterColon turns "4: ACTIVE" into "ACTIVE".
func afterColon(s string) string {
	if _, v, ok := strings.Cut(s, ":"); ok {
		return strings.TrimSpace(v)
	}
	return s
}

// readCounters reads a counters directory: one unsigned number a file.
func readCounters(dir string) map[string]uint64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := map[string]uint64{}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		if v, err := strconv.ParseUint(readLine(filepath.Join(dir, e.Name())), 10, 64); err == nil {
			out[e.Name()] = v
		}
	}
	return out
}

// PortForAddr finds the device and port that carry local address ip: the
// port whose GID table lists a network interface holding ip (RoCE). ok is
// false when none does (softrdma, or an address of no RDMA netdev).
func PortForAddr(devs []DeviceInfo, ip net.IP, netdevAddrs func(netdev string) []net.IP) (dev string, port int, ok bool) {
	if ip == nil {
		return "", 0, false
	}
	for _, d := range devs {
		for _, p := range d.Ports {
			for _, nd := range p.Netdevs() {
				for _, a := range netdevAddrs(nd) {
					if a.Equal(ip) {
						return d.Name, p.Port, true
					}
				}
			}
		}
	}
	return "", 0, false
}

// InterfaceAddrs are the IP addresses of network interface name (nil if it
// has none or does not exist): PortForAddr's netdevAddrs on a real host.
func InterfaceAddrs(name string) []net.IP {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return nil
	}
	addrs, _ := ifc.Addrs()
	var out []net.IP
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			out = append(out, ipn.IP)
		}
	}
	return out
}
