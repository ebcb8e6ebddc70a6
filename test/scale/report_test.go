package scale

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// results are a run's figures. Durations are nanoseconds in the JSON;
// simulated time unless named wall or CPU.
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
		StartNodes, Membership, JoinsIssued, Convergence, Steady, Teardown, Total span
		WallTotal                                                                 time.Duration // the whole test, bubble included
	} `json:"phases"`
	Membership struct {
		HeapPerNode       uint64  `json:"heapPerNode"`
		GoroutinesPerNode float64 `json:"goroutinesPerNode"`
	} `json:"membership"`
	Convergence struct {
		// Per endpoint: Join → programmed on every other host of its network.
		P50, P90, P99, Max time.Duration
		// Per (endpoint, other host of its network): Join → programmed there.
		PairP50, PairP90, PairP99, PairMax time.Duration
		// Since the first Join, when a share of the endpoints had converged.
		All50, All90, All99, All100 time.Duration
		Waves                       []waveStat
		Unconverged                 int // endpoints not programmed everywhere in time
		// Curve is (seconds since the first Join, share of all endpoints
		// converged), for the plot.
		Curve [][2]float64
	} `json:"convergence"`
	Gossip struct {
		Rollout, Steady trafficRates
	} `json:"gossip"`
	Memory struct {
		HeapPerNode          uint64 `json:"heapPerNode"`          // live heap per host after convergence, incl. membership
		HeapPerNodeEndpoints uint64 `json:"heapPerNodeEndpoints"` // of which networks and endpoints
		HeapPer10kRemote     uint64 `json:"heapPer10kRemote"`     // that, per 10,000 remote endpoints the host programs
		// Of HeapPerNodeEndpoints, the fake kernel's neighbour and FDB
		// entries (a real kernel holds them, not the plugin's heap), and
		// the rest, the plugin's own, per 10,000 remote endpoints.
		FakeKernelPerNode   uint64  `json:"fakeKernelPerNode"`
		PluginPer10kRemote  uint64  `json:"pluginPer10kRemote"`
		GoroutinesPerNode   float64 `json:"goroutinesPerNode"`
		HeapTotal, SysTotal uint64
		NumGC               uint32
		PeakRSS             uint64 `json:"peakRSS"`
	} `json:"memory"`
	// Records held per host (cluster.Stats().Records) against what the
	// scenario implies: the endpoints of the host's networks, or all.
	Records struct {
		Min, Max        int
		Mean            float64
		InNetworks      float64 // mean per host: endpoints of its networks, own included
		All             int
		RemoteEndpoints float64 // mean per host: endpoints it must program
	} `json:"records"`
	Cluster   map[string]clusterAgg `json:"cluster"`
	Transport struct {
		PacketsDropped uint64 `json:"packetsDropped"`
	} `json:"transport"`
	Kernel    []kernelCost `json:"kernel"`
	Anomalies struct {
		ForeignIP, OwnIP, WrongNetwork, DeleteNeighbor int64
	} `json:"anomalies"`
	Resync struct {
		Runs, Added, Removed, Errors int64
	} `json:"resync"`
	Liveness liveness `json:"liveness"`
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

type kernelCost struct {
	Op    string
	Calls int64
	Total time.Duration
}

// clusterAgg sums the cluster.Stats counters that any version of the
// protocol has.
type clusterAgg struct {
	Records, Pending                 int
	QueuedSum, QueuedMax             int
	MessagesReceived, StatesReceived uint64
	Deliveries, Errs                 uint64
	MemberViewsDown                  int // (host, member) pairs not alive
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
		a.Deliveries += s.Deliveries
		a.Errs += s.SinkErrors
		a.MemberViewsDown += len(nodes) - s.MembersAlive
	}
	r.Cluster[label] = a
}

func (r *results) records(nodes []*node, l *layout) {
	rc := &r.Records
	rc.Min, rc.All = int(^uint(0)>>1), len(l.owner)
	for _, n := range nodes {
		rec := n.c.Stats().Records
		rc.Min, rc.Max = min(rc.Min, rec), max(rc.Max, rec)
		rc.Mean += float64(rec)
		rc.RemoteEndpoints += float64(l.remote(n.i))
	}
	rc.Mean /= float64(len(nodes))
	rc.RemoteEndpoints /= float64(len(nodes))
	rc.InNetworks = float64(l.perHost * l.perNet)
}

// quantile is the nearest-rank q-quantile of sorted v.
func quantile(v []time.Duration, q float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	i := int(q*float64(len(v))+0.999999) - 1
	return v[min(max(i, 0), len(v)-1)]
}

// convergence computes the figures of the measured endpoints, in their
// rollout order.
func (r *results) convergence(tr *tracker, measured []int32, rollStart int64, waveAt []time.Duration) {
	p, l := r.Params, tr.l
	var per, done, pairs []time.Duration
	waves := make([][]time.Duration, p.Waves)
	for i, g := range measured {
		j := tr.joinAt[g].Load()
		for _, h := range l.netHosts[l.netOf(int(g))] {
			if h == int(l.owner[g]) {
				continue
			}
			if at := tr.progAt[l.slot(h, int(g))].Load(); at != 0 {
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
		waves[i/p.WaveSize] = append(waves[i/p.WaveSize], time.Duration(d-j))
	}
	slices.Sort(per)
	slices.Sort(done)
	slices.Sort(pairs)
	c := &r.Convergence
	c.P50, c.P90, c.P99, c.Max = quantile(per, .5), quantile(per, .9), quantile(per, .99), quantile(per, 1)
	c.PairP50, c.PairP90, c.PairP99, c.PairMax = quantile(pairs, .5), quantile(pairs, .9), quantile(pairs, .99), quantile(pairs, 1)
	c.All50, c.All90, c.All99, c.All100 = quantile(done, .5), quantile(done, .9), quantile(done, .99), quantile(done, 1)
	for w, v := range waves {
		slices.Sort(v)
		c.Waves = append(c.Waves, waveStat{Wave: w + 1, StartedAt: waveAt[w], Endpoints: len(v), P50: quantile(v, .5), P99: quantile(v, .99), Max: quantile(v, 1)})
	}
	const points = 200
	c.Curve = [][2]float64{{0, 0}}
	for i := range min(points, len(done)) {
		k := (i+1)*len(done)/min(points, len(done)) - 1
		c.Curve = append(c.Curve, [2]float64{done[k].Seconds(), float64(k+1) / float64(len(measured))})
	}
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
