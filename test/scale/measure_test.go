package scale

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// traffic is a snapshot of every host's byte counters.
type traffic struct {
	at                                     time.Time
	payloadOut, payloadIn, wireOut, wireIn []uint64
	dropped                                uint64
}

func snapTraffic(nodes []*node) traffic {
	s := traffic{at: time.Now()}
	for _, n := range nodes {
		st := n.c.Stats()
		s.payloadOut = append(s.payloadOut, st.BytesSent)
		s.payloadIn = append(s.payloadIn, st.BytesReceived)
		s.wireOut = append(s.wireOut, n.tr.BytesSent.Load())
		s.wireIn = append(s.wireIn, n.tr.BytesReceived.Load())
		s.dropped += n.tr.PacketsDropped.Load()
	}
	return s
}

// rates are bytes per host per second between two snapshots.
func rates(a, b traffic, nodes int) trafficRates {
	secs := b.at.Sub(a.at).Seconds()
	one := func(x, y []uint64) rate {
		var sum, top uint64
		for i := range x {
			d := y[i] - x[i]
			sum += d
			top = max(top, d)
		}
		return rate{Mean: float64(sum) / float64(nodes) / secs, Max: float64(top) / secs, Total: sum}
	}
	return trafficRates{
		Window:     b.at.Sub(a.at),
		PayloadOut: one(a.payloadOut, b.payloadOut), PayloadIn: one(a.payloadIn, b.payloadIn),
		WireOut: one(a.wireOut, b.wireOut), WireIn: one(a.wireIn, b.wireIn),
		PacketsDropped: b.dropped - a.dropped,
	}
}

type heapStat struct {
	heap, sys uint64
	numGC     uint32
}

// heapNow forces a collection and returns the heap it found live
// (runtime/metrics /gc/heap/live:bytes). HeapAlloc would also count what
// the running hosts allocated while the collection ran, seconds for a
// heap of gigabytes.
func heapNow() heapStat {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	h := m.HeapAlloc
	if live[0].Value.Kind() == metrics.KindUint64 {
		h = live[0].Value.Uint64()
	}
	return heapStat{heap: h, sys: m.Sys, numGC: m.NumGC}
}

func perNode(b uint64, nodes int) uint64 {
	if int64(b) < 0 {
		return 0
	}
	return b / uint64(nodes)
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// wallNow is the real monotonic clock even inside a synctest bubble,
// where time.Now is virtual: how long the simulation takes to compute.
func wallNow() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// stopwatch measures one span in simulated time (virtual in a bubble,
// real otherwise), real time and CPU time.
type stopwatch struct {
	at        time.Time
	wall, cpu time.Duration
}

func startWatch() stopwatch { return stopwatch{at: time.Now(), wall: wallNow(), cpu: cpuTime()} }

// span is what elapsed since w started.
func (w stopwatch) span() span {
	s := span{Sim: time.Since(w.at), Wall: wallNow() - w.wall, CPU: cpuTime() - w.cpu}
	if s.Sim > 0 {
		s.CoresSimulated = float64(s.CPU) / float64(s.Sim)
	}
	return s
}

// span is one phase's duration: simulated, real, and CPU time spent.
type span struct {
	Sim, Wall, CPU time.Duration
	// CPU seconds per simulated second: what the hosts (and the
	// simulation's own bookkeeping) need summed over all hosts.
	CoresSimulated float64
}

// peakRSS is the process's high-water resident set (Linux), or 0.
func peakRSS() uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb uint64
		if _, err := fmt.Sscanf(sc.Text(), "VmHWM: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	return 0
}

func gitDescribe() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// limitRSS panics, ending the test binary, once the resident set passes
// limit bytes: a scenario that does not fit must fail, not take the
// machine's memory. It polls on the real clock, from outside any bubble.
func limitRSS(limit uint64) (stop func()) {
	done := make(chan struct{})
	page := uint64(os.Getpagesize())
	go func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			var size, rss uint64
			b, err := os.ReadFile("/proc/self/statm")
			if err == nil {
				_, err = fmt.Sscan(string(b), &size, &rss)
			}
			if err == nil && rss*page > limit {
				panic(fmt.Sprintf("scale: resident set %s passed the limit of %s (-scale.max-rss-gib): the scenario does not fit", kib(float64(rss*page)), kib(float64(limit))))
			}
		}
	}()
	return sync.OnceFunc(func() { close(done) })
}
