// Package scale is an in-process scale simulation of the plugin: many
// hosts, each a real cluster.Cluster (gossip control plane on memberlist)
// feeding a real driver.Driver that programs its own fake kernel, connected
// by the in-memory transport cluster/memnet. One overlay network is created
// on every host, then endpoints are joined through the driver's Join in
// waves, like a service rollout, and the run measures:
//
//   - how long membership takes to form;
//   - per endpoint, the time from its Join until its neighbour entry is in
//     the sandbox of EVERY other host (exact: a thin kernel wrapper
//     timestamps each SetNeighbor as the fake returns, no polling);
//   - gossip bytes per host per second, during the rollout and in steady
//     state afterwards, as the cluster's payload (cluster.Stats) and as
//     wire bytes (memnet, memberlist's own protocol and compression
//     included);
//   - heap and goroutines per host, CPU use, the cost of kernel calls.
//
// It asserts correctness only (every host ends with exactly the remote
// endpoints programmed, with the right MAC and VTEP, and the gossip table
// holds every record), never speed. Figures go to a Markdown file and a
// JSON file next to it.
//
// memberlist runs with DefaultLANConfig, what the plugin uses, except
// SuspicionMult (see -scale.suspicion-mult): 100 hosts share the test's
// CPUs, and a host that is merely not scheduled must not be declared dead.
//
// Under plain `go test ./...` it runs a small configuration (10 hosts × 20
// endpoints each, about 10 s). The full run, 100 hosts × 100 endpoints each
// (10,000), takes about 6 minutes and 4.7 GB of memory on two cores:
//
//	go test ./test/scale -run '^TestScale$' -scale -v -timeout 40m
//
// (or `make bench-scale`), which writes build/scale-results.md and .json.
// The -scale.* flags change the parameters.
package scale

import (
	"bufio"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/cluster/memnet"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
)

var (
	flagFull = flag.Bool("scale", false, "run the full scale simulation (100 hosts × 100 endpoints each; about 6 minutes, 5 GB) instead of the small one")

	flagNodes     = flag.Int("scale.nodes", 0, "hosts (default 100 with -scale, else 10)")
	flagPerNode   = flag.Int("scale.per-node", 0, "endpoints per host (default 100 with -scale, else 20)")
	flagWave      = flag.Int("scale.wave", 10, "endpoints each host joins per wave")
	flagWaveEvery = flag.Duration("scale.wave-interval", 0, "time between wave starts (default 2s with -scale, else 500ms)")
	flagSteady    = flag.Duration("scale.steady", 0, "steady-state window measured after convergence (default 10s with -scale, else 1s)")
	flagSeeds     = flag.Int("scale.seeds", 3, "hosts every host is given as gossip seeds")
	flagGossip    = flag.Duration("scale.gossip-interval", 0, "memberlist GossipInterval (0: DefaultLANConfig's 200ms)")
	flagPushPull  = flag.Duration("scale.pushpull-interval", 0, "memberlist PushPullInterval (0: DefaultLANConfig's 30s, which memberlist scales up with the host count)")
	flagProbe     = flag.Duration("scale.probe-interval", 0, "memberlist ProbeInterval (0: DefaultLANConfig's 1s)")
	flagSuspicion = flag.Int("scale.suspicion-mult", 20, "memberlist SuspicionMult (DefaultLANConfig: 4). Raised so that the simulation process being short of CPU (100 hosts on a few cores) is not taken for hosts failing; no host fails in this scenario")
	flagResync    = flag.Duration("scale.resync", 30*time.Second, "period of every host's driver.Resync, as the plugin's serve runs it (0: none)")
	flagCompress  = flag.Bool("scale.compression", true, "memberlist EnableCompression (DefaultLANConfig: true)")
	flagEncrypt   = flag.Bool("scale.encrypt", false, "encrypt gossip (AES-256-GCM shared key)")
	flagProfile   = flag.String("scale.cpuprofile", "", "write a CPU profile of the rollout (first Join until convergence) to this file")
	flagMemProf   = flag.String("scale.memprofile", "", "write a heap profile taken after the steady-state window to this file")
	flagTimeout   = flag.Duration("scale.timeout", 15*time.Minute, "give up (and fail) if membership or convergence is not reached within this")
	flagOut       = flag.String("scale.out", "", "results file (Markdown; JSON is written next to it). Default: build/scale-results.md with -scale, none otherwise")
)

// params are one run's parameters.
type params struct {
	Full             bool          `json:"full"`
	Nodes            int           `json:"nodes"`
	PerNode          int           `json:"endpointsPerNode"`
	Endpoints        int           `json:"endpoints"`
	Wave             int           `json:"endpointsPerNodePerWave"`
	Waves            int           `json:"waves"`
	WaveInterval     time.Duration `json:"waveIntervalNs"`
	Steady           time.Duration `json:"steadyWindowNs"`
	Seeds            int           `json:"seeds"`
	GossipInterval   time.Duration `json:"gossipIntervalNs"`
	PushPullInterval time.Duration `json:"pushPullIntervalNs"`
	ProbeInterval    time.Duration `json:"probeIntervalNs"`
	SuspicionMult    int           `json:"suspicionMult"`
	Compression      bool          `json:"compression"`
	Resync           time.Duration `json:"resyncNs"`
	Encrypt          bool          `json:"encrypt"`
	Timeout          time.Duration `json:"-"`
	Out              string        `json:"-"`
}

func paramsFromFlags() params {
	pick := func(set, full, small int) int {
		if set > 0 {
			return set
		}
		if *flagFull {
			return full
		}
		return small
	}
	pickD := func(set, full, small time.Duration) time.Duration {
		if set > 0 {
			return set
		}
		if *flagFull {
			return full
		}
		return small
	}
	p := params{
		Full:             *flagFull,
		Nodes:            pick(*flagNodes, 100, 10),
		PerNode:          pick(*flagPerNode, 100, 20),
		Wave:             max(*flagWave, 1),
		WaveInterval:     pickD(*flagWaveEvery, 2*time.Second, 500*time.Millisecond),
		Steady:           pickD(*flagSteady, 10*time.Second, time.Second),
		Seeds:            max(*flagSeeds, 1),
		GossipInterval:   *flagGossip,
		PushPullInterval: *flagPushPull,
		ProbeInterval:    *flagProbe,
		SuspicionMult:    *flagSuspicion,
		Compression:      *flagCompress,
		Resync:           *flagResync,
		Encrypt:          *flagEncrypt,
		Timeout:          *flagTimeout,
		Out:              *flagOut,
	}
	p.Seeds = min(p.Seeds, p.Nodes)
	p.Endpoints = p.Nodes * p.PerNode
	p.Waves = (p.PerNode + p.Wave - 1) / p.Wave
	if p.Out == "" && p.Full {
		p.Out = filepath.Join("..", "..", "build", "scale-results.md")
	}
	return p
}

func TestScale(t *testing.T) {
	p := paramsFromFlags()
	if !p.Full {
		t.Logf("scale simulation: small configuration (%d hosts × %d endpoints each); the full run (100 × 100, about 6 minutes and 5 GB) is opt-in: go test ./test/scale -run '^TestScale$' -scale -v -timeout 40m", p.Nodes, p.PerNode)
	}
	if p.Nodes < 2 || p.Endpoints > 1<<24-2 {
		t.Fatalf("need at least 2 hosts and at most %d endpoints", 1<<24-2)
	}
	res := run(t, p)
	md := res.markdown()
	t.Log("\n" + md)
	if p.Out != "" {
		if err := res.write(p.Out, md); err != nil {
			t.Fatal(err)
		}
		abs, _ := filepath.Abs(p.Out)
		t.Logf("results written to %s (and .json)", abs)
	}
}

// run is the simulation; it returns the figures, having failed t on any
// correctness problem.
func run(t *testing.T, p params) *results {
	res := &results{Params: p}
	res.env()
	wall0 := time.Now()
	cpu0 := cpuTime()

	tr := newTracker(p.Nodes, p.PerNode)
	cost := &opCost{}
	warns := newWarnCounter()
	log := slog.New(warns)
	mem0 := heapNow()
	gor0 := runtime.NumGoroutine()

	// Hosts. Every host is given the first p.Seeds hosts as seeds (a
	// fixed seed list, as an operator would configure); they are started
	// one after the other, as fast as New returns.
	net := memnet.New()
	dir := t.TempDir()
	var seeds []string
	for i := range p.Seeds {
		seeds = append(seeds, nodeIP(i).String())
	}
	nodes := make([]*node, p.Nodes)
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, n := range nodes {
			if n != nil {
				wg.Go(n.close)
			}
		}
		wg.Wait()
	})
	start := time.Now()
	for i := range p.Nodes {
		var own []string
		for _, s := range seeds {
			if s != nodeIP(i).String() {
				own = append(own, s)
			}
		}
		n, err := startNode(dir, net, p, tr, cost, log, i, own)
		nodes[i] = n
		if err != nil {
			t.Fatalf("start host %d: %v", i, err)
		}
	}
	res.Phases.StartNodes = time.Since(start)
	resync := &resyncCounts{}
	if p.Resync > 0 {
		for _, n := range nodes {
			n.resyncLoop(p.Resync*time.Duration(n.i+1)/time.Duration(p.Nodes), p.Resync, resync)
		}
	}

	// Membership: every host sees every host alive.
	if !waitFor(p.Timeout, 20*time.Millisecond, func() bool {
		for _, n := range nodes {
			if n.c.Stats().MembersAlive != p.Nodes {
				return false
			}
		}
		return true
	}) {
		var short []string
		for _, n := range nodes {
			if a := n.c.Stats().MembersAlive; a != p.Nodes {
				short = append(short, fmt.Sprintf("%s:%d", nodeName(n.i), a))
			}
		}
		t.Fatalf("membership not formed within %v; alive counts: %v", p.Timeout, short)
	}
	res.Membership.FormedIn = time.Since(start)
	res.Phases.Membership = res.Membership.FormedIn
	t.Logf("membership of %d hosts formed in %v", p.Nodes, res.Membership.FormedIn.Round(time.Millisecond))
	memM := heapNow()
	res.Membership.HeapPerNode = perNode(memM.heap-mem0.heap, p.Nodes)
	res.Membership.GoroutinesPerNode = float64(runtime.NumGoroutine()-gor0) / float64(p.Nodes)

	// The network: allocated on one host (the swarm leader), created on all.
	nid := hexID("network", 0)
	alloc, err := nodes[0].d.AllocateNetwork(&api.AllocateNetworkRequest{
		NetworkID: nid, Options: map[string]string{},
		IPv4Data: []api.IPAMData{{Pool: poolCIDR, Gateway: gatewayCIDR}},
	})
	if err != nil {
		t.Fatal(err)
	}
	generic := map[string]any{}
	for k, v := range alloc.Options {
		generic[k] = v
	}
	for _, n := range nodes {
		if err := n.d.CreateNetwork(&api.CreateNetworkRequest{
			NetworkID: nid, Options: map[string]any{genericOptionsKey: generic},
			IPv4Data: []*api.IPAMData{{Pool: poolCIDR, Gateway: gatewayCIDR}},
		}); err != nil {
			t.Fatalf("create network on %s: %v", nodeName(n.i), err)
		}
	}

	// Rollout: wave w joins endpoints [w*Wave, (w+1)*Wave) of every host,
	// all hosts in parallel; waves start every WaveInterval (or as soon as
	// the previous one's joins returned, if that took longer).
	trafficStart := snapTraffic(nodes)
	stopProfile := func() {}
	if *flagProfile != "" {
		f, err := os.Create(*flagProfile)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		stopProfile = sync.OnceFunc(func() { pprof.StopCPUProfile(); f.Close() })
		defer stopProfile()
	}
	cpuRoll := cpuTime()
	rollStart := time.Now()
	rollStartNs := tr.now()
	waveAt := make([]time.Duration, p.Waves)
	var joinErrs sync.Map
	for w := range p.Waves {
		if d := time.Until(rollStart.Add(time.Duration(w) * p.WaveInterval)); d > 0 {
			time.Sleep(d)
		}
		waveAt[w] = time.Since(rollStart)
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Go(func() {
				for j := w * p.Wave; j < min((w+1)*p.Wave, p.PerNode); j++ {
					g := n.i*p.PerNode + j
					if err := joinEndpoint(n.d, tr, nid, g); err != nil {
						joinErrs.Store(g, err)
					}
				}
			})
		}
		wg.Wait()
	}
	res.Phases.JoinsIssued = time.Since(rollStart)
	joinErrs.Range(func(k, v any) bool {
		t.Errorf("endpoint %d: %v", k, v)
		return true
	})
	if t.Failed() {
		t.FailNow()
	}

	// Convergence: every endpoint programmed on every other host.
	lastLog, lastCPU := time.Now(), cpuTime()
	ok := waitFor(p.Timeout, 10*time.Millisecond, func() bool {
		if time.Since(lastLog) >= 5*time.Second {
			now, cpu := time.Now(), cpuTime()
			done := tr.complete.Load()
			busy := float64(cpu-lastCPU) / float64(now.Sub(lastLog))
			t.Logf("t+%v: %d/%d endpoints programmed everywhere; %.2f cores busy; %s", now.Sub(rollStart).Round(time.Second),
				done, p.Endpoints, busy, health(nodes, p.Nodes))
			lastLog, lastCPU = now, cpu
		}
		return tr.complete.Load() == int64(p.Endpoints)
	})
	convergedAt := time.Now()
	stopProfile()
	trafficConv := snapTraffic(nodes)
	cpuConv := cpuTime()
	res.Converged = ok
	if !ok {
		// Report what was reached, then fail.
		t.Errorf("not converged within %v: %d/%d endpoints programmed everywhere; %s",
			p.Timeout, tr.complete.Load(), p.Endpoints, lagging(nodes, tr, p))
	}
	res.Phases.Convergence = convergedAt.Sub(rollStart)
	res.convergence(tr, rollStartNs, waveAt)
	res.Gossip.Rollout = rates(trafficStart, trafficConv, p.Nodes)
	res.CPU.Rollout = cpuUse(cpuConv-cpuRoll, convergedAt.Sub(rollStart))
	res.clusterStats(nodes, "atConvergence")
	t.Logf("%d endpoints converged on %d hosts: p50 %v p99 %v max %v", p.Endpoints, p.Nodes,
		res.Convergence.P50, res.Convergence.P99, res.Convergence.Max)

	// Steady state: nothing changes; what is left is queued retransmissions,
	// push/pull anti-entropy and memberlist's probes.
	if ok {
		time.Sleep(p.Steady)
	}
	trafficSteady := snapTraffic(nodes)
	res.Gossip.Steady = rates(trafficConv, trafficSteady, p.Nodes)
	res.CPU.Steady = cpuUse(cpuTime()-cpuConv, trafficSteady.at.Sub(trafficConv.at))
	res.clusterStats(nodes, "afterSteady")
	res.Transport.PacketsDropped = trafficSteady.dropped

	// Correctness: exactly the remote endpoints, right MAC and VTEP.
	if ok {
		verify(t, nodes, nid, p)
	}
	res.Anomalies.ForeignIP, res.Anomalies.OwnIP, res.Anomalies.DeleteNeighbor = tr.foreignIP.Load(), tr.ownIP.Load(), tr.deletes.Load()

	memC := heapNow()
	if *flagMemProf != "" {
		runtime.GC() // the profile shows the heap as of the last but one collection
		if f, err := os.Create(*flagMemProf); err != nil {
			t.Error(err)
		} else {
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				t.Error(err)
			}
			f.Close()
		}
	}
	res.Memory.HeapPerNode = perNode(memC.heap-mem0.heap, p.Nodes)
	res.Memory.HeapPerNodeEndpoints = perNode(memC.heap-memM.heap, p.Nodes)
	res.Memory.GoroutinesPerNode = float64(runtime.NumGoroutine()-gor0) / float64(p.Nodes)
	res.Memory.HeapTotal = memC.heap
	res.Memory.SysTotal = memC.sys
	res.Memory.NumGC = memC.numGC
	for op := range numOps {
		res.Kernel = append(res.Kernel, kernelCost{Op: opNames[op], Calls: cost.calls[op].Load(), Total: time.Duration(cost.ns[op].Load())})
	}
	res.Warnings = warns.sorted()
	res.Resync.Runs, res.Resync.Added, res.Resync.Removed, res.Resync.Errors = resync.runs.Load(), resync.added.Load(), resync.removed.Load(), resync.errs.Load()

	// Teardown (graceful leave of every host), timed.
	td := time.Now()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(n.close)
	}
	wg.Wait()
	res.Phases.Teardown = time.Since(td)
	res.Phases.Total = time.Since(wall0)
	res.CPU.Total = cpuUse(cpuTime()-cpu0, res.Phases.Total)
	res.Memory.PeakRSS = peakRSS()
	res.Load += " → " + loadavg()
	return res
}

// joinEndpoint does what dockerd does for a task: CreateEndpoint with the
// address IPAM chose (and its MAC), then Join, which publishes it.
func joinEndpoint(d *driver.Driver, tr *tracker, nid string, g int) error {
	eid := hexID("endpoint", g)
	if _, err := d.CreateEndpoint(&api.CreateEndpointRequest{NetworkID: nid, EndpointID: eid, Interface: &api.EndpointInterface{
		Address: epIP(g).String() + "/8", MacAddress: epMAC(g).String(),
	}}); err != nil {
		return fmt.Errorf("create endpoint: %w", err)
	}
	tr.joinAt[g].Store(tr.now())
	if _, err := d.Join(&api.JoinRequest{NetworkID: nid, EndpointID: eid, SandboxKey: "/var/run/docker/netns/" + eid[:12]}); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	return nil
}

// verify checks every host's sandbox: exactly the other hosts' endpoints as
// neighbours with their MACs, and one FDB entry per endpoint to its host.
func verify(t *testing.T, nodes []*node, nid string, p params) {
	t.Helper()
	bad := 0
	for _, n := range nodes {
		sb := n.fake.Snapshot()[nid]
		if sb == nil {
			t.Errorf("%s: no sandbox", nodeName(n.i))
			bad++
			continue
		}
		var errs []string
		want := p.Endpoints - p.PerNode
		fdbList, err := n.k.FDB(nid)
		if err != nil {
			t.Errorf("%s: FDB: %v", nodeName(n.i), err)
		}
		fdb := map[hwaddr.MAC]netip.Addr{}
		for _, e := range fdbList {
			fdb[e.MAC] = e.VTEP
		}
		if len(sb.Neighbors) != want {
			errs = append(errs, fmt.Sprintf("%d neighbour entries, want %d", len(sb.Neighbors), want))
		}
		if len(fdbList) != want {
			errs = append(errs, fmt.Sprintf("%d FDB entries, want %d", len(fdbList), want))
		}
		if len(sb.Veths) != p.PerNode {
			errs = append(errs, fmt.Sprintf("%d veths, want %d", len(sb.Veths), p.PerNode))
		}
		for g := range p.Endpoints {
			owner := g / p.PerNode
			mac, ok := sb.Neighbors[epIP(g)]
			switch {
			case owner == n.i && ok:
				errs = append(errs, fmt.Sprintf("own endpoint %d has a neighbour entry", g))
			case owner != n.i && !ok:
				errs = append(errs, fmt.Sprintf("endpoint %d (of %s) missing", g, nodeName(owner)))
			case owner != n.i && mac != epMAC(g):
				errs = append(errs, fmt.Sprintf("endpoint %d has MAC %s, want %s", g, mac, epMAC(g)))
			case owner != n.i && fdb[epMAC(g)] != nodeIP(owner):
				errs = append(errs, fmt.Sprintf("endpoint %d: FDB entry to %v, want %v", g, fdb[epMAC(g)], nodeIP(owner)))
			}
			if len(errs) > 5 {
				break
			}
		}
		if st := n.c.Stats(); st.Records != p.Endpoints || st.OwnRecords != p.PerNode {
			errs = append(errs, fmt.Sprintf("gossip table holds %d records (%d own), want %d (%d)", st.Records, st.OwnRecords, p.Endpoints, p.PerNode))
		}
		if len(errs) > 0 {
			bad++
			if bad <= 5 {
				t.Errorf("%s: %s", nodeName(n.i), strings.Join(errs, "; "))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d hosts do not hold exactly the %d remote endpoints", bad, len(nodes), p.Endpoints-p.PerNode)
	}
}

// lagging describes the hosts that miss endpoints, for a timeout.
func lagging(nodes []*node, tr *tracker, p params) string {
	var out []string
	for _, n := range nodes {
		missing := 0
		for g := range p.Endpoints {
			if g/p.PerNode != n.i && tr.progAt[n.i*tr.eps+g].Load() == 0 {
				missing++
			}
		}
		if missing > 0 {
			st := n.c.Stats()
			out = append(out, fmt.Sprintf("%s misses %d (table %d records, %d pending, %d queued)", nodeName(n.i), missing, st.Records, st.Pending, st.BroadcastsQueued))
		}
	}
	if len(out) > 10 {
		out = append(out[:10], fmt.Sprintf("… %d more hosts", len(out)-10))
	}
	return strings.Join(out, "; ")
}

// health summarises the membership views: how many (host, member) pairs
// are not alive, and the pending records and queued broadcasts.
func health(nodes []*node, want int) string {
	var down, pending, queued, maxQ int
	for _, n := range nodes {
		st := n.c.Stats()
		down += want - st.MembersAlive
		pending += st.Pending
		queued += st.BroadcastsQueued
		maxQ = max(maxQ, st.BroadcastsQueued)
	}
	return fmt.Sprintf("%d member views not alive, %d records pending, %d broadcasts queued (max %d)", down, pending, queued, maxQ)
}

func waitFor(timeout, every time.Duration, f func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !f() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(every)
	}
	return true
}

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

// cpuUse is CPU time as a share of what GOMAXPROCS cores could give.
func cpuUse(cpu, wall time.Duration) cpuShare {
	return cpuShare{CPU: cpu, Wall: wall, Cores: float64(cpu) / float64(wall), Share: float64(cpu) / float64(wall) / float64(runtime.GOMAXPROCS(0))}
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
