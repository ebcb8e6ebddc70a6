package espvm

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// GuestArg is the first argument that makes the benchmark's binary run
// the measurements (inside the VM: see Guest).
const GuestArg = "espvm-guest"

// Job is what the host asks the guest to measure.
type Job struct {
	Reps        int     `json:"reps"`
	DurationSec float64 `json:"durationSec"`
	Streams     []int   `json:"streams"`
	// Out is where the guest writes its Raw result (under /vmshare).
	Out string `json:"out"`
}

func (j Job) duration() time.Duration { return time.Duration(j.DurationSec * float64(time.Second)) }

// Raw is what the guest measured.
type Raw struct {
	Kernel string `json:"kernel"`
	CPUs   int    `json:"cpus"`
	AEAD   string `json:"aead"`
	// AEADDriver is the kernel's implementation of AEAD in use (from
	// /proc/crypto): whether the emulated CPU's AES instructions served.
	AEADDriver string `json:"aeadDriver"`
	// MTU of the containers' interfaces on each network.
	MTU      map[string]int `json:"mtu"`
	SetupSec float64        `json:"setupSec"`
	Runs     []Run          `json:"runs"`
	// Error: the guest could not measure (set-up or harness failure).
	Error string `json:"error,omitempty"`
}

// Run is one measurement on one network.
type Run struct {
	Rep     int    `json:"rep"`
	Figure  string `json:"figure"`  // figureID: tcp1, tcp4, rtt
	Network string `json:"network"` // plain or encrypted
	// Throughput figures.
	Streams       int     `json:"streams,omitempty"`
	SentBytes     uint64  `json:"sentBytes,omitempty"`
	ReceivedBytes uint64  `json:"receivedBytes,omitempty"`
	Seconds       float64 `json:"seconds"`
	Mbps          float64 `json:"mbitPerSec,omitempty"`
	// Round-trip figure.
	Exchanges int     `json:"exchanges,omitempty"`
	Replies   int     `json:"replies,omitempty"`
	P50Us     float64 `json:"rttP50Us,omitempty"`
	P99Us     float64 `json:"rttP99Us,omitempty"`
	// How much the plugin's ESP SAs on h1 grew during the run (ip -s xfrm
	// state), outbound (h1 -> h2) and inbound.
	ESPOut Growth `json:"espOut"`
	ESPIn  Growth `json:"espIn"`
	// Correct: the traffic arrived whole, and went through ESP on the
	// encrypted network and not on the plain one.
	Correct bool   `json:"correct"`
	Error   string `json:"error,omitempty"`
}

// Growth is an SA counter's growth.
type Growth struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

const (
	plainNet = "plain"
	encNet   = "encrypted"

	echoPort = 5201
	sinkPort = 5202

	// Bounds sized for the VM under load (as test/encrypted's).
	pluginStart = 120 * time.Second
	converge    = 90 * time.Second
	firstPing   = 60 * time.Second
)

// The two overlays, IPv4 only, as swarm's IPAM would plan them.
var specs = map[string]testbed.NetworkSpec{
	encNet: {Name: encNet, Options: map[string]string{"encrypted": ""},
		Pool4: netip.MustParsePrefix("203.0.113.0/25"), Gw4: "203.0.113.126/25"},
	plainNet: {Name: plainNet,
		Pool4: netip.MustParsePrefix("203.0.113.128/25"), Gw4: "203.0.113.254/25"},
}

// Guest runs the job (JSON) on this machine: in the VM, where the kernel
// does ESP. Two hosts (network namespaces) run the real plugin with gossip
// and one cluster secret, as test/encrypted does through internal/testbed;
// each gets a container on an encrypted and on a plain network. Then, for
// each repetition and figure, the plain network is measured and then the
// encrypted one, from the container on h1 to the one on h2. It writes the
// Raw result to job.Out and fails if a run was not correct.
func Guest(arg string) (err error) {
	var job Job
	if err := json.Unmarshal([]byte(arg), &job); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	raw := &Raw{Kernel: kernelRelease(), CPUs: runtime.NumCPU(), AEAD: encryption.AEADName, MTU: map[string]int{}}
	defer func() {
		if err != nil {
			raw.Error = err.Error()
		}
		b, jerr := json.MarshalIndent(raw, "", "  ")
		if jerr == nil {
			jerr = os.WriteFile(job.Out, append(b, '\n'), 0o644)
		}
		err = errors.Join(err, jerr)
	}()
	if err := testbed.Check(); err != nil {
		return err
	}
	if os.Getenv("OVERLAY_PLUGIN_BIN") == "" {
		return errors.New("OVERLAY_PLUGIN_BIN is not set: the plugin binary is not built in the VM")
	}
	if err := testbed.SweepStale(); err != nil {
		logf("sweeping namespaces of dead runs: %v", err)
	}
	bed := testbed.New(nil)
	defer func() {
		err = errors.Join(err, bed.Cleanup())
		if serr := testbed.Sweep(); serr != nil {
			err = errors.Join(err, fmt.Errorf("namespaces left: %w", serr))
		}
		testbed.RemoveBuiltPlugin()
	}()
	t0 := time.Now()
	b, err := setup(bed, raw)
	if err != nil {
		return err
	}
	raw.SetupSec = time.Since(t0).Seconds()
	raw.AEADDriver = cryptoDriver(encryption.AEADName)
	defer func() { err = errors.Join(err, b.close()) }()
	logf("set up in %.1fs: 2 hosts, plugins with gossip and one secret, SAs programmed; MTU %v; %s is %s", raw.SetupSec, raw.MTU, raw.AEAD, raw.AEADDriver)

	d := job.duration()
	bad := 0
	for rep := range job.Reps {
		for _, f := range figures(job.Streams) {
			for _, nw := range []string{plainNet, encNet} {
				r := b.measure(rep, f, nw, d)
				raw.Runs = append(raw.Runs, r)
				if !r.Correct {
					bad++
				}
				logf("rep %d %s %s: %s", rep+1, f.ID, nw, r.summary())
			}
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d runs not correct", bad, len(raw.Runs))
	}
	return nil
}

// bench is the set-up the runs share.
type bench struct {
	c      *testbed.Cluster
	h1     *testbed.Node
	h2     *testbed.Node
	from   map[string]*testbed.Container // h1's container, by network
	to     map[string]*testbed.Container // h2's
	sinks  []*sink
	echoes []*testbed.EchoServer
}

func setup(bed *testbed.Bed, raw *Raw) (*bench, error) {
	c, err := bed.NewCluster(testbed.ClusterConfig{Hosts: 2, UnderlayWait: 30 * time.Second,
		Gossip: true, Secret: true, // key rotation: the plugin's default (1 h), none during the run
		Plugin:        testbed.PluginConfig{StartTimeout: pluginStart},
		ParallelStart: true})
	if err != nil {
		return nil, err
	}
	if err := c.WaitMembers(nil, converge, "h2 joined h1"); err != nil {
		return nil, err
	}
	if err := c.WaitEncryption(converge); err != nil {
		return nil, err
	}
	b := &bench{c: c, h1: c.Nodes[0], h2: c.Nodes[1], from: map[string]*testbed.Container{}, to: map[string]*testbed.Container{}}
	for _, name := range []string{plainNet, encNet} {
		nw, err := c.CreateNetwork(specs[name])
		if err != nil {
			return nil, err
		}
		for i, n := range c.Nodes {
			ep, err := c.RunContainer(n, nw, fmt.Sprintf("%s%d", name[:1], i+1), nw.Addrs(i+1)...)
			if err != nil {
				return nil, err
			}
			if i == 0 {
				b.from[name] = ep.Ctr
			} else {
				b.to[name] = ep.Ctr
			}
		}
		links, err := b.from[name].Links()
		if err != nil {
			return nil, err
		}
		if i := slices.IndexFunc(links, func(l testbed.Link) bool { return l.Name == b.from[name].Iface }); i >= 0 {
			raw.MTU[name] = links[i].MTU
		}
	}
	if err := c.WaitIPsec(converge); err != nil {
		return nil, err
	}
	for _, name := range []string{plainNet, encNet} {
		// Both ways, ICMP and TCP: neighbours resolved, SAs in use, the
		// crypto modules loaded before anything is timed.
		err := testbed.CheckTraffic([]*testbed.Container{b.from[name], b.to[name]},
			testbed.Traffic{FirstPing: firstPing, TCPSize: 256 << 10, TCPTimeout: firstPing, EchoPort: echoPort})
		if err != nil {
			return nil, fmt.Errorf("%s network: %w", name, err)
		}
		dst, _ := b.to[name].Addr(testbed.IPv4)
		s, err := startSink(b.to[name].Netns, netip.AddrPortFrom(dst, sinkPort), 10*time.Minute)
		if err != nil {
			return nil, err
		}
		b.sinks = append(b.sinks, s)
		e, err := b.to[name].StartEcho(netip.AddrPortFrom(dst, echoPort))
		if err != nil {
			return nil, err
		}
		b.echoes = append(b.echoes, e)
	}
	return b, nil
}

func (b *bench) close() error {
	var errs []error
	for _, s := range b.sinks {
		errs = append(errs, s.Close())
	}
	for _, e := range b.echoes {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}

// measure runs figure f on network nw and checks it.
func (b *bench) measure(rep int, f figure, nw string, d time.Duration) Run {
	r := Run{Rep: rep, Figure: f.ID, Network: nw, Streams: f.Streams}
	from, to := b.from[nw], b.to[nw]
	dst, _ := to.Addr(testbed.IPv4)
	before, out, err := b.h1.NS.XfrmStates()
	if err != nil {
		r.Error = fmt.Sprintf("ip -s xfrm state before: %v: %s", err, out)
		return r
	}
	var runErr error
	if f.Streams > 0 {
		var t throughput
		t, runErr = measureThroughput(from.Netns, netip.AddrPortFrom(dst, sinkPort), f.Streams, d)
		r.SentBytes, r.ReceivedBytes, r.Seconds = t.Sent, t.Received, t.Seconds
		if t.Seconds > 0 {
			r.Mbps = float64(t.Received) * 8 / t.Seconds / 1e6
		}
	} else {
		start := time.Now()
		var rt roundTrips
		rt, runErr = measureRoundTrips(from.Netns, netip.AddrPortFrom(dst, echoPort), d, 100)
		r.Seconds = time.Since(start).Seconds()
		r.Exchanges, r.Replies = rt.Exchanges, rt.Replies
		r.P50Us, r.P99Us = quantile(rt.RTT, 0.5), quantile(rt.RTT, 0.99)
	}
	after, out, err := b.h1.NS.XfrmStates()
	if err != nil {
		r.Error = fmt.Sprintf("ip -s xfrm state after: %v: %s", err, out)
		return r
	}
	a, z := b.h1.Underlay, b.h2.Underlay
	r.ESPOut.Packets, r.ESPOut.Bytes = testbed.XfrmGrowth(before, after, a, z)
	r.ESPIn.Packets, r.ESPIn.Bytes = testbed.XfrmGrowth(before, after, z, a)
	if runErr != nil {
		r.Error = runErr.Error()
		return r
	}
	if err := espCheck(r); err != nil {
		r.Error = fmt.Sprintf("%v (h1's SAs before: %+v, after: %+v)", err, before, after)
		return r
	}
	r.Correct = true
	return r
}

// espCheck: on the encrypted network the run's traffic went through the
// plugin's SAs (outbound at least every byte sent; for the exchanges at
// least one packet each, both ways); on the plain network it did not
// (the SAs grew by less than that).
func espCheck(r Run) error {
	var through bool
	var what string
	if r.Streams > 0 {
		through = r.ESPOut.Bytes >= r.SentBytes && r.SentBytes > 0
		what = fmt.Sprintf("outbound SAs h1 -> h2 grew by %d bytes for %d bytes of TCP payload sent", r.ESPOut.Bytes, r.SentBytes)
	} else {
		n := uint64(r.Exchanges)
		through = r.ESPOut.Packets >= n && r.ESPIn.Packets >= n && n > 0
		what = fmt.Sprintf("SAs grew by %d packets out, %d in, for %d request/reply exchanges", r.ESPOut.Packets, r.ESPIn.Packets, n)
		if r.Network == plainNet {
			through = r.ESPOut.Packets >= n || r.ESPIn.Packets >= n
		}
	}
	switch {
	case r.Network == encNet && !through:
		return fmt.Errorf("encrypted network, not through ESP: %s", what)
	case r.Network == plainNet && through:
		return fmt.Errorf("plain network, through ESP: %s", what)
	}
	return nil
}

func (r Run) summary() string {
	var s string
	if r.Streams > 0 {
		s = fmt.Sprintf("%.1f Mbit/s (%d bytes sent, %d received in %.2fs)", r.Mbps, r.SentBytes, r.ReceivedBytes, r.Seconds)
	} else {
		s = fmt.Sprintf("round trip p50 %.0f µs, p99 %.0f µs (%d exchanges, %d replies)", r.P50Us, r.P99Us, r.Exchanges, r.Replies)
	}
	s += fmt.Sprintf("; ESP SAs on h1 +%d/+%d packets out/in", r.ESPOut.Packets, r.ESPIn.Packets)
	if r.Correct {
		return s + "; correct"
	}
	return s + "; NOT CORRECT: " + r.Error
}

func logf(format string, args ...any) {
	fmt.Printf("espvm: %s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// cryptoDriver is the driver of the highest priority that /proc/crypto
// lists for the algorithm name, or "unknown".
func cryptoDriver(name string) string {
	b, err := os.ReadFile("/proc/crypto")
	if err != nil {
		return "unknown"
	}
	best, prio := "unknown", -1
	for _, entry := range strings.Split(string(b), "\n\n") {
		f := map[string]string{}
		for _, line := range strings.Split(entry, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				f[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
		p, err := strconv.Atoi(f["priority"])
		if f["name"] == name && err == nil && p > prio {
			best, prio = f["driver"], p
		}
	}
	return best
}
