// Package multihost runs the plugin binary on several simulated hosts
// (network namespaces joined by a bridge) and drives it the way dockerd
// does, then checks real traffic between containers across the VXLAN
// overlay and the kernel state the plugins programmed.
//
// Needs root, iproute2 and a kernel with veth, bridge and vxlan; skips
// (saying why) otherwise. The plugin binary is $OVERLAY_PLUGIN_BIN or is
// built from ./cmd/overlay-plugin.
package multihost

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m, "multihost") }

var testbedReq = testbed.NewRequirement("multihost")

func requireTestbed(t *testing.T) {
	t.Helper()
	testbedReq.Require(t)
}

// The plugins run without the gossip control plane (testbed.Cluster's
// default): these tests feed the remote endpoints through the admin API
// alone (test/gossip covers gossip).

// The overlay, as `docker network create` and swarm's IPAM make it.
var overlay = testbed.Overlay

// VXLAN overhead: outer IP + UDP + VXLAN + inner Ethernet.
var vxlanOverhead = map[testbed.Family]int{testbed.IPv4: 20 + 8 + 8 + 14, testbed.IPv6: 40 + 8 + 8 + 14}

const (
	firstPing   = 10 * time.Second // neighbour tables may need a moment
	tcpTimeout  = 20 * time.Second
	tcpSize     = 256 << 10 // far above the MTU: segmentation and PMTU
	echoPort    = 5201
	underlayMTU = 1500 // veth default
)

// node is one host with its plugin and its one container's endpoint.
type node struct {
	*testbed.Node
	ep *testbed.Endpoint
}

// cluster is a network spread over the hosts of a testbed.Cluster.
type cluster struct {
	*testbed.Cluster
	nodes []*node
	nw    *testbed.Network
}

// setup builds hosts (one plugin each, enabled as dockerd does with every
// swarm node's hint), a network created through the leader (h1) the way a
// swarm does, and one joined, attached container per host, then feeds
// every plugin the other hosts' endpoints through its admin API.
func setup(t *testing.T, fam testbed.Family, hosts int) *cluster {
	t.Helper()
	return setupWith(t, fam, hosts, testbed.PluginConfig{})
}

// setupWith is setup with the plugins run as cfg says.
func setupWith(t *testing.T, fam testbed.Family, hosts int, cfg testbed.PluginConfig) *cluster {
	t.Helper()
	tc, err := testbed.New(t).NewCluster(testbed.ClusterConfig{Hosts: hosts, Underlay: fam, Discovery: true, Plugin: cfg})
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{Cluster: tc}
	if c.nw, err = c.CreateNetwork(overlay); err != nil {
		t.Fatal(err)
	}
	// A newly elected leader allocates again with the returned options:
	// that must give the same answer.
	again, err := c.Nodes[0].Plugin.API.AllocateNetwork(&api.AllocateNetworkRequest{
		NetworkID: c.nw.ID,
		Options:   c.nw.Allocated,
		IPv4Data:  []api.IPAMData{{AddressSpace: "GlobalDefault", Pool: overlay.Pool4.String(), Gateway: overlay.Gw4}},
	})
	if err != nil {
		t.Fatalf("AllocateNetwork again with the returned options (new leader): %v", err)
	}
	if !maps.Equal(again.Options, c.nw.Allocated) {
		t.Fatalf("AllocateNetwork again returned %v, first %v: a new leader would change the network", again.Options, c.nw.Allocated)
	}

	for i, n := range c.Nodes {
		ep, err := c.RunContainer(n, c.nw, fmt.Sprintf("c%d", i+1), c.nw.Addrs(i+1)...)
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, &node{Node: n, ep: ep})
	}
	for _, n := range c.nodes {
		for _, o := range c.nodes {
			if o != n {
				if err := n.Plugin.Admin.AddPeer(c.nw.ID, o.ep.Peer()); err != nil {
					t.Fatalf("%s AddPeer(%s): %v", n.Name, o.ep, err)
				}
			}
		}
	}
	return c
}

// checkState checks every plugin's admin view of the network, and the
// kernel entries in its sandbox read independently, against the peers it
// was given: the other nodes' endpoints, none on the nodes in without.
func (c *cluster) checkState(t *testing.T, without ...*node) {
	t.Helper()
	fam := c.Topo.Family
	want := func(obs *testbed.Node) []*testbed.Endpoint {
		if slices.ContainsFunc(without, func(n *node) bool { return n.Node == obs }) {
			return nil
		}
		return c.Remotes(obs, c.nw)
	}
	for _, d := range c.Diffs(c.nw, want, true) {
		t.Error(d)
	}
	for _, n := range c.nodes {
		st, err := n.Plugin.Network(c.nw.ID)
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		if st.VNI != c.nw.VNI {
			t.Errorf("%s: network VNI %d, want %d (allocated by the leader)", n.Name, st.VNI, c.nw.VNI)
		}
		if !slices.Equal(st.Subnets, []netip.Prefix{overlay.Pool4, overlay.Pool6}) {
			t.Errorf("%s: subnets %v, want %v", n.Name, st.Subnets, []netip.Prefix{overlay.Pool4, overlay.Pool6})
		}
		if limit := underlayMTU - vxlanOverhead[fam]; st.MTU <= 0 || st.MTU > limit {
			t.Errorf("%s: overlay MTU %d, want 1..%d for a %v underlay of MTU %d", n.Name, st.MTU, limit, fam, underlayMTU)
		}
		if len(st.Endpoints) != 1 || st.Endpoints[0].ID != n.ep.ID || st.Endpoints[0].MAC.String() != n.ep.MAC ||
			!st.Endpoints[0].Joined || st.Endpoints[0].HostVeth != n.ep.Join.InterfaceName.SrcName {
			t.Errorf("%s: endpoints %+v, want only %s joined with MAC %s and host veth %s", n.Name, st.Endpoints, n.ep.ID, n.ep.MAC, n.ep.Join.InterfaceName.SrcName)
		}
		if st.Sandbox == "" || st.Kernel == nil {
			t.Fatalf("%s: network has no sandbox or kernel view while an endpoint is joined: %+v", n.Name, st)
		}
		if kn, kf, err := n.Plugin.SandboxEntries(st.Sandbox); err == nil {
			t.Logf("%s: vxlan0 in sandbox %s: neighbours %v, FDB %v", n.Name, st.Sandbox, kn, kf)
		}
		// The container's interface carries the network's MTU.
		links, err := n.ep.Ctr.Links()
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(links, func(l testbed.Link) bool { return l.Name == "eth0" })
		if i < 0 || links[i].MTU != st.MTU || links[i].Address != n.ep.MAC {
			t.Errorf("%s: container links %+v: want eth0 with MTU %d and MAC %s", n.Name, links, st.MTU, n.ep.MAC)
		}
	}
}

// checkTraffic pings and exchanges TCP data between every ordered pair of
// containers in both overlay families.
func (c *cluster) checkTraffic(t *testing.T) {
	t.Helper()
	// The containers' only path is the overlay; the underlay counters
	// confirm the bytes crossed the switch.
	before := make([]uint64, len(c.nodes))
	var ctrs []*testbed.Container
	for i, n := range c.nodes {
		rx, _, err := n.PortBytes()
		if err != nil {
			t.Fatal(err)
		}
		before[i] = rx
		ctrs = append(ctrs, n.ep.Ctr)
	}
	err := testbed.CheckTraffic(ctrs, testbed.Traffic{FirstPing: firstPing, TCPSize: tcpSize, TCPTimeout: tcpTimeout, EchoPort: echoPort})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("overlay IPv4 and IPv6: ICMP and TCP (%d KiB each way) between all %d containers", tcpSize>>10, len(c.nodes))
	// Each host sent, per family, tcpSize to every other host and echoed as
	// much back: VXLAN adds to that, never takes away.
	want := uint64(2 * 2 * tcpSize * (len(c.nodes) - 1))
	for i, n := range c.nodes {
		rx, _, err := n.PortBytes()
		if err != nil {
			t.Fatal(err)
		}
		if rx-before[i] < want {
			t.Errorf("%s sent %d bytes onto the underlay during the exchanges, want at least %d", n.Name, rx-before[i], want)
		}
	}
}

// teardown removes everything the way dockerd does (detach, Leave,
// DeleteEndpoint, DeleteNetwork on each node, FreeNetwork on the leader)
// and checks that no trace is left: no network in the plugins, no sandbox
// mount or file, no device in the host namespaces. Then it stops the
// plugins, which must exit 0 on SIGTERM.
func (c *cluster) teardown(t *testing.T) {
	t.Helper()
	for _, n := range c.nodes {
		// dockerd moves the interface back out before Leave, if it still
		// exists (it goes with a sandbox a plugin restart lost).
		if links, err := n.ep.Ctr.Links(); err == nil && len(links) > 1 {
			if err := n.ep.Ctr.Detach(); err != nil {
				t.Fatalf("%s: %v", n.Name, err)
			}
		}
		if err := c.Leave(n.ep); err != nil {
			t.Fatal(err)
		}
		if err := n.Plugin.API.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: c.nw.ID}); err != nil {
			t.Fatalf("%s DeleteNetwork: %v", n.Name, err)
		}
	}
	leader := c.nodes[0]
	// While the network holds its VNI, no other network may take it...
	other := testbed.SwarmID()
	taken := map[string]string{"vxlanid_list": strconv.FormatUint(uint64(c.nw.VNI), 10)}
	if _, err := leader.Plugin.API.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: other, Options: taken}); err == nil {
		t.Errorf("AllocateNetwork of another network with VNI %d in use succeeded", c.nw.VNI)
		_ = leader.Plugin.API.FreeNetwork(&api.FreeNetworkRequest{NetworkID: other})
	}
	if err := leader.Plugin.API.FreeNetwork(&api.FreeNetworkRequest{NetworkID: c.nw.ID}); err != nil {
		t.Fatalf("FreeNetwork: %v", err)
	}
	// ...and after FreeNetwork it is free again.
	if _, err := leader.Plugin.API.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: other, Options: taken}); err != nil {
		t.Errorf("VNI %d not released by FreeNetwork: %v", c.nw.VNI, err)
	} else if err := leader.Plugin.API.FreeNetwork(&api.FreeNetworkRequest{NetworkID: other}); err != nil {
		t.Errorf("FreeNetwork: %v", err)
	}

	for _, n := range c.nodes {
		nets, err := n.Plugin.Admin.Networks()
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		if len(nets) != 0 {
			t.Errorf("%s: plugin still lists networks after DeleteNetwork: %+v", n.Name, nets)
		}
		if m, err := n.Plugin.Mounts(); err != nil || len(m) != 0 {
			t.Errorf("%s: mounts left under %s in the plugin's mount namespace: %v %v", n.Name, n.Plugin.SandboxDir, m, err)
		}
		if f, err := n.Plugin.SandboxFiles(); err != nil || len(f) != 0 {
			t.Errorf("%s: files left in %s: %v %v", n.Name, n.Plugin.SandboxDir, f, err)
		}
		if extra, err := n.ExtraLinks(); err != nil || len(extra) != 0 {
			t.Errorf("%s: devices left in the host namespace: %v %v", n.Name, extra, err)
		}
		if links, err := n.ep.Ctr.Links(); err != nil || len(links) != 1 {
			t.Errorf("%s: container %s has %v %v, want only lo", n.Name, n.ep.Ctr.Name, links, err)
		}
	}
	c.stopPlugins(t)
}

func (c *cluster) stopPlugins(t *testing.T) {
	t.Helper()
	for _, n := range c.nodes {
		if err := n.Plugin.Stop(0); err != nil {
			t.Errorf("%s: stop plugin: %v (contract: exit 0 on SIGTERM)", n.Name, err)
		}
	}
}
