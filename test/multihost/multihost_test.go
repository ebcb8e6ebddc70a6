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

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

func TestMain(m *testing.M) { testbed.Main(m, "multihost") }

var testbedReq = testbed.NewRequirement("multihost")

func requireTestbed(t *testing.T) {
	t.Helper()
	testbedReq.Require(t)
}

// adminFedPlugin runs without the gossip control plane: these tests feed
// the remote endpoints through the admin API alone (test/gossip covers
// gossip), and the swarm-node hints they send would otherwise make the
// plugins gossip with each other too.
var adminFedPlugin = testbed.PluginConfig{Args: []string{"--gossip-port", "0"}}

// The overlay's address plan, as swarm's IPAM would hand it out.
var (
	poolV4 = netip.MustParsePrefix("203.0.113.0/24")
	gwV4   = "203.0.113.254/24"
	poolV6 = netip.MustParsePrefix("2001:db8:1::/64")
	gwV6   = "2001:db8:1::fffe/64"
)

// VXLAN overhead: outer IP + UDP + VXLAN + inner Ethernet.
var vxlanOverhead = map[testbed.Family]int{testbed.IPv4: 20 + 8 + 8 + 14, testbed.IPv6: 40 + 8 + 8 + 14}

const (
	firstPing   = 10 * time.Second // neighbour tables may need a moment
	tcpTimeout  = 20 * time.Second
	tcpSize     = 256 << 10 // far above the MTU: segmentation and PMTU
	echoPort    = 5201
	underlayMTU = 1500 // veth default
)

// node is one host with its plugin and its one container.
type node struct {
	host   *testbed.Host
	plugin *testbed.Plugin
	ctr    *testbed.Container
	epID   string
	mac    string // as the plugin assigned it
	addrs  []netip.Prefix
	join   *api.JoinResponse
}

func (n *node) ips() []netip.Addr {
	out := make([]netip.Addr, len(n.addrs))
	for i, a := range n.addrs {
		out[i] = a.Addr()
	}
	return out
}

func (n *node) peer() peerdb.Peer {
	mac, err := hwaddr.Parse(n.mac)
	if err != nil {
		panic(err)
	}
	return peerdb.Peer{EndpointID: n.epID, IPs: n.ips(), MAC: mac, VTEP: n.host.Underlay}
}

// cluster is a network spread over the hosts of a topology.
type cluster struct {
	topo  *testbed.Topology
	nodes []*node
	netID string
	vni   uint32
}

// setup builds hosts (one plugin each), a network created through the leader
// (h1) the way a swarm does, and one joined, attached container per host,
// then feeds every plugin the other hosts' endpoints through its admin API.
func setup(t *testing.T, fam testbed.Family, hosts int) *cluster {
	t.Helper()
	return setupWith(t, fam, hosts, adminFedPlugin)
}

// setupWith is setup with the plugins run as cfg says.
func setupWith(t *testing.T, fam testbed.Family, hosts int, cfg testbed.PluginConfig) *cluster {
	t.Helper()
	bed := testbed.New(t)
	topo, err := bed.NewTopology(fam, hosts)
	if err != nil {
		t.Fatalf("topology: %v", err)
	}
	if err := topo.WaitUnderlay(10 * time.Second); err != nil {
		t.Fatalf("underlay: %v", err)
	}
	c := &cluster{topo: topo, netID: testbed.SwarmID()}
	for i, h := range topo.Hosts {
		p, err := h.StartPlugin(cfg)
		if err != nil {
			t.Fatalf("start plugin: %v", err)
		}
		t.Logf("%s: underlay %s, plugin pid %d, log %s", h.Name, h.Underlay, p.Pid(), p.LogFile)
		c.nodes = append(c.nodes, &node{host: h, plugin: p, epID: testbed.RandomHex(64),
			addrs: []netip.Prefix{
				netip.PrefixFrom(testbed.Nth(poolV4, i+1), poolV4.Bits()),
				netip.PrefixFrom(testbed.Nth(poolV6, i+1), poolV6.Bits()),
			}})
	}

	// dockerd enabling the plugin, and swarm reporting the nodes.
	for _, n := range c.nodes {
		caps, err := n.plugin.API.Capabilities()
		if err != nil {
			t.Fatalf("%s GetCapabilities: %v", n.host.Name, err)
		}
		if caps.Scope != api.GlobalScope || caps.ConnectivityScope != api.GlobalScope {
			t.Fatalf("%s GetCapabilities = %+v, want global scope and connectivity scope", n.host.Name, *caps)
		}
		for _, o := range c.nodes {
			if err := n.plugin.API.DiscoverNode(o.host.Underlay.String(), o == n); err != nil {
				t.Fatalf("%s DiscoverNew(%s, self=%v): %v", n.host.Name, o.host.Underlay, o == n, err)
			}
		}
	}

	// The leader allocates; the options it returns are what nodes get.
	leader := c.nodes[0]
	alloc, err := leader.plugin.API.AllocateNetwork(&api.AllocateNetworkRequest{
		NetworkID: c.netID,
		Options:   map[string]string{},
		IPv4Data:  []api.IPAMData{{AddressSpace: "GlobalDefault", Pool: poolV4.String(), Gateway: gwV4}},
	})
	if err != nil {
		t.Fatalf("AllocateNetwork: %v", err)
	}
	vni, err := strconv.ParseUint(alloc.Options["vxlanid_list"], 10, 32)
	if err != nil || vni == 0 || vni >= 1<<24 {
		t.Fatalf("AllocateNetwork options %v: want a VNI in vxlanid_list", alloc.Options)
	}
	c.vni = uint32(vni)
	t.Logf("network %s: VNI %d, options %v", c.netID, c.vni, alloc.Options)
	// A newly elected leader allocates again with the returned options:
	// that must give the same answer.
	again, err := leader.plugin.API.AllocateNetwork(&api.AllocateNetworkRequest{
		NetworkID: c.netID,
		Options:   alloc.Options,
		IPv4Data:  []api.IPAMData{{AddressSpace: "GlobalDefault", Pool: poolV4.String(), Gateway: gwV4}},
	})
	if err != nil {
		t.Fatalf("AllocateNetwork again with the returned options (new leader): %v", err)
	}
	if !maps.Equal(again.Options, alloc.Options) {
		t.Fatalf("AllocateNetwork again returned %v, first %v: a new leader would change the network", again.Options, alloc.Options)
	}

	for _, n := range c.nodes {
		err := n.plugin.API.CreateNetwork(testbed.CreateNetworkRequest(c.netID, alloc.Options, poolV4, gwV4, poolV6, gwV6))
		if err != nil {
			t.Fatalf("%s CreateNetwork: %v", n.host.Name, err)
		}
	}

	for i, n := range c.nodes {
		resp, err := n.plugin.API.CreateEndpoint(&api.CreateEndpointRequest{
			NetworkID: c.netID, EndpointID: n.epID,
			Interface: &api.EndpointInterface{Address: n.addrs[0].String(), AddressIPv6: n.addrs[1].String()},
		})
		if err != nil {
			t.Fatalf("%s CreateEndpoint: %v", n.host.Name, err)
		}
		if resp.Interface == nil || resp.Interface.MacAddress == "" {
			t.Fatalf("%s CreateEndpoint without MAC: response %+v, want the MAC the plugin assigned", n.host.Name, resp)
		}
		mac, err := hwaddr.Parse(resp.Interface.MacAddress)
		if err != nil || mac.IsZero() || mac[0]&1 != 0 {
			t.Fatalf("%s CreateEndpoint assigned MAC %q: want a unicast MAC (%v)", n.host.Name, resp.Interface.MacAddress, err)
		}
		if resp.Interface.Address != "" || resp.Interface.AddressIPv6 != "" {
			t.Fatalf("%s CreateEndpoint response %+v repeats addresses dockerd supplied (dockerd rejects that)", n.host.Name, *resp.Interface)
		}
		n.mac = mac.String()

		if n.ctr, err = n.host.NewContainer(fmt.Sprintf("c%d", i+1)); err != nil {
			t.Fatal(err)
		}
		n.join, err = n.plugin.API.Join(&api.JoinRequest{NetworkID: c.netID, EndpointID: n.epID, SandboxKey: n.ctr.SandboxKey()})
		if err != nil {
			t.Fatalf("%s Join: %v", n.host.Name, err)
		}
		if n.join.InterfaceName.SrcName == "" || n.join.InterfaceName.DstPrefix != "eth" {
			t.Fatalf("%s Join response %+v: want an interface name and DstPrefix eth", n.host.Name, *n.join)
		}
		if err := n.ctr.Attach(n.join, n.mac, n.addrs...); err != nil {
			t.Fatalf("%s: %v", n.host.Name, err)
		}
	}

	for _, n := range c.nodes {
		for _, o := range c.nodes {
			if o != n {
				if err := n.plugin.Admin.AddPeer(c.netID, o.peer()); err != nil {
					t.Fatalf("%s AddPeer(%s): %v", n.host.Name, o.ctr.Name, err)
				}
			}
		}
	}
	return c
}

// remotes returns the peers n should know: every other node's endpoint.
func (c *cluster) remotes(n *node) []peerdb.Peer {
	var out []peerdb.Peer
	for _, o := range c.nodes {
		if o != n {
			out = append(out, o.peer())
		}
	}
	return out
}

type neighEntry = testbed.Neigh
type fdbEntry = testbed.FDB

func wantEntries(peers []peerdb.Peer) ([]neighEntry, []fdbEntry) {
	neighs, fdbs := []neighEntry{}, []fdbEntry{}
	for _, p := range peers {
		for _, ip := range p.IPs {
			neighs = append(neighs, neighEntry{IP: ip.String(), MAC: p.MAC.String()})
		}
		fdbs = append(fdbs, fdbEntry{MAC: p.MAC.String(), VTEP: p.VTEP.String()})
	}
	return testbed.SortNeigh(neighs), testbed.SortFDB(fdbs)
}

func reportedNeigh(ks []kernel.Neighbor) []neighEntry {
	out := []neighEntry{}
	for _, n := range ks {
		out = append(out, neighEntry{IP: n.IP.String(), MAC: n.MAC.String()})
	}
	return testbed.SortNeigh(out)
}

func reportedFDB(ks []kernel.FDBEntry) []fdbEntry {
	out := []fdbEntry{}
	for _, e := range ks {
		out = append(out, fdbEntry{MAC: e.MAC.String(), VTEP: e.VTEP.String()})
	}
	return testbed.SortFDB(out)
}

// checkState checks every plugin's admin view of the network, and the
// kernel entries in its sandbox read independently, against the peers it
// was given (want, by node; nil means the other nodes' endpoints).
func (c *cluster) checkState(t *testing.T, want map[*node][]peerdb.Peer) {
	t.Helper()
	fam := c.topo.Family
	for _, n := range c.nodes {
		peers, ok := want[n]
		if !ok {
			peers = c.remotes(n)
		}
		st, err := n.plugin.Network(c.netID)
		if err != nil {
			t.Fatalf("%s: %v", n.host.Name, err)
		}
		if st.VNI != c.vni {
			t.Errorf("%s: network VNI %d, want %d (allocated by the leader)", n.host.Name, st.VNI, c.vni)
		}
		if !slices.Equal(st.Subnets, []netip.Prefix{poolV4, poolV6}) {
			t.Errorf("%s: subnets %v, want %v", n.host.Name, st.Subnets, []netip.Prefix{poolV4, poolV6})
		}
		if limit := underlayMTU - vxlanOverhead[fam]; st.MTU <= 0 || st.MTU > limit {
			t.Errorf("%s: overlay MTU %d, want 1..%d for a %v underlay of MTU %d", n.host.Name, st.MTU, limit, fam, underlayMTU)
		}
		if len(st.Endpoints) != 1 || st.Endpoints[0].ID != n.epID || st.Endpoints[0].MAC.String() != n.mac ||
			!st.Endpoints[0].Joined || st.Endpoints[0].HostVeth != n.join.InterfaceName.SrcName {
			t.Errorf("%s: endpoints %+v, want only %s joined with MAC %s and host veth %s", n.host.Name, st.Endpoints, n.epID, n.mac, n.join.InterfaceName.SrcName)
		}
		var gotRemote []peerdb.Peer
		for _, p := range st.Peers {
			if !p.Local {
				gotRemote = append(gotRemote, p)
			}
		}
		sortPeers := func(ps []peerdb.Peer) []string {
			var s []string
			for _, p := range ps {
				s = append(s, fmt.Sprintf("%s %v %s %s", p.EndpointID, p.IPs, p.MAC, p.VTEP))
			}
			slices.Sort(s)
			return s
		}
		if g, w := sortPeers(gotRemote), sortPeers(peers); !slices.Equal(g, w) {
			t.Errorf("%s: remote peers\n got %q\nwant %q", n.host.Name, g, w)
		}
		if st.Sandbox == "" || st.Kernel == nil {
			t.Fatalf("%s: network has no sandbox or kernel view while an endpoint is joined: %+v", n.host.Name, st)
		}
		if st.Kernel.Error != "" {
			t.Errorf("%s: kernel view error: %s", n.host.Name, st.Kernel.Error)
		}
		wn, wf := wantEntries(peers)
		if g := reportedNeigh(st.Kernel.Neighbors); !slices.Equal(g, wn) {
			t.Errorf("%s: admin API kernel neighbours\n got %v\nwant %v", n.host.Name, g, wn)
		}
		if g := reportedFDB(st.Kernel.FDB); !slices.Equal(g, wf) {
			t.Errorf("%s: admin API kernel FDB\n got %v\nwant %v", n.host.Name, g, wf)
		}
		kn, kf, err := n.plugin.SandboxEntries(st.Sandbox)
		if err != nil {
			t.Fatalf("%s: reading sandbox %s: %v", n.host.Name, st.Sandbox, err)
		}
		t.Logf("%s: vxlan0 in sandbox %s: neighbours %v, FDB %v", n.host.Name, st.Sandbox, kn, kf)
		if !slices.Equal(kn, wn) {
			t.Errorf("%s: vxlan0 neighbours (ip neigh)\n got %v\nwant %v", n.host.Name, kn, wn)
		}
		if !slices.Equal(kf, wf) {
			t.Errorf("%s: vxlan0 FDB (bridge fdb)\n got %v\nwant %v", n.host.Name, kf, wf)
		}
		// The container's interface carries the network's MTU.
		links, err := n.ctr.Links()
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(links, func(l testbed.Link) bool { return l.Name == "eth0" })
		if i < 0 || links[i].MTU != st.MTU || links[i].Address != n.mac {
			t.Errorf("%s: container links %+v: want eth0 with MTU %d and MAC %s", n.host.Name, links, st.MTU, n.mac)
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
	for i, n := range c.nodes {
		rx, _, err := n.host.PortBytes()
		if err != nil {
			t.Fatal(err)
		}
		before[i] = rx
	}
	for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		for _, a := range c.nodes {
			for _, b := range c.nodes {
				if a == b {
					continue
				}
				dst, _ := b.ctr.Addr(fam)
				if err := a.ctr.PingUntil(dst, firstPing); err != nil {
					t.Fatalf("overlay %v: %s -> %s: %v", fam, a.ctr.Name, b.ctr.Name, err)
				}
				// Once resolved, every ping must work.
				for range 3 {
					if err := a.ctr.Ping(dst, 2*time.Second); err != nil {
						t.Fatalf("overlay %v: %s -> %s after the first answer: %v", fam, a.ctr.Name, b.ctr.Name, err)
					}
				}
			}
		}
		for _, b := range c.nodes {
			dst, _ := b.ctr.Addr(fam)
			echo, err := b.ctr.StartEcho(netip.AddrPortFrom(dst, echoPort))
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range c.nodes {
				if a != b {
					if err := a.ctr.TCPExchange(echo.Addr, tcpSize, tcpTimeout); err != nil {
						t.Fatalf("overlay %v: %v", fam, err)
					}
				}
			}
			if err := echo.Close(); err != nil {
				t.Fatalf("echo server in %s: %v", b.ctr.Name, err)
			}
		}
		t.Logf("overlay %v: ICMP and TCP (%d KiB each way) between all %d containers", fam, tcpSize>>10, len(c.nodes))
	}
	// Each host sent, per family, tcpSize to every other host and echoed as
	// much back: VXLAN adds to that, never takes away.
	want := uint64(2 * 2 * tcpSize * (len(c.nodes) - 1))
	for i, n := range c.nodes {
		rx, _, err := n.host.PortBytes()
		if err != nil {
			t.Fatal(err)
		}
		if rx-before[i] < want {
			t.Errorf("%s sent %d bytes onto the underlay during the exchanges, want at least %d", n.host.Name, rx-before[i], want)
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
		if links, err := n.ctr.Links(); err == nil && len(links) > 1 {
			if err := n.ctr.Detach(); err != nil {
				t.Fatalf("%s: %v", n.host.Name, err)
			}
		}
		if err := n.plugin.API.Leave(&api.LeaveRequest{NetworkID: c.netID, EndpointID: n.epID}); err != nil {
			t.Fatalf("%s Leave: %v", n.host.Name, err)
		}
		if err := n.plugin.API.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: c.netID, EndpointID: n.epID}); err != nil {
			t.Fatalf("%s DeleteEndpoint: %v", n.host.Name, err)
		}
		if err := n.plugin.API.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: c.netID}); err != nil {
			t.Fatalf("%s DeleteNetwork: %v", n.host.Name, err)
		}
	}
	leader := c.nodes[0]
	// While the network holds its VNI, no other network may take it...
	other := testbed.SwarmID()
	taken := map[string]string{"vxlanid_list": strconv.FormatUint(uint64(c.vni), 10)}
	if _, err := leader.plugin.API.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: other, Options: taken}); err == nil {
		t.Errorf("AllocateNetwork of another network with VNI %d in use succeeded", c.vni)
		_ = leader.plugin.API.FreeNetwork(&api.FreeNetworkRequest{NetworkID: other})
	}
	if err := leader.plugin.API.FreeNetwork(&api.FreeNetworkRequest{NetworkID: c.netID}); err != nil {
		t.Fatalf("FreeNetwork: %v", err)
	}
	// ...and after FreeNetwork it is free again.
	if _, err := leader.plugin.API.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: other, Options: taken}); err != nil {
		t.Errorf("VNI %d not released by FreeNetwork: %v", c.vni, err)
	} else if err := leader.plugin.API.FreeNetwork(&api.FreeNetworkRequest{NetworkID: other}); err != nil {
		t.Errorf("FreeNetwork: %v", err)
	}

	for _, n := range c.nodes {
		nets, err := n.plugin.Admin.Networks()
		if err != nil {
			t.Fatalf("%s: %v", n.host.Name, err)
		}
		if len(nets) != 0 {
			t.Errorf("%s: plugin still lists networks after DeleteNetwork: %+v", n.host.Name, nets)
		}
		if m, err := n.plugin.Mounts(); err != nil || len(m) != 0 {
			t.Errorf("%s: mounts left under %s in the plugin's mount namespace: %v %v", n.host.Name, n.plugin.SandboxDir, m, err)
		}
		if f, err := n.plugin.SandboxFiles(); err != nil || len(f) != 0 {
			t.Errorf("%s: files left in %s: %v %v", n.host.Name, n.plugin.SandboxDir, f, err)
		}
		if extra, err := n.host.ExtraLinks(); err != nil || len(extra) != 0 {
			t.Errorf("%s: devices left in the host namespace: %v %v", n.host.Name, extra, err)
		}
		if links, err := n.ctr.Links(); err != nil || len(links) != 1 {
			t.Errorf("%s: container %s has %v %v, want only lo", n.host.Name, n.ctr.Name, links, err)
		}
	}
	c.stopPlugins(t)
}

func (c *cluster) stopPlugins(t *testing.T) {
	t.Helper()
	for _, n := range c.nodes {
		if err := n.plugin.Stop(0); err != nil {
			t.Errorf("%s: stop plugin: %v (contract: exit 0 on SIGTERM)", n.host.Name, err)
		}
	}
}

func runTwoHosts(t *testing.T, fam testbed.Family) {
	requireTestbed(t)
	c := setup(t, fam, 2)
	c.checkState(t, nil)
	c.checkTraffic(t)
	c.teardown(t)
}

// TestTwoHostsIPv4Underlay: two hosts on an IPv4 underlay carry IPv4 and
// IPv6 container traffic over VXLAN.
func TestTwoHostsIPv4Underlay(t *testing.T) { runTwoHosts(t, testbed.IPv4) }

// TestTwoHostsIPv6Underlay: the same over an IPv6 underlay.
func TestTwoHostsIPv6Underlay(t *testing.T) { runTwoHosts(t, testbed.IPv6) }

// TestPeerDeleteStopsTraffic: deleting a peer through the admin API removes
// its kernel entries and cuts traffic to it; adding it back restores both.
func TestPeerDeleteStopsTraffic(t *testing.T) {
	requireTestbed(t)
	c := setup(t, testbed.IPv4, 2)
	n1, n2 := c.nodes[0], c.nodes[1]
	c.checkState(t, nil)
	// Traffic flows first, so that a failure below is due to the delete,
	// with the containers' neighbour caches warm (c1 keeps sending to c2's
	// MAC: only the plugin's entries can stop it).
	for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		for _, p := range [][2]*node{{n1, n2}, {n2, n1}} {
			dst, _ := p[1].ctr.Addr(fam)
			if err := p[0].ctr.PingUntil(dst, firstPing); err != nil {
				t.Fatalf("before delete, %v: %v", fam, err)
			}
		}
	}

	if err := n1.plugin.Admin.DeletePeer(c.netID, n2.epID); err != nil {
		t.Fatalf("h1 DeletePeer: %v", err)
	}
	// Deletes may repeat.
	if err := n1.plugin.Admin.DeletePeer(c.netID, n2.epID); err != nil {
		t.Fatalf("h1 DeletePeer again: %v", err)
	}
	c.checkState(t, map[*node][]peerdb.Peer{n1: nil})
	for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		d2, _ := n2.ctr.Addr(fam)
		d1, _ := n1.ctr.Addr(fam)
		if err := n1.ctr.PingFails(d2, 2); err != nil {
			t.Errorf("after h1 deleted c2's peer, %v: %v", fam, err)
		}
		// c1 still receives c2's requests, but its replies have no way back.
		if err := n2.ctr.PingFails(d1, 2); err != nil {
			t.Errorf("after h1 deleted c2's peer, %v: %v", fam, err)
		}
	}

	if err := n2.plugin.Admin.DeletePeer(c.netID, n1.epID); err != nil {
		t.Fatalf("h2 DeletePeer: %v", err)
	}
	c.checkState(t, map[*node][]peerdb.Peer{n1: nil, n2: nil})

	// Restore: the same peers bring traffic back.
	if err := n1.plugin.Admin.AddPeer(c.netID, n2.peer()); err != nil {
		t.Fatal(err)
	}
	if err := n2.plugin.Admin.AddPeer(c.netID, n1.peer()); err != nil {
		t.Fatal(err)
	}
	c.checkState(t, nil)
	c.checkTraffic(t)
	c.teardown(t)
}

// TestRestartResumesState: SIGTERM while containers are joined exits 0,
// and plugins started again on the same state know the network and its
// endpoints, so Docker's later calls for the old containers succeed and
// tear everything down. Here each plugin runs in a private mount namespace
// (`ip netns exec`), so its sandbox mounts die with it and the endpoints
// come back unjoined. A managed plugin's sandboxes sit on a host mount and
// survive (scripts/e2e-docker.sh checks that), and the driver's tests cover
// adopting a surviving sandbox.
func TestRestartResumesState(t *testing.T) {
	requireTestbed(t)
	c := setup(t, testbed.IPv4, 2)
	n1, n2 := c.nodes[0], c.nodes[1]
	d2, _ := n2.ctr.Addr(testbed.IPv4)
	if err := n1.ctr.PingUntil(d2, firstPing); err != nil {
		t.Fatal(err)
	}
	c.stopPlugins(t)
	for _, n := range c.nodes {
		p, err := n.host.StartPlugin(adminFedPlugin)
		if err != nil {
			t.Fatalf("%s: restart on the same state: %v", n.host.Name, err)
		}
		n.plugin = p
		nets, err := p.Admin.Networks()
		if err != nil || len(nets) != 1 || nets[0].ID != c.netID || nets[0].Sandbox != "" ||
			len(nets[0].Endpoints) != 1 || nets[0].Endpoints[0].Joined {
			t.Fatalf("%s: restarted plugin lists %+v %v, want the network with its endpoint, unjoined (its sandbox is gone)", n.host.Name, nets, err)
		}
	}
	// The lost sandbox takes the container's interface with it: the veth
	// pair goes when the kernel frees the namespace, which it does in the
	// background, so the interface may still be there for a moment.
	for _, n := range c.nodes {
		deadline := time.Now().Add(10 * time.Second)
		for {
			links, err := n.ctr.Links()
			if err == nil && len(links) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the container still has %v (%v) 10s after its sandbox was lost", n.host.Name, links, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	c.teardown(t)
}
