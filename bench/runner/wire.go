package main

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// wireSample is the bytes each connection of a target has carried so far,
// by a key naming the connection: what crossed the target's connections,
// counted once. TCP sockets bound to one of a server's ports (lwio-server's
// session and softrdma listeners, sshd's) are keyed "local peer" and
// counted on the server's side by ss(8) (iproute2), which reads the
// kernel's tcp_info. An lwiofs mount's RDMA connections that ss cannot see
// (softrdma over pipes or a unix socket to a server on the same host,
// verbs) are keyed "rdma …" and counted by the mount itself
// (lwioStatSample).
type wireSample map[string]int64

// sampleWire is what t's connections have carried so far: its server's TCP
// sockets and, for an lwiofs mount, the RDMA connections no TCP socket
// carries.
func sampleWire(t *target) (wireSample, error) {
	s, err := wireSampleOf(t.ports)
	if err != nil || t.lwioStat == "" {
		return s, err
	}
	out, err := exec.Command(t.lwioStat, "stat", t.Dir, "-json").Output()
	if err != nil {
		return nil, fmt.Errorf("lwio stat %s: %v", t.Dir, err)
	}
	rdma, err := lwioStatSample(out)
	if err != nil {
		return nil, err
	}
	if s == nil {
		s = wireSample{}
	}
	for k, v := range rdma {
		s[k] = v
	}
	return s, nil
}

func wireSampleOf(ports []int) (wireSample, error) {
	if len(ports) == 0 {
		return nil, nil
	}
	var f []string
	for _, p := range ports {
		f = append(f, fmt.Sprintf("sport = :%d", p))
	}
	out, err := exec.Command("ss", "-Htin", "state", "established", "( "+strings.Join(f, " or ")+" )").Output()
	if err != nil {
		return nil, fmt.Errorf("ss: %v", err)
	}
	return parseSS(string(out)), nil
}

// parseSS reads `ss -Htin` output: a line per socket (Recv-Q Send-Q local
// peer) followed by an indented line of tcp_info fields, among them
// bytes_sent:N and bytes_received:N (absent while zero).
func parseSS(out string) wireSample {
	s := wireSample{}
	var key string
	for _, l := range strings.Split(out, "\n") {
		if l == "" {
			continue
		}
		f := strings.Fields(l)
		if l[0] != ' ' && l[0] != '\t' {
			if len(f) >= 4 {
				key = f[len(f)-2] + " " + f[len(f)-1]
				s[key] = 0
			}
			continue
		}
		for _, kv := range f {
			k, v, ok := strings.Cut(kv, ":")
			if ok && (k == "bytes_sent" || k == "bytes_received") {
				n, _ := strconv.ParseInt(v, 10, 64)
				s[key] += n
			}
		}
	}
	return s
}

// lwioStatSample reads `lwio stat MOUNTPOINT -json` (docs/usage.md,
// cmd/internal/mountcmd.StatReport): the file data each LWIO connection of
// the mount has moved, for the connections that do not run over TCP — a
// softrdma connection over a unix socket or pipes (carrier "unix",
// "unix+shm", "pipe", "pipe+shm") or verbs (no carrier). A softrdma
// connection over TCP is left out: ss counts it, headers included; so is one with no carrier, from a mount older than the
// unix socket (always TCP). The session channel is TCP, always counted by ss.
// What is counted here is file data only: the LWIO headers and control
// messages on those connections are not (a few hundred bytes per request).
func lwioStatSample(statJSON []byte) (wireSample, error) {
	var rep struct {
		Connections []struct {
			Provider, Carrier, Local, Remote string
			Bytes                            int64
		}
	}
	if err := json.Unmarshal(statJSON, &rep); err != nil {
		return nil, fmt.Errorf("lwio stat -json: %v", err)
	}
	s := wireSample{}
	for i, c := range rep.Connections {
		if c.Carrier == "tcp" || c.Carrier == "" && c.Provider == "softrdma" {
			continue // ss counts it (softrdma without a carrier: a mount from before unix sockets)
		}
		s[fmt.Sprintf("rdma %d %s/%s %s %s", i, c.Provider, c.Carrier, c.Local, c.Remote)] = c.Bytes
	}
	return s, nil
}

// wireBetween is the bytes moved from a to b: connections in both count
// their difference, connections opened in between count whole. A
// connection closed in between is lost; the targets keep their connections
// for the whole run.
func wireBetween(a, b wireSample) int64 {
	var n int64
	for k, vb := range b {
		if va, ok := a[k]; ok && va <= vb {
			n += vb - va
		} else {
			n += vb
		}
	}
	return n
}

// wireWhat says, in the report's headings, what the wire figures count for
// each kind of target.
const wireWhat = "both directions, counted once. sshfs: every byte on sshd's TCP sockets (`ss`). " +
	"lwiofs: every byte on lwio-server's TCP sockets (`ss`: the session channel, and softrdma when it runs over TCP) " +
	"plus the file data of the RDMA connections no TCP socket carries (softrdma to a server on the same host: pipes, a unix socket, shared memory; verbs), " +
	"from the mount's counters (`lwio stat -json`; their LWIO headers are not counted). dir and nullfs have no connections"
