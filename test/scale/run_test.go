package scale

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"testing"
	"time"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/cluster/memnet"
	"github.com/overlay-plugin/overlay-plugin/driver"

	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// run is the simulation; it fills res, having failed t on any correctness
// problem. Everything it starts is stopped before it returns, as the
// synctest bubble requires.
func run(t *testing.T, p params, res *results) {
	l := newLayout(p.Nodes, p.Networks, p.NetsPerHost, p.Endpoints)
	tr := newTracker(l)
	cost := &opCost{}
	logs := newLogCounter()
	log := slog.New(logs)
	mem0 := heapNow()
	gor0 := runtime.NumGoroutine()
	total := startWatch()

	// Hosts. Every host is given the first p.Seeds hosts as seeds (a
	// fixed seed list, as an operator would configure); they are started
	// one after the other, as fast as New returns.
	net := memnet.New()
	net.SetLatency(p.Latency)
	dir := t.TempDir()
	var seeds []string
	for i := range p.Seeds {
		seeds = append(seeds, nodeIP(i).String())
	}
	nodes := make([]*node, p.Nodes)
	t.Cleanup(func() { closeAll(nodes) })
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
	res.Phases.StartNodes = total.span()
	resync := &resyncCounts{}
	if p.Resync > 0 {
		for _, n := range nodes {
			n.resyncLoop(p.Resync*time.Duration(n.i+1)/time.Duration(p.Nodes), p.Resync, resync)
		}
	}

	// Membership: every host sees every host alive.
	if wait.Until(p.Timeout, 20*time.Millisecond, wait.Bool(func() bool {
		for _, n := range nodes {
			if n.c.Stats().MembersAlive != p.Nodes {
				return false
			}
		}
		return true
	})) != nil {
		t.Fatalf("membership not formed within %v: %s", p.Timeout, health(nodes, p.Nodes))
	}
	res.Phases.Membership = total.span()
	t.Logf("membership of %d hosts formed in %v (%v real)", p.Nodes, res.Phases.Membership.Sim.Round(time.Millisecond), res.Phases.Membership.Wall.Round(time.Millisecond))
	memM := heapNow()
	res.Membership.HeapPerNode = perNode(memM.heap-mem0.heap, p.Nodes)
	res.Membership.GoroutinesPerNode = float64(runtime.NumGoroutine()-gor0) / float64(p.Nodes)

	createNetworks(t, nodes, l)
	if p.Warm > 0 {
		joinWave(t, nodes, tr, l.order[:p.Warm])
		if wait.Until(p.Timeout, 10*time.Millisecond, wait.Bool(func() bool { return tr.complete.Load() == int64(p.Warm) })) != nil {
			t.Fatalf("the %d warm endpoints did not converge within %v", p.Warm, p.Timeout)
		}
		tr.complete.Store(0)
	}

	// Rollout: wave w joins the next WaveSize endpoints of the order, hosts
	// in parallel, each host's sequentially; waves start every WaveInterval
	// (or as soon as the previous one's joins returned, if later).
	measured := l.order[p.Warm:]
	trafficStart := snapTraffic(nodes)
	stopProfile := startProfile(t)
	defer stopProfile()
	roll := startWatch()
	rollStartNs := tr.now()
	waveAt := make([]time.Duration, p.Waves)
	for w := range p.Waves {
		if d := time.Until(roll.at.Add(time.Duration(w) * p.WaveInterval)); d > 0 {
			time.Sleep(d)
		}
		waveAt[w] = time.Since(roll.at)
		joinWave(t, nodes, tr, measured[w*p.WaveSize:min((w+1)*p.WaveSize, len(measured))])
	}
	res.Phases.JoinsIssued = roll.span()

	// Convergence: every endpoint programmed on every host of its network.
	lastLog := startWatch()
	ok := wait.Until(p.Timeout, 10*time.Millisecond, wait.Bool(func() bool {
		if time.Since(lastLog.at) >= 5*time.Second {
			s := lastLog.span()
			t.Logf("t+%v (%v real): %d/%d endpoints programmed everywhere; %.2f cores per simulated second; %s", time.Since(roll.at).Round(time.Second),
				(wallNow() - roll.wall).Round(time.Second), tr.complete.Load(), len(measured), s.CoresSimulated, health(nodes, p.Nodes))
			lastLog = startWatch()
		}
		return tr.complete.Load() == int64(len(measured))
	})) == nil
	res.Phases.Convergence = roll.span()
	stopProfile()
	trafficConv := snapTraffic(nodes)
	res.Converged = ok
	if !ok {
		t.Errorf("not converged within %v: %d/%d endpoints programmed everywhere; %s",
			p.Timeout, tr.complete.Load(), len(measured), lagging(nodes, tr))
	}
	res.convergence(tr, measured, rollStartNs, waveAt)
	res.Gossip.Rollout = rates(trafficStart, trafficConv, p.Nodes)
	res.clusterStats(nodes, "atConvergence")
	t.Logf("%d endpoints converged: p50 %v p99 %v max %v", len(measured), res.Convergence.P50, res.Convergence.P99, res.Convergence.Max)

	// Steady state: nothing changes; what is left is queued retransmissions,
	// push/pull anti-entropy and memberlist's probes.
	steady := startWatch()
	if ok {
		time.Sleep(p.Steady)
	}
	trafficSteady := snapTraffic(nodes)
	res.Phases.Steady = steady.span()
	res.Gossip.Steady = rates(trafficConv, trafficSteady, p.Nodes)
	res.clusterStats(nodes, "afterSteady")
	res.records(nodes, l)
	res.Transport.PacketsDropped = trafficSteady.dropped

	if ok {
		verify(t, nodes, l)
	}
	res.Anomalies.ForeignIP, res.Anomalies.OwnIP = tr.foreignIP.Load(), tr.ownIP.Load()
	res.Anomalies.WrongNetwork, res.Anomalies.DeleteNeighbor = tr.wrongNet.Load(), tr.deletes.Load()

	memC := heapNow()
	writeHeapProfile(t)
	m := &res.Memory
	m.HeapPerNode = perNode(memC.heap-mem0.heap, p.Nodes)
	m.HeapPerNodeEndpoints = perNode(memC.heap-memM.heap, p.Nodes)
	if remote := res.Records.RemoteEndpoints; remote > 0 {
		m.HeapPer10kRemote = uint64(float64(m.HeapPerNodeEndpoints) / remote * 1e4)
	}
	m.GoroutinesPerNode = float64(runtime.NumGoroutine()-gor0) / float64(p.Nodes)
	m.HeapTotal, m.SysTotal, m.NumGC = memC.heap, memC.sys, memC.numGC
	for op := range numOps {
		res.Kernel = append(res.Kernel, kernelCost{Op: opNames[op], Calls: cost.calls[op].Load(), Total: time.Duration(cost.ns[op].Load())})
	}
	res.Liveness, res.Warnings = logs.snapshot()
	res.Resync.Runs, res.Resync.Added, res.Resync.Removed, res.Resync.Errors = resync.runs.Load(), resync.added.Load(), resync.removed.Load(), resync.errs.Load()

	// The fake kernels' neighbour and FDB entries are on this heap, though
	// a real kernel holds them outside the plugin's: they are dropped (no
	// resync may put them back) and the heap measured again.
	for _, n := range nodes {
		n.stopResync()
		n.fake.ReleaseEntries()
	}
	m.FakeKernelPerNode = perNode(memC.heap-heapNow().heap, p.Nodes)
	if remote := res.Records.RemoteEndpoints; remote > 0 {
		m.PluginPer10kRemote = uint64(float64(m.HeapPerNodeEndpoints-min(m.FakeKernelPerNode, m.HeapPerNodeEndpoints)) / remote * 1e4)
	}

	// Teardown (graceful leave of every host), timed.
	td := startWatch()
	closeAll(nodes)
	res.Phases.Teardown = td.span()
	res.Phases.Total = total.span()
}

// createNetworks allocates every network on host 0 (the swarm leader) and
// creates it on its hosts only, as Docker does.
func createNetworks(t *testing.T, nodes []*node, l *layout) {
	for n := range l.nets {
		nid := netID(n)
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
		for _, h := range l.netHosts[n] {
			if err := nodes[h].d.CreateNetwork(&api.CreateNetworkRequest{
				NetworkID: nid, Options: map[string]any{genericOptionsKey: generic},
				IPv4Data: []*api.IPAMData{{Pool: poolCIDR, Gateway: gatewayCIDR}},
			}); err != nil {
				t.Fatalf("create network %d on %s: %v", n, nodeName(h), err)
			}
		}
	}
}

// joinWave joins eps, hosts in parallel, each host's in order.
func joinWave(t *testing.T, nodes []*node, tr *tracker, eps []int32) {
	byHost := make([][]int32, len(nodes))
	for _, g := range eps {
		byHost[tr.l.owner[g]] = append(byHost[tr.l.owner[g]], g)
	}
	var wg sync.WaitGroup
	var errs sync.Map
	for h, eps := range byHost {
		if len(eps) > 0 {
			wg.Go(func() {
				for _, g := range eps {
					if err := joinEndpoint(nodes[h].d, tr, netID(tr.l.netOf(int(g))), int(g)); err != nil {
						errs.Store(g, err)
					}
				}
			})
		}
	}
	wg.Wait()
	errs.Range(func(k, v any) bool {
		t.Errorf("endpoint %d: %v", k, v)
		return true
	})
	if t.Failed() {
		t.FailNow()
	}
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

// closeAll stops the hosts in parallel (each a graceful leave).
func closeAll(nodes []*node) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n != nil {
			wg.Go(n.close)
		}
	}
	wg.Wait()
}

// startProfile starts the CPU profile of the rollout if asked for; the
// returned stop may be called more than once.
func startProfile(t *testing.T) func() {
	if *flagProfile == "" {
		return func() {}
	}
	f, err := os.Create(*flagProfile)
	if err != nil {
		t.Fatal(err)
	}
	outsideBubble(func() { err = pprof.StartCPUProfile(f) })
	if err != nil {
		t.Fatal(err)
	}
	return sync.OnceFunc(func() { outsideBubble(pprof.StopCPUProfile); f.Close() })
}

// Channels made outside any bubble, for outsideBubble.
var (
	outsideCalls = make(chan func())
	outsideDone  = make(chan struct{})
)

func init() {
	go func() {
		for f := range outsideCalls {
			f()
			outsideDone <- struct{}{}
		}
	}()
}

// outsideBubble runs f on a goroutine outside the synctest bubble and
// waits for it. A CPU profile started in the bubble has its writer
// goroutine there, in a system call the bubble's clock waits for: virtual
// time stopped for good.
func outsideBubble(f func()) {
	outsideCalls <- f
	<-outsideDone
}

func writeHeapProfile(t *testing.T) {
	if *flagMemProf == "" {
		return
	}
	runtime.GC() // the profile shows the heap as of the last but one collection
	f, err := os.Create(*flagMemProf)
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Error(err)
	}
}
