package main

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// wireSample is the bytes each TCP socket bound to one of a server's ports
// has sent and received so far, by "local peer": what crossed a target's
// connections (lwio-server's session and softrdma listeners, sshd's),
// counted once, on the server's side. It asks ss(8) (iproute2), which
// reads the kernel's tcp_info.
type wireSample map[string]int64

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

// wireBetween is the bytes moved from a to b: sockets in both count their
// difference, sockets opened in between count whole. A socket closed in
// between is lost; the targets keep their connections for the whole run.
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
