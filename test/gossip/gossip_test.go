// Package gossip runs the plugin binary on three simulated hosts (network
// namespaces on a switch bridge) with its gossip control plane on, drives
// each plugin the way dockerd does, and checks that the endpoint table
// reaches every host WITHOUT any peer fed through the admin API: traffic
// between containers, the kernel neighbour and FDB entries of every
// sandbox (read through the admin API and, independently, with ip and
// bridge inside the sandbox), and how the table recovers from leaves,
// crashes, partitions, churn, a wrong cluster secret, and flooding.
//
// This file is the suite's use of testbed.Cluster; each scenario has a
// file of its own.
//
// Needs root, iproute2 (ip, bridge), util-linux's nsenter and a kernel with
// veth, bridge and vxlan; skips (saying why) otherwise. The plugin binary
// is $OVERLAY_PLUGIN_BIN or is built from ./cmd/overlay-plugin.
package gossip

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine/enginetest"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m, "gossip") }

var testbedReq = testbed.NewRequirement("gossip", func() error {
	if _, err := exec.LookPath("nsenter"); err != nil {
		return errors.New("needs util-linux's nsenter to read sandbox tables")
	}
	return nil
})

func requireTestbed(t *testing.T) {
	t.Helper()
	testbedReq.Require(t)
}

// The overlay, as `docker network create` and swarm's IPAM make it.
var overlay = testbed.Overlay

const (
	// converge bounds the wait for the table to reach every host after a
	// change on a healthy cluster. heal bounds it after a partition ends
	// (issue 12): the protocol needs about a second (gone members are
	// pinged every second; cluster's TestPartitionPastGraceHeals measures
	// at most 0.8 s in virtual time), the rest is margin for a loaded
	// 2-core machine (scheduling, netlink, the 200 ms poll). Measured here:
	// 0.25-1.2 s; with both cores also spinning in busy loops 0.5-1.8 s,
	// once 4.2 s.
	converge = 20 * time.Second
	heal     = 5 * time.Second
	// antiEntropy bounds a repair that only the periodic push/pull can do
	// (a broadcast that missed a host): memberlist's LAN PushPullInterval
	// is 30 s, and a fresh node's first one comes 30-60 s after it starts.
	antiEntropy = 75 * time.Second
	firstPing   = 10 * time.Second // neighbour caches of the containers may need a moment
	tcpSize     = 128 << 10        // above the MTU: segmentation
	tcpWait     = 20 * time.Second
	echoPort    = 5201
)

// TestGossip: every subtest builds its own three hosts; none feeds a peer
// through the admin API.
func TestGossip(t *testing.T) {
	requireTestbed(t)
	t.Run("Reachability", testReachability)
	t.Run("ReachabilityIPv6Underlay", testReachabilityIPv6Underlay)
	t.Run("DockerDiscovery", testDockerDiscovery)
	t.Run("DiscoveryBeforeControlPlane", testDiscoveryBeforeControlPlane)
	t.Run("LeaveRemovesEntries", testLeave)
	t.Run("AddressReuseWarmCache", testAddressReuseWarmCache)
	t.Run("DeadNodeGrace", testDeadNodeGrace)
	t.Run("PartitionWithinGrace", func(t *testing.T) { testPartition(t, false) })
	t.Run("PartitionPastGrace", func(t *testing.T) { testPartition(t, true) })
	t.Run("Churn", testChurn)
	t.Run("SecretMismatch", testSecretMismatch)
	t.Run("SecretRotation", testSecretRotation)
	t.Run("Flood", testFlood)
}

// options of a cluster, beyond testbed's: flood makes the network with
// --opt flood, engines gives every host a fake Docker engine
// (engine_test.go) on the plugin's --docker-socket.
type options struct {
	testbed.ClusterConfig
	flood   bool
	engines bool
}

// gcluster is the cluster under test with one network, and what the
// scenarios expect of it.
type gcluster struct {
	*testbed.Cluster
	t       *testing.T
	nw      *testbed.Network
	engines map[*testbed.Host]*enginetest.Engine

	mu   sync.Mutex
	slot int // last address slot handed out by newSlot

	// isolated hosts neither see nor are seen by the others (wrong secret,
	// partition).
	isolated map[*testbed.Node]bool
	// expect overrides which remote endpoints a host should hold; nil is
	// "every live endpoint on another running, non-isolated host".
	expect func(obs *testbed.Node) []*testbed.Endpoint
}

// newCluster starts a plugin with gossip on every host, enables each as
// dockerd does, allocates the network on h1 (the swarm leader) and creates
// it on every host. No endpoint exists yet.
func newCluster(t *testing.T, o options) *gcluster {
	t.Helper()
	requireTestbed(t)
	c := &gcluster{t: t, engines: map[*testbed.Host]*enginetest.Engine{}, isolated: map[*testbed.Node]bool{}}
	cfg := o.ClusterConfig
	cfg.Gossip = true
	if o.engines {
		cfg.HostArgs = func(h *testbed.Host) []string {
			e, sock := enginetest.New(), filepath.Join(h.Dir, "engine.sock")
			e.Serve(t, sock)
			c.engines[h] = e
			return []string{"--docker-socket", sock}
		}
	}
	var err error
	if c.Cluster, err = testbed.New(t).NewCluster(cfg); err != nil {
		t.Fatal(err)
	}
	spec := overlay
	if o.flood {
		spec.Options = map[string]string{"flood": ""} // `docker network create --opt flood`
	}
	if c.nw, err = c.CreateNetwork(spec); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *gcluster) newSlot() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slot++
	return c.slot
}

// addContainer makes a container on n with a fresh address slot and
// attaches it like dockerd: CreateEndpoint, Join, move and configure the
// interface. The endpoint is live from then on.
func (c *gcluster) addContainer(n *testbed.Node, name string) *testbed.Endpoint {
	c.t.Helper()
	return c.addContainerAt(n, name, c.newSlot())
}

func (c *gcluster) addContainerAt(n *testbed.Node, name string, slot int) *testbed.Endpoint {
	c.t.Helper()
	ep, err := c.RunContainer(n, c.nw, name, c.nw.Addrs(slot)...)
	if err != nil {
		c.t.Fatal(err)
	}
	return ep
}

// containerPerHost attaches one container c1..cN per host.
func (c *gcluster) containerPerHost() []*testbed.Endpoint {
	c.t.Helper()
	var eps []*testbed.Endpoint
	for i, n := range c.Nodes {
		eps = append(eps, c.addContainer(n, fmt.Sprintf("c%d", i+1)))
	}
	return eps
}

// withContainers attaches a container per host, waits until every host
// sees every member and holds every endpoint, and checks the traffic
// between the containers: the start of most scenarios.
func (c *gcluster) withContainers() []*testbed.Endpoint {
	c.t.Helper()
	eps := c.containerPerHost()
	c.waitMembers(converge, "initial")
	c.waitConverged(converge, "initial")
	c.checkTraffic(eps, false)
	return eps
}

// joinNoContainer joins an endpoint with a fresh slot on n and a sandbox
// key no container has (churn: the plugin's tables, not the data path).
func (c *gcluster) joinNoContainer(n *testbed.Node, slot int) (*testbed.Endpoint, error) {
	return c.Join(n, c.nw, "/var/run/docker/netns/"+testbed.RandomHex(12), c.nw.Addrs(slot)...)
}

// leave does what dockerd does when a container stops: detach, Leave,
// DeleteEndpoint.
func (c *gcluster) leave(ep *testbed.Endpoint) {
	c.t.Helper()
	if err := c.leaveErr(ep); err != nil {
		c.t.Fatal(err)
	}
}

func (c *gcluster) leaveErr(ep *testbed.Endpoint) error {
	if ep.Ctr != nil {
		return c.StopContainer(ep)
	}
	return c.Leave(ep)
}

// remotesFor is what obs should hold: by default every live endpoint of
// another running host, unless one of the two is isolated.
func (c *gcluster) remotesFor(obs *testbed.Node) []*testbed.Endpoint {
	if c.expect != nil {
		return c.expect(obs)
	}
	var out []*testbed.Endpoint
	for _, ep := range c.Remotes(obs, c.nw) {
		if !c.isolated[obs] && !c.isolated[c.Node(ep.Host)] {
			out = append(out, ep)
		}
	}
	return out
}

// sees: isolated hosts see no one alive but themselves.
func (c *gcluster) sees(obs, m *testbed.Node) bool {
	return m.Plugin.Running() && !c.isolated[obs] && !c.isolated[m]
}

// diffs compares what every running host holds with what it should; with
// sandbox, the kernel tables are also read inside each sandbox.
func (c *gcluster) diffs(sandbox bool) []string { return c.Diffs(c.nw, c.remotesFor, sandbox) }

func (c *gcluster) membershipDiffs() []string { return c.MemberDiffs(c.sees) }

// fatalf fails the test with the message and the cluster dump.
func (c *gcluster) fatalf(format string, args ...any) {
	c.t.Helper()
	c.t.Fatalf(format+"\n\ncluster state:%s", append(args, c.Dump())...)
}

// waitConverged waits (bounded) until every host holds exactly what it
// should according to the admin API, then checks strictly, once, both
// the admin API and the sandboxes read with ip and bridge.
func (c *gcluster) waitConverged(timeout time.Duration, what string) time.Duration {
	c.t.Helper()
	took, err := c.WaitConverged(c.nw, c.remotesFor, timeout, what)
	if err != nil {
		c.fatalf("%v", err)
	}
	return took
}

// checkNow is a strict check without waiting.
func (c *gcluster) checkNow(what string) {
	c.t.Helper()
	if d := c.diffs(true); len(d) != 0 {
		c.fatalf("%s:\n  %s", what, strings.Join(d, "\n  "))
	}
}

func (c *gcluster) waitMembers(timeout time.Duration, what string) {
	c.t.Helper()
	if err := c.WaitMembers(c.sees, timeout, what); err != nil {
		c.fatalf("%v", err)
	}
}

// checkTraffic pings every ordered pair of the containers in both overlay
// families and, with tcp, exchanges tcpSize bytes with an echo server in
// every container from every other.
func (c *gcluster) checkTraffic(eps []*testbed.Endpoint, tcp bool) {
	c.t.Helper()
	start := time.Now()
	tr := testbed.Traffic{FirstPing: firstPing}
	what := "ICMP"
	if tcp {
		tr.TCPSize, tr.TCPTimeout, tr.EchoPort = tcpSize, tcpWait, echoPort
		what = fmt.Sprintf("ICMP and TCP (%d KiB each way)", tcpSize>>10)
	}
	if err := testbed.CheckTraffic(containers(eps), tr); err != nil {
		c.fatalf("%v", err)
	}
	c.t.Logf("overlay IPv4 and IPv6: %s between all %d containers %v in %v", what, len(eps), eps, time.Since(start).Round(time.Millisecond))
}

func containers(eps []*testbed.Endpoint) []*testbed.Container {
	out := make([]*testbed.Container, len(eps))
	for i, ep := range eps {
		out[i] = ep.Ctr
	}
	return out
}

// addr is ep's address of the family; every endpoint here has both.
func addr(ep *testbed.Endpoint, f testbed.Family) netip.Addr {
	a, ok := ep.Addr(f)
	if !ok {
		panic("no address of family " + f.String())
	}
	return a
}

// liveWithContainers returns the live endpoints that have a container.
func (c *gcluster) liveWithContainers() []*testbed.Endpoint {
	var out []*testbed.Endpoint
	for _, ep := range c.Live(c.nw) {
		if ep.Ctr != nil {
			out = append(out, ep)
		}
	}
	return out
}
