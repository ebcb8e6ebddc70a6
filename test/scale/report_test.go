package scale

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// results are a run's figures. Durations are nanoseconds in the JSON.
type results struct {
	Date       string `json:"date"`
	GoVersion  string `json:"goVersion"`
	OS         string `json:"os"`
	NumCPU     int    `json:"numCPU"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Git        string `json:"git"`
	Params     params `json:"params"`
	Converged  bool   `json:"converged"`
	Load       string `json:"loadavg"` // /proc/loadavg at the start and the end: other work on the machine

	Phases struct {
		StartNodes, Membership, JoinsIssued, Convergence, Teardown, Total time.Duration
	} `json:"phases"`
	Membership struct {
		FormedIn          time.Duration `json:"formedIn"`
		HeapPerNode       uint64        `json:"heapPerNode"`
		GoroutinesPerNode float64       `json:"goroutinesPerNode"`
	} `json:"membership"`
	Convergence struct {
		// Per endpoint: Join → programmed on every other host.
		P50, P90, P99, Max time.Duration
		// Per (endpoint, other host) pair: Join → programmed there.
		PairP50, PairP99, PairMax time.Duration
		// Since the first Join, when a share of the endpoints had converged.
		All50, All90, All99, All100 time.Duration
		Waves                       []waveStat
		Unconverged                 int // endpoints not programmed on every other host in time

	} `json:"convergence"`
	Gossip struct {
		Rollout, Steady trafficRates
	} `json:"gossip"`
	CPU struct {
		Rollout, Steady, Total cpuShare
	} `json:"cpu"`
	Memory struct {
		HeapPerNode          uint64  `json:"heapPerNode"`          // live heap per host after convergence, incl. membership
		HeapPerNodeEndpoints uint64  `json:"heapPerNodeEndpoints"` // of which the endpoints
		GoroutinesPerNode    float64 `json:"goroutinesPerNode"`
		HeapTotal, SysTotal  uint64
		NumGC                uint32
		PeakRSS              uint64 `json:"peakRSS"`
	} `json:"memory"`
	Cluster   map[string]clusterAgg `json:"cluster"`
	Transport struct {
		PacketsDropped uint64 `json:"packetsDropped"`
	} `json:"transport"`
	Kernel    []kernelCost `json:"kernel"`
	Anomalies struct {
		ForeignIP, OwnIP, DeleteNeighbor int64
	} `json:"anomalies"`
	Resync struct {
		Runs, Added, Removed, Errors int64
	} `json:"resync"`
	Warnings []string `json:"warnings"`
}

type waveStat struct {
	Wave          int
	StartedAt     time.Duration // after the first wave's start
	Endpoints     int
	P50, P99, Max time.Duration
}

type rate struct {
	Mean  float64 `json:"meanPerNodePerSec"`
	Max   float64 `json:"maxNodePerSec"`
	Total uint64  `json:"total"`
}

type trafficRates struct {
	Window                                 time.Duration
	PayloadOut, PayloadIn, WireOut, WireIn rate
	PacketsDropped                         uint64
}

type cpuShare struct {
	CPU, Wall time.Duration
	Cores     float64 // CPU seconds per wall second
	Share     float64 // of GOMAXPROCS
}

type kernelCost struct {
	Op    string
	Calls int64
	Total time.Duration
}

type clusterAgg struct {
	Records, Pending                           int
	QueuedSum, QueuedMax                       int
	MessagesReceived, StatesReceived           uint64
	Accepted, AcceptedFromState, Stale         uint64
	Rejected, PendingDropped, Deliveries, Errs uint64
	RejectedNotMember, Purged                  uint64
	MemberViewsDown                            int // (host, member) pairs not alive
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

func (r *results) env() {
	r.Load = loadavg()
	r.Date = time.Now().UTC().Format(time.RFC3339)
	r.GoVersion = runtime.Version()
	r.OS = runtime.GOOS + "/" + runtime.GOARCH
	r.NumCPU = runtime.NumCPU()
	r.GOMAXPROCS = runtime.GOMAXPROCS(0)
	r.Git = gitDescribe()
	r.Cluster = map[string]clusterAgg{}
}

func (r *results) clusterStats(nodes []*node, label string) {
	var a clusterAgg
	for _, n := range nodes {
		s := n.c.Stats()
		a.Records += s.Records
		a.Pending += s.Pending
		a.QueuedSum += s.BroadcastsQueued
		a.QueuedMax = max(a.QueuedMax, s.BroadcastsQueued)
		a.MessagesReceived += s.MessagesReceived
		a.StatesReceived += s.StatesReceived
		a.Accepted += s.Accepted
		a.AcceptedFromState += s.AcceptedFromState
		a.Stale += s.Stale
		a.Rejected += s.Rejected
		a.PendingDropped += s.PendingDropped
		a.Deliveries += s.Deliveries
		a.Errs += s.SinkErrors
		a.RejectedNotMember += s.RejectedNotMember
		a.Purged += s.Purged
		a.MemberViewsDown += len(nodes) - s.MembersAlive
	}
	r.Cluster[label] = a
}

// quantile is the nearest-rank q-quantile of sorted v.
func quantile(v []time.Duration, q float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	i := int(q*float64(len(v))+0.999999) - 1
	return v[min(max(i, 0), len(v)-1)]
}

func (r *results) convergence(tr *tracker, rollStart int64, waveAt []time.Duration) {
	p := r.Params
	var per, done, pairs []time.Duration
	waves := make([][]time.Duration, p.Waves)
	for g := range p.Endpoints {
		j := tr.joinAt[g].Load()
		for n := range p.Nodes {
			if at := tr.progAt[n*tr.eps+g].Load(); n != g/p.PerNode && at != 0 {
				pairs = append(pairs, time.Duration(at-j))
			}
		}
		d := tr.doneAt[g].Load()
		if d == 0 {
			r.Convergence.Unconverged++
			continue
		}
		per = append(per, time.Duration(d-j))
		done = append(done, time.Duration(d-rollStart))
		w := (g % p.PerNode) / p.Wave
		waves[w] = append(waves[w], time.Duration(d-j))
	}
	slices.Sort(per)
	slices.Sort(done)
	slices.Sort(pairs)
	c := &r.Convergence
	c.P50, c.P90, c.P99, c.Max = quantile(per, .5), quantile(per, .9), quantile(per, .99), quantile(per, 1)
	c.PairP50, c.PairP99, c.PairMax = quantile(pairs, .5), quantile(pairs, .99), quantile(pairs, 1)
	c.All50, c.All90, c.All99, c.All100 = quantile(done, .5), quantile(done, .9), quantile(done, .99), quantile(done, 1)
	for w, v := range waves {
		slices.Sort(v)
		c.Waves = append(c.Waves, waveStat{Wave: w + 1, StartedAt: waveAt[w], Endpoints: len(v), P50: quantile(v, .5), P99: quantile(v, .99), Max: quantile(v, 1)})
	}
}

func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
}

func kib(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	default:
		return fmt.Sprintf("%.0f B", b)
	}
}

func (r *results) markdown() string {
	p := r.Params
	var b strings.Builder
	f := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	dflt := func(d time.Duration, def string) string {
		if d == 0 {
			return def + " (DefaultLANConfig)"
		}
		return d.String()
	}
	f("# Scale simulation: %d hosts × %d endpoints", p.Nodes, p.Endpoints)
	f("")
	if !r.Converged {
		f("**NOT CONVERGED within %v: %d endpoints were not programmed on every other host. The figures below cover the endpoints that were.**", p.Timeout, r.Convergence.Unconverged)
		f("")
	}
	f("In-process: every host is a real cluster.Cluster + driver.Driver on its own fakekernel, gossiping over cluster/memnet. Generated by `go test ./test/scale -run TestScale%s`.", map[bool]string{true: " -scale", false: ""}[p.Full])
	f("")
	f("## Parameters and environment")
	f("")
	f("| | |")
	f("|---|---|")
	f("| date (UTC) | %s |", r.Date)
	f("| Go | %s %s, %d CPUs, GOMAXPROCS %d |", r.GoVersion, r.OS, r.NumCPU, r.GOMAXPROCS)
	f("| machine load (/proc/loadavg, start → end) | %s |", r.Load)
	f("| source | %s |", r.Git)
	f("| hosts | %d (seeds: the first %d) |", p.Nodes, p.Seeds)
	f("| endpoints | %d (%d per host; IPv4 only, one overlay network) |", p.Endpoints, p.PerNode)
	f("| rollout | %d waves of %d endpoints per host (%d per wave), one every %v; hosts in parallel, sequential within a host |", p.Waves, p.Wave, p.Wave*p.Nodes, p.WaveInterval)
	f("| memberlist | DefaultLANConfig; GossipInterval %s, GossipNodes 3, PushPullInterval %s (memberlist scales it ×%d at %d hosts), ProbeInterval %s, ProbeTimeout 500ms, SuspicionMult %d (DefaultLANConfig: 4), RetransmitMult 4, UDPBufferSize 1400, compression %v |",
		dflt(p.GossipInterval, "200ms"), dflt(p.PushPullInterval, "30s"), pushPullScale(p.Nodes), p.Nodes, dflt(p.ProbeInterval, "1s"), p.SuspicionMult, p.Compression)
	f("| gossip encryption | %v |", p.Encrypt)
	f("| cluster | defaults: DeadGrace 30s, TombstoneTTL 10m, RejoinInterval 10s, broadcast queue capped at 8192 |")
	f("| steady-state window | %v |", p.Steady)
	f("| driver | no state DB (Config.DB nil); driver.Resync every %v per host, staggered, as `serve` does (0: none) |", p.Resync)
	f("| \"programmed\" | exact: a kernel.Kernel wrapper timestamps each SetNeighbor when the fake returns (monotonic clock) |")
	f("")
	f("## Results")
	f("")
	f("| | |")
	f("|---|---|")
	f("| membership formed (all %d see %d alive) | %s after the first host started (hosts started in %s) |", p.Nodes, p.Nodes, ms(r.Membership.FormedIn), ms(r.Phases.StartNodes))
	c := r.Convergence
	f("| **convergence per endpoint** (Join → programmed on all %d other hosts) | **p50 %s, p99 %s, max %s** (p90 %s) |", p.Nodes-1, ms(c.P50), ms(c.P99), ms(c.Max), ms(c.P90))
	f("| per (endpoint, host) pair (Join → programmed on that host) | p50 %s, p99 %s, max %s |", ms(c.PairP50), ms(c.PairP99), ms(c.PairMax))
	f("| share of endpoints converged, since the first Join | 50%%: %s, 90%%: %s, 99%%: %s, 100%%: %s (joins issued over %s) |", ms(c.All50), ms(c.All90), ms(c.All99), ms(c.All100), ms(r.Phases.JoinsIssued))
	g := r.Gossip
	f("| gossip per host, rollout (%s, first Join → all converged) | payload out %s/s, in %s/s (busiest host out %s/s); wire out %s/s, in %s/s (busiest %s/s) |",
		ms(g.Rollout.Window), kib(g.Rollout.PayloadOut.Mean), kib(g.Rollout.PayloadIn.Mean), kib(g.Rollout.PayloadOut.Max),
		kib(g.Rollout.WireOut.Mean), kib(g.Rollout.WireIn.Mean), kib(g.Rollout.WireOut.Max))
	f("| gossip per host, steady state (%s after convergence) | payload out %s/s, in %s/s (busiest host out %s/s); wire out %s/s, in %s/s (busiest %s/s) |",
		ms(g.Steady.Window), kib(g.Steady.PayloadOut.Mean), kib(g.Steady.PayloadIn.Mean), kib(g.Steady.PayloadOut.Max),
		kib(g.Steady.WireOut.Mean), kib(g.Steady.WireIn.Mean), kib(g.Steady.WireOut.Max))
	f("| packets dropped by memnet (receiver queue full) | %d during the rollout, %d in steady state |", g.Rollout.PacketsDropped, g.Steady.PacketsDropped)
	m := r.Memory
	f("| heap per host (live, after GC) | %s with membership only; %s after convergence (%s for the endpoints) |", kib(float64(r.Membership.HeapPerNode)), kib(float64(m.HeapPerNode)), kib(float64(m.HeapPerNodeEndpoints)))
	f("| goroutines per host | %.1f with membership; %.1f after convergence |", r.Membership.GoroutinesPerNode, m.GoroutinesPerNode)
	f("| process | peak RSS %s; live heap %s, Sys %s after convergence; %d GCs |", kib(float64(m.PeakRSS)), kib(float64(m.HeapTotal)), kib(float64(m.SysTotal)), m.NumGC)
	f("| CPU (share of %d cores) | rollout %.0f%% (%.2f cores), steady %.0f%%, whole run %.0f%% (%s CPU in %s) |", r.GOMAXPROCS,
		100*r.CPU.Rollout.Share, r.CPU.Rollout.Cores, 100*r.CPU.Steady.Share, 100*r.CPU.Total.Share, ms(r.CPU.Total.CPU), ms(r.CPU.Total.Wall))
	f("| phases | start %s, membership %s, rollout to convergence %s, teardown %s; total %s |", ms(r.Phases.StartNodes), ms(r.Phases.Membership), ms(r.Phases.Convergence), ms(r.Phases.Teardown), ms(r.Phases.Total))
	f("")
	f("### Per wave")
	f("")
	f("| wave | started | endpoints | p50 | p99 | max |")
	f("|---:|---:|---:|---:|---:|---:|")
	for _, w := range c.Waves {
		f("| %d | %s | %d | %s | %s | %s |", w.Wave, ms(w.StartedAt), w.Endpoints, ms(w.P50), ms(w.P99), ms(w.Max))
	}
	f("")
	f("### Gossip table (sums over hosts)")
	f("")
	f("| when | records | pending | queued broadcasts (sum / max host) | gossip msgs in | push/pull states in | accepted (gossip / push-pull) | stale | rejected (owner not a member) | purged | member views not alive | driver deliveries (errors) |")
	f("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, k := range []string{"atConvergence", "afterSteady"} {
		a := r.Cluster[k]
		f("| %s | %d | %d | %d / %d | %d | %d | %d / %d | %d | %d (%d) | %d | %d | %d (%d) |", k, a.Records, a.Pending, a.QueuedSum, a.QueuedMax, a.MessagesReceived, a.StatesReceived,
			a.Accepted, a.AcceptedFromState, a.Stale, a.Rejected, a.RejectedNotMember, a.Purged, a.MemberViewsDown, a.Deliveries, a.Errs)
	}
	f("")
	f("### Fake-kernel calls (all hosts; wrapper-measured, includes the fake's lock)")
	f("")
	f("| op | calls | total | mean |")
	f("|---|---:|---:|---:|")
	for _, k := range r.Kernel {
		if k.Calls == 0 {
			continue
		}
		f("| %s | %d | %s | %.1f µs |", k.Op, k.Calls, ms(k.Total), float64(k.Total)/float64(k.Calls)/1e3)
	}
	f("")
	f("Neighbour entries for unknown IPs: %d, for a host's own endpoints: %d (both must be 0). DeleteNeighbor calls: %d (no endpoint leaves in this scenario: each is a remote endpoint withdrawn and later re-added, e.g. its owner was taken for dead and its records purged; convergence times count the first programming).",
		r.Anomalies.ForeignIP, r.Anomalies.OwnIP, r.Anomalies.DeleteNeighbor)
	f("")
	f("Periodic driver.Resync: %d runs, %d entries added, %d removed, %d errors (the kernel matched the peer db whenever added and removed are 0).",
		r.Resync.Runs, r.Resync.Added, r.Resync.Removed, r.Resync.Errors)
	f("")
	f("### Warnings and errors logged (count × message)")
	f("")
	if len(r.Warnings) == 0 {
		f("none")
	}
	for i, w := range r.Warnings {
		if i == 15 {
			f("- … %d more kinds (see the JSON)", len(r.Warnings)-15)
			break
		}
		f("- %s", w)
	}
	return b.String()
}

// pushPullScale mirrors memberlist's scaling of PushPullInterval.
func pushPullScale(n int) int {
	if n <= 32 {
		return 1
	}
	m := 1
	for x := 32; x < n; x *= 2 {
		m++
	}
	return m
}

// write stores the Markdown at path and the JSON next to it.
func (r *results) write(path, md string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(strings.TrimSuffix(path, filepath.Ext(path))+".json", append(js, '\n'), 0o644)
}
