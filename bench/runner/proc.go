package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat times (100 on Linux
// for every architecture the project builds on).
const clockTicks = 100

// procStat holds the fields of /proc/PID/stat the bench uses.
type procStat struct {
	ppid         int
	utime, stime uint64 // ticks
	start        string // starttime, to tell a PID's reuse
}

func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// The command name is in parentheses and may hold anything; the fields
	// after the last ')' start at field 3 (state).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return procStat{}, false
	}
	var st procStat
	st.ppid, _ = strconv.Atoi(f[1])                // field 4
	st.utime, _ = strconv.ParseUint(f[11], 10, 64) // field 14
	st.stime, _ = strconv.ParseUint(f[12], 10, 64) // field 15
	st.start = f[19]                               // field 22
	return st, true
}

func procStart(pid int) string {
	st, ok := readStat(pid)
	if !ok {
		return ""
	}
	return st.start
}

// allStats reads every process once.
func allStats() map[int]procStat {
	m := map[int]procStat{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return m
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok {
			m[pid] = st
		}
	}
	return m
}

func descendantsIn(m map[int]procStat, root int) []int {
	kids := map[int][]int{}
	for pid, st := range m {
		kids[st.ppid] = append(kids[st.ppid], pid)
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, k := range kids[p] {
			out = append(out, k)
			queue = append(queue, k)
		}
	}
	return out
}

func descendants(root int) []int { return descendantsIn(allStats(), root) }

// cpuSample is the CPU time of a process tree at one moment, per process,
// so that processes born or gone between two samples are counted right.
type cpuSample map[int]procStat

func sampleTree(root *daemon) cpuSample {
	if root == nil || root.exited() {
		return nil
	}
	m := allStats()
	s := cpuSample{}
	for _, pid := range append([]int{root.pid()}, descendantsIn(m, root.pid())...) {
		if st, ok := m[pid]; ok {
			s[pid] = st
		}
	}
	return s
}

// cpuBetween is the CPU seconds the tree used from a to b: processes alive
// in both count their difference, processes born in between count whole.
// A process that ended in between is lost (its time goes to its parent's
// cutime only); the daemons measured keep their workers alive.
func cpuBetween(a, b cpuSample) float64 {
	var ticks uint64
	for pid, sb := range b {
		if sa, ok := a[pid]; ok && sa.start == sb.start {
			ticks += (sb.utime + sb.stime) - (sa.utime + sa.stime)
		} else {
			ticks += sb.utime + sb.stime
		}
	}
	return float64(ticks) / clockTicks
}

// machineBusy is the CPU seconds every CPU of the machine has been busy
// since boot (/proc/stat: user, nice, system, irq, softirq; guest time is
// inside user; idle, iowait and steal are not work done here).
func machineBusy() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	return parseProcStat(string(b))
}

func parseProcStat(s string) (float64, error) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var ticks uint64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system (idle iowait) irq softirq
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %v", err)
		}
		ticks += v
	}
	return float64(ticks) / clockTicks, nil
}
