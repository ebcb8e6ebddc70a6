// Package scale is an in-process scale simulation of the plugin: many
// hosts, each a real cluster.Cluster (gossip control plane on memberlist)
// feeding a real driver.Driver that programs its own fake kernel, connected
// by the in-memory transport cluster/memnet. Overlay networks are created
// on their hosts, then endpoints are joined through the driver's Join in
// waves, like a service rollout, and the run measures per endpoint the
// time from its Join until its neighbour entry is in the sandbox of every
// other host of its network (exact: a thin kernel wrapper timestamps each
// SetNeighbor), gossip bytes per host per second, heap per host, CPU, and
// false failure detections. It asserts correctness only: every host ends
// with exactly the remote endpoints of its networks programmed, with the
// right MAC and VTEP.
//
// By default it runs in virtual time (testing/synctest): every host,
// memberlist and memnet included, lives in one bubble whose clock moves
// only when all of them wait, so the figures are the protocol's, not this
// machine's CPU, and memberlist runs as shipped (SuspicionMult 4). Links
// have a one-way latency (-scale.latency). -scale.realtime runs the same
// simulation on the real clock, where 100 hosts share the test's cores.
//
// `go test ./test/scale` runs the small scenario in seconds; the others
// (see scenarios) write build/scale/<scenario>.md and .json and redraw
// build/scale/convergence.png:
//
//	go test ./test/scale -run '^TestScale$' -scale.scenario=a -v -timeout 60m
package scale

import (
	"flag"
	"fmt"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"
)

// scenario is a cluster shape and a rollout.
type scenario struct {
	Name        string `json:"name"`
	Desc        string `json:"desc"`
	Nodes       int    `json:"nodes"`
	Networks    int    `json:"networks"`
	NetsPerHost int    `json:"networksPerHost"`
	Endpoints   int    `json:"endpoints"`
	// Warm endpoints (the first of the rollout order, one per host if
	// Warm = Nodes) are joined, and converge, before the measured rollout
	// of the rest: a host programs a network's remote endpoints only once
	// it has a local one there.
	Warm         int           `json:"warm"`
	WaveSize     int           `json:"waveSize"` // endpoints per wave, over all hosts
	WaveInterval time.Duration `json:"waveIntervalNs"`
	Steady       time.Duration `json:"steadyWindowNs"`
}

var scenarios = map[string]scenario{
	"small": {Desc: "10 hosts × 400 endpoints in 4 networks, each host in 2 (the plain `go test` check)",
		Nodes: 10, Networks: 4, NetsPerHost: 2, Endpoints: 400, WaveSize: 100, WaveInterval: 500 * time.Millisecond, Steady: 2 * time.Second},
	"a": {Desc: "100 hosts × 10,000 endpoints, one network, 10 waves of 1000 every 2 s",
		Nodes: 100, Networks: 1, NetsPerHost: 1, Endpoints: 10000, WaveSize: 1000, WaveInterval: 2 * time.Second, Steady: 10 * time.Second},
	"b": {Desc: "25 hosts × 2,500 endpoints, one network, 10 waves of 250 every 2 s",
		Nodes: 25, Networks: 1, NetsPerHost: 1, Endpoints: 2500, WaveSize: 250, WaveInterval: 2 * time.Second, Steady: 10 * time.Second},
	"c": {Desc: "single Joins on an idle 100-host cluster (one endpoint per host already there): 50 endpoints, one at a time every 5 s, on 50 different hosts",
		Nodes: 100, Networks: 1, NetsPerHost: 1, Endpoints: 150, Warm: 100, WaveSize: 1, WaveInterval: 5 * time.Second, Steady: 10 * time.Second},
	"d": {Desc: "1,000 hosts × 100,000 endpoints in 100 networks, each host in 10, 10 waves of 10,000 every 2 s",
		Nodes: 1000, Networks: 100, NetsPerHost: 10, Endpoints: 100000, WaveSize: 10000, WaveInterval: 2 * time.Second, Steady: 10 * time.Second},
	"e": {Desc: "100 hosts × 10,000 endpoints in 50 networks, each host in 5, 10 waves of 1000 every 2 s: do records, heap and gossip follow a host's 5 networks or all 50?",
		Nodes: 100, Networks: 50, NetsPerHost: 5, Endpoints: 10000, WaveSize: 1000, WaveInterval: 2 * time.Second, Steady: 10 * time.Second},
}

var (
	flagScenario  = flag.String("scale.scenario", "small", "scenario: small, a, b, c, d or e (see scenarios in scenario_test.go)")
	flagRealtime  = flag.Bool("scale.realtime", false, "run on the real clock instead of in a synctest bubble (hosts then share this machine's cores; see -scale.suspicion-mult)")
	flagLatency   = flag.Duration("scale.latency", 100*time.Microsecond, "one-way latency of every memnet link (packets; dials take a round trip)")
	flagSeeds     = flag.Int("scale.seeds", 3, "hosts every host is given as gossip seeds")
	flagGossip    = flag.Duration("scale.gossip-interval", 0, "memberlist GossipInterval (0: as shipped, DefaultLANConfig's 200ms)")
	flagPushPull  = flag.Duration("scale.pushpull-interval", 0, "memberlist PushPullInterval (0: as shipped, the cluster's 10s, which memberlist scales up with the host count)")
	flagProbe     = flag.Duration("scale.probe-interval", 0, "memberlist ProbeInterval (0: as shipped, 1s)")
	flagSuspicion = flag.Int("scale.suspicion-mult", 0, "memberlist SuspicionMult (0: as shipped, 4). The real-time variant at 100 hosts needs 20, or CPU starvation passes for failed hosts")
	flagResync    = flag.Duration("scale.resync", 30*time.Second, "period of every host's driver.Resync, as the plugin's serve runs it (0: none)")
	flagCompress  = flag.Bool("scale.compression", false, "memberlist EnableCompression (as shipped: false)")
	flagEncrypt   = flag.Bool("scale.encrypt", false, "encrypt gossip (AES-256-GCM shared key)")
	flagProfile   = flag.String("scale.cpuprofile", "", "write a CPU profile of the rollout (first Join until convergence) to this file")
	flagMemProf   = flag.String("scale.memprofile", "", "write a heap profile taken after the steady-state window to this file")
	flagTimeout   = flag.Duration("scale.timeout", 15*time.Minute, "give up (and fail) if membership or convergence is not reached within this (simulated) time")
	flagMaxRSS    = flag.Uint64("scale.max-rss-gib", 20, "abort the test binary if its resident set passes this many GiB, before the machine runs out of memory")
	flagFraction  = flag.Float64("scale.fraction", 1, "scale the scenario's hosts, networks, endpoints, waves and warm-up by this factor (a 1,000-host scenario at 0.2 has the same networks per host and hosts per network, in 200 hosts): for profiling")
	flagOut       = flag.String("scale.out", "", "results file (Markdown; JSON next to it). Default: build/scale/<scenario>[-realtime].md, none for small")
)

// params are one run's parameters.
type params struct {
	scenario
	Realtime         bool          `json:"realtime"`
	Waves            int           `json:"waves"`
	Latency          time.Duration `json:"latencyNs"`
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

func paramsFromFlags(t *testing.T) params {
	s, ok := scenarios[*flagScenario]
	if !ok {
		t.Fatalf("unknown scenario %q", *flagScenario)
	}
	s.Name = *flagScenario
	if f := *flagFraction; f != 1 {
		if f <= 0 || f > 1 {
			t.Fatalf("-scale.fraction %v: must be in (0, 1]", f)
		}
		scale := func(n int) int { return int(float64(n)*f + 0.5) }
		s.Nodes, s.Networks, s.Endpoints, s.WaveSize, s.Warm = scale(s.Nodes), max(scale(s.Networks), 1), scale(s.Endpoints), max(scale(s.WaveSize), 1), scale(s.Warm)
		s.Name += fmt.Sprintf("-x%g", f)
		s.Desc = fmt.Sprintf("%s, scaled by %g: %d hosts, %d networks, %d endpoints", s.Desc, f, s.Nodes, s.Networks, s.Endpoints)
	}
	p := params{
		scenario:         s,
		Realtime:         *flagRealtime,
		Waves:            (s.Endpoints - s.Warm + s.WaveSize - 1) / s.WaveSize,
		Latency:          *flagLatency,
		Seeds:            min(max(*flagSeeds, 1), s.Nodes),
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
	if p.Out == "" && s.Name != "small" {
		name := s.Name
		if p.Realtime {
			name += "-realtime"
		}
		p.Out = filepath.Join("..", "..", "build", "scale", name+".md")
	}
	if s.Endpoints%s.Networks != 0 || s.Nodes*s.NetsPerHost%s.Networks != 0 || s.Endpoints > 1<<24-2 {
		t.Fatalf("scenario %s: networks must divide endpoints and host memberships, at most %d endpoints", s.Name, 1<<24-2)
	}
	return p
}

func TestScale(t *testing.T) {
	p := paramsFromFlags(t)
	t.Logf("scenario %s: %s; %s", p.Name, p.Desc, map[bool]string{true: "real time", false: "virtual time (synctest)"}[p.Realtime])
	res := &results{Params: p}
	res.env() // outside the bubble: its clock reads 2000-01-01
	defer limitRSS(*flagMaxRSS << 30)()
	wall := wallNow()
	if p.Realtime {
		run(t, p, res)
	} else {
		synctest.Test(t, func(t *testing.T) {
			// The bubble's clock stops when this returns, yet memberlist's
			// probes and streams outlive its Shutdown until they time out
			// (TCPTimeout 10 s at most): give them that time, last of all
			// the cleanups.
			t.Cleanup(func() { time.Sleep(15 * time.Second) })
			run(t, p, res)
		})
	}
	res.Phases.WallTotal = wallNow() - wall
	res.Memory.PeakRSS = peakRSS()
	res.Load += " → " + loadavg()
	md := res.markdown()
	t.Log("\n" + md)
	if p.Out == "" {
		return
	}
	if err := res.write(p.Out, md); err != nil {
		t.Fatal(err)
	}
	if err := plotDir(filepath.Dir(p.Out)); err != nil {
		t.Error(err)
	}
	abs, _ := filepath.Abs(p.Out)
	t.Logf("results written to %s (and .json)", abs)
}
