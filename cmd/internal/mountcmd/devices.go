package mountcmd

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/lwiofs/lwiofs/cmd/internal/ctl"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/verbs"
)

// DevicesReport is what `lwio devices -json` prints.
type DevicesReport struct {
	// Status says in a sentence what the host offers (transport.RDMAStatus).
	Status string `json:"status"`
	// Verbs is "usable" or why the verbs provider cannot be used here.
	Verbs   string          `json:"verbs"`
	Devices []DeviceReport  `json:"devices"`
	Mounts  []MountOfDevice `json:"mounts"`
	// SoftRoCE is how to get an RDMA device without RDMA hardware, when
	// there is none.
	SoftRoCE string `json:"soft_roce,omitempty"`
}

// DeviceReport is one RDMA device, its ports and the mounts using them.
type DeviceReport struct {
	transport.DeviceInfo
	// Netdevs are the network interfaces of its ports with their
	// addresses (what rdma_cm connects through).
	Netdevs map[string][]string `json:"netdevs"`
}

// MountOfDevice is an lwiofs mount and the RDMA ports its connections use
// ("DEV/PORT"); Error says why it could not be asked.
type MountOfDevice struct {
	Mountpoint string   `json:"mountpoint"`
	Source     string   `json:"source"`
	DataPath   string   `json:"data_path,omitempty"`
	Ports      []string `json:"ports"`
	Error      string   `json:"error,omitempty"`
}

const softRoCEHowTo = `To use RDMA without an RDMA NIC, make a Soft-RoCE device on an Ethernet
interface (as root; the kernel module rdma_rxe, rdma from iproute2):
    modprobe rdma_rxe
    rdma link add rxe0 type rxe netdev eth0
then mount with provider=verbs (or auto). Without one, lwiofs moves file data
over softrdma, its built-in software RDMA over TCP.`

// runDevices is `lwio devices [-json]`: it always exits 0 once it could
// look, RDMA or not.
func runDevices(args []string, stdout, stderr io.Writer) int {
	asJSON := false
	for _, a := range args {
		switch a {
		case "-json":
			asJSON = true
		default:
			fmt.Fprintln(stderr, "usage: lwio devices [-json]")
			return 2
		}
	}
	rep := devicesReport()
	if asJSON {
		printJSON(stdout, rep)
	} else {
		printDevices(stdout, &rep)
	}
	return 0
}

func devicesReport() DevicesReport {
	infos, err := transport.RDMADeviceInfos()
	rep := DevicesReport{Verbs: "usable", Devices: []DeviceReport{}, Mounts: []MountOfDevice{}}
	var devs []transport.RDMADevice
	for _, d := range infos {
		dr := DeviceReport{DeviceInfo: d, Netdevs: map[string][]string{}}
		rd := transport.RDMADevice{Name: d.Name}
		for _, p := range d.Ports {
			for _, nd := range p.Netdevs() {
				var addrs []string
				for _, a := range transport.InterfaceAddrs(nd) {
					addrs = append(addrs, a.String())
				}
				dr.Netdevs[nd] = addrs
				rd.Netdevs = append(rd.Netdevs, transport.Netdev{Name: nd, Addrs: transport.InterfaceAddrs(nd)})
			}
		}
		rep.Devices = append(rep.Devices, dr)
		devs = append(devs, rd)
	}
	rep.Status = transport.RDMAStatus(devs)
	if err != nil {
		rep.Status += " (" + err.Error() + ")"
	}
	if err := verbs.New(verbs.Options{}).Available(); err != nil {
		rep.Verbs = err.Error()
	}
	if len(infos) == 0 {
		rep.SoftRoCE = softRoCEHowTo
	}
	mounts, err := ctl.Mounts()
	if err != nil {
		rep.Mounts = append(rep.Mounts, MountOfDevice{Error: err.Error()})
	}
	for _, m := range mounts {
		md := MountOfDevice{Mountpoint: m.Point, Source: m.Source, Ports: []string{}}
		var st StatReport
		if err := ctl.Call(m.Socket(), m.Owner, "stat", nil, &st); err != nil {
			md.Error = err.Error()
		} else {
			md.DataPath = st.DataPath
			for _, c := range st.Connections {
				if c.Device == "" {
					continue
				}
				p := fmt.Sprintf("%s/%d", c.Device, c.Port)
				if !slices.Contains(md.Ports, p) {
					md.Ports = append(md.Ports, p)
				}
			}
		}
		rep.Mounts = append(rep.Mounts, md)
	}
	return rep
}

func printDevices(w io.Writer, r *DevicesReport) {
	fmt.Fprintf(w, "RDMA devices: %s\n", r.Status)
	fmt.Fprintf(w, "verbs provider: %s\n", r.Verbs)
	for _, d := range r.Devices {
		fmt.Fprintf(w, "\n%s\n", d.Name)
		for _, p := range d.Ports {
			fmt.Fprintf(w, "  port %d: %s (%s), %s", p.Port, p.State, p.PhysState, p.LinkLayer)
			if p.Rate != "" {
				fmt.Fprintf(w, ", %s", p.Rate)
			}
			fmt.Fprintln(w)
			for _, nd := range p.Netdevs() {
				fmt.Fprintf(w, "    netdev %s %s\n", nd, strings.Join(d.Netdevs[nd], " "))
			}
			for _, g := range p.GIDs {
				fmt.Fprintf(w, "    gid %d %s %s %s\n", g.Index, g.GID, g.Type, g.Netdev)
			}
			var users []string
			for _, m := range r.Mounts {
				if slices.Contains(m.Ports, fmt.Sprintf("%s/%d", d.Name, p.Port)) {
					users = append(users, m.Mountpoint)
				}
			}
			if len(users) == 0 {
				users = []string{"none"}
			}
			fmt.Fprintf(w, "    used by lwiofs mounts: %s\n", strings.Join(users, " "))
		}
	}
	if r.SoftRoCE != "" {
		fmt.Fprintf(w, "\n%s\n", r.SoftRoCE)
	}
	if len(r.Mounts) > 0 {
		fmt.Fprintf(w, "\nlwiofs mounts\n")
	}
	for _, m := range r.Mounts {
		switch {
		case m.Error != "":
			fmt.Fprintf(w, "  %s %s: cannot ask it: %s\n", m.Mountpoint, m.Source, m.Error)
		case len(m.Ports) == 0:
			fmt.Fprintf(w, "  %s %s: %s, no RDMA device\n", m.Mountpoint, m.Source, m.DataPath)
		default:
			fmt.Fprintf(w, "  %s %s: %s on %s\n", m.Mountpoint, m.Source, m.DataPath, strings.Join(m.Ports, " "))
		}
	}
}
