package main

import (
	"os"
	"strconv"
	"strings"
)

// cpuTimes reads the machine's busy and total CPU time (in clock ticks) from
// /proc/stat, to tell how much of the machine a run used; ok is false where there
// is no such file.
func cpuTimes() (busy, total uint64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, false
	}
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, true
}

// cpuMeter measures the share of the machine's CPU time that was busy between
// start and the call of busy; -1 when unknown.
type cpuMeter struct {
	busy, total uint64
	ok          bool
}

func startCPU() cpuMeter {
	b, t, ok := cpuTimes()
	return cpuMeter{b, t, ok}
}

func (m cpuMeter) share() float64 {
	b, t, ok := cpuTimes()
	if !m.ok || !ok || t <= m.total {
		return -1
	}
	return float64(b-m.busy) / float64(t-m.total)
}
