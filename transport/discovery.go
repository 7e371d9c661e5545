package transport

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"

	"github.com/Mellanox/rdmamap"
)

// ProviderInfo is one provider as the LWIO negotiate lists it (seed FIG. 4A,
// 4B: the provider list): its name and the instances through which it can
// be reached on a host.
type ProviderInfo struct {
	Name      string
	Instances []Instance
	// Seals is not on the wire: a server sets it on its own providers
	// whose connections can seal (ProviderSeals), so a sealed session is
	// offered only those unless the fabric is trusted.
	Seals bool
}

func (p ProviderInfo) String() string {
	s := make([]string, len(p.Instances))
	for i, in := range p.Instances {
		s[i] = in.String()
	}
	return p.Name + "[" + strings.Join(s, " ") + "]"
}

// Common computes the minimal list of shared providers (seed: "the client
// and server determine a minimal list of shared RDMA-capable providers"):
// the providers of local whose name remote also lists, in local's order of
// preference, each once, with local's instances — the side that calls
// Common is the one whose instances the peer will connect to (the server
// answering a negotiate). A local provider with no instances is left out:
// nobody could connect to it.
func Common(local, remote []ProviderInfo) []ProviderInfo {
	theirs := make(map[string]bool, len(remote))
	for _, r := range remote {
		theirs[r.Name] = true
	}
	seen := map[string]bool{}
	var out []ProviderInfo
	for _, l := range local {
		if !theirs[l.Name] || seen[l.Name] || len(l.Instances) == 0 {
			continue
		}
		seen[l.Name] = true
		out = append(out, ProviderInfo{Name: l.Name, Instances: append([]Instance(nil), l.Instances...), Seals: l.Seals})
	}
	return out
}

// RDMADevice is a local RDMA device (an entry of /sys/class/infiniband)
// with the network interfaces it carries and their IP addresses, through
// which rdma_cm reaches it.
type RDMADevice struct {
	Name    string
	Netdevs []Netdev
}

// Netdev is a network interface bound to an RDMA device.
type Netdev struct {
	Name  string
	Addrs []net.IP
}

// RDMAClassDir is where the kernel lists RDMA devices.
const RDMAClassDir = rdmamap.RdmaClassDir

// RDMADevices lists the local RDMA devices through github.com/Mellanox/rdmamap:
// every device of /sys/class/infiniband, and for each network interface the
// RDMA device that carries it (RoCE: the device's GID table names the
// netdev; IPoIB: the node GUID matches the hardware address). Loopback is
// skipped. No devices is not an error; see RDMAStatus for why.
func RDMADevices() ([]RDMADevice, error) {
	names := rdmamap.GetRdmaDeviceList()
	if len(names) == 0 {
		return nil, nil
	}
	sort.Strings(names)
	devs := make([]RDMADevice, len(names))
	index := map[string]int{}
	for i, n := range names {
		devs[i].Name = n
		index[n] = i
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return devs, fmt.Errorf("transport: listing network interfaces: %w", err)
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		dev, err := rdmamap.GetRdmaDeviceForNetdevice(ifc.Name)
		if err != nil || dev == "" {
			continue
		}
		i, ok := index[dev]
		if !ok {
			continue
		}
		nd := Netdev{Name: ifc.Name}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLinkLocalUnicast() {
				nd.Addrs = append(nd.Addrs, ipn.IP)
			}
		}
		devs[i].Netdevs = append(devs[i].Netdevs, nd)
	}
	return devs, nil
}

// RDMAStatus explains in one sentence what the host offers for RDMA, from
// the device list alone (it does not load libibverbs; a provider's
// Available says the rest).
func RDMAStatus(devs []RDMADevice) string {
	if len(devs) == 0 {
		if _, err := os.Stat(RDMAClassDir); errors.Is(err, os.ErrNotExist) {
			return RDMAClassDir + " does not exist: this kernel has no RDMA support loaded (no ib_core), so there are no RDMA devices"
		}
		return "no RDMA devices in " + RDMAClassDir + " (no RDMA NIC driver bound; Soft-RoCE: rdma link add rxe0 type rxe netdev <dev>)"
	}
	usable := 0
	for _, d := range devs {
		for _, n := range d.Netdevs {
			usable += len(n.Addrs)
		}
	}
	if usable == 0 {
		return fmt.Sprintf("%d RDMA device(s) but no IP address on their network interfaces: rdma_cm cannot address them", len(devs))
	}
	return fmt.Sprintf("%d RDMA device(s), %d address(es) usable by rdma_cm", len(devs), usable)
}

// DiscoverConfig says what to list besides the RDMA devices.
type DiscoverConfig struct {
	// Verbs is the verbs provider; nil leaves it out. It is listed only
	// when Available reports nil and some RDMA netdev has an address.
	Verbs Provider
	// VerbsPort is the port the verbs provider listens on, the
	// discriminator of each of its instances; 0 leaves verbs out.
	VerbsPort int
	// Others are listed after verbs, in order: typically the software
	// provider with its listen addresses (given, not discovered, so this
	// package does not depend on the providers).
	Others []ProviderInfo
}

// Discovery is the result of Discover.
type Discovery struct {
	// Providers is the local list for the negotiate, in order of
	// preference: verbs (one instance per address of every netdev of
	// every RDMA device) first when usable, then Others.
	Providers []ProviderInfo
	// Devices is what RDMADevices found.
	Devices []RDMADevice
	// VerbsErr is why verbs is not in Providers (nil when it is).
	VerbsErr error
}

// Discover lists the local providers.
func Discover(cfg DiscoverConfig) Discovery {
	var d Discovery
	devs, err := RDMADevices()
	d.Devices = devs
	switch {
	case cfg.Verbs == nil:
		d.VerbsErr = errors.New("no verbs provider configured")
	case cfg.VerbsPort <= 0 || cfg.VerbsPort > 65535:
		d.VerbsErr = errors.New("verbs provider has no listen port")
	case err != nil:
		d.VerbsErr = err
	default:
		if aerr := cfg.Verbs.Available(); aerr != nil {
			d.VerbsErr = aerr
			break
		}
		info := ProviderInfo{Name: cfg.Verbs.Name()}
		for _, dev := range devs {
			for _, nd := range dev.Netdevs {
				for _, ip := range nd.Addrs {
					in, err := InstanceFor(net.JoinHostPort(ip.String(), fmt.Sprint(cfg.VerbsPort)))
					if err == nil {
						info.Instances = append(info.Instances, in)
					}
				}
			}
		}
		if len(info.Instances) == 0 {
			d.VerbsErr = errors.New(RDMAStatus(devs))
			break
		}
		d.Providers = append(d.Providers, info)
	}
	d.Providers = append(d.Providers, cfg.Others...)
	return d
}

// Describe writes a human-readable account of local discovery, for
// `lwio-mount -providers`: the RDMA devices found (or why there are none),
// whether verbs is usable and why not, and the provider list the negotiate
// would carry. It does the discovery itself and returns it.
func Describe(w io.Writer, cfg DiscoverConfig) Discovery {
	d := Discover(cfg)
	fmt.Fprintf(w, "RDMA devices: %s\n", RDMAStatus(d.Devices))
	for _, dev := range d.Devices {
		if len(dev.Netdevs) == 0 {
			fmt.Fprintf(w, "  %s: no network interface\n", dev.Name)
		}
		for _, nd := range dev.Netdevs {
			addrs := make([]string, len(nd.Addrs))
			for i, a := range nd.Addrs {
				addrs[i] = a.String()
			}
			if len(addrs) == 0 {
				addrs = []string{"(no address)"}
			}
			fmt.Fprintf(w, "  %s: netdev %s %s\n", dev.Name, nd.Name, strings.Join(addrs, " "))
		}
	}
	if d.VerbsErr != nil {
		fmt.Fprintf(w, "verbs: not usable: %v\n", d.VerbsErr)
	} else {
		fmt.Fprintf(w, "verbs: usable\n")
	}
	if len(d.Providers) == 0 {
		fmt.Fprintf(w, "providers offered: none\n")
		return d
	}
	fmt.Fprintf(w, "providers offered, in order of preference:\n")
	for i, p := range d.Providers {
		fmt.Fprintf(w, "  %d. %s\n", i+1, p)
	}
	return d
}
