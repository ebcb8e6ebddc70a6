package testbed

import (
	"cmp"
	"fmt"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"maps"
	"net/netip"
	"slices"
	"strconv"

	api "github.com/docker/go-plugins-helpers/network"
)

// NetworkSpec is a swarm network as `docker network create` asks for it
// and swarm's IPAM plans it.
type NetworkSpec struct {
	Name    string            // for messages
	Options map[string]string // --opt
	Pool4   netip.Prefix
	Gw4     string       // "addr/len"
	Pool6   netip.Prefix // invalid: IPv4 only
	Gw6     string
}

// Overlay is the suites' usual network: IPv4 and IPv6 from documentation
// ranges, the gateways at the end of each pool.
var Overlay = NetworkSpec{
	Name:  "overlay",
	Pool4: netip.MustParsePrefix("203.0.113.0/24"),
	Gw4:   "203.0.113.254/24",
	Pool6: netip.MustParsePrefix("2001:db8:1::/64"),
	Gw6:   "2001:db8:1::fffe/64",
}

// Network is a network created on every host of a Cluster.
type Network struct {
	NetworkSpec
	ID  string
	VNI uint32
	// Allocated is what AllocateNetwork answered, which every host got.
	Allocated map[string]string
}

// Flood reports whether the network was created with the flood option.
func (nw *Network) Flood() bool { return nw.has("flood") }

// Encrypted reports whether the network was created with the encrypted
// option.
func (nw *Network) Encrypted() bool { return nw.has("encrypted") }

func (nw *Network) has(opt string) bool {
	_, ok := nw.Allocated[opt]
	return ok
}

// Addrs are the addresses of slot i of the network's pools (0 is the
// pool's own address): an IPv4 prefix, and an IPv6 one if it has IPv6.
func (nw *Network) Addrs(i int) []netip.Prefix {
	out := []netip.Prefix{netip.PrefixFrom(Nth(nw.Pool4, i), nw.Pool4.Bits())}
	if nw.Pool6.IsValid() {
		out = append(out, netip.PrefixFrom(Nth(nw.Pool6, i), nw.Pool6.Bits()))
	}
	return out
}

// CreateNetwork does Docker's calls for a swarm network: AllocateNetwork on
// the leader (h1), whose answer must be the options asked for and a VNI,
// then CreateNetwork with that answer on every host.
func (c *Cluster) CreateNetwork(spec NetworkSpec) (*Network, error) {
	nw := &Network{NetworkSpec: spec, ID: SwarmID()}
	userOpts := maps.Clone(spec.Options)
	if userOpts == nil {
		userOpts = map[string]string{}
	}
	leader := c.Nodes[0]
	alloc, err := leader.Plugin.API.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: nw.ID, Options: userOpts,
		IPv4Data: []api.IPAMData{{AddressSpace: "GlobalDefault", Pool: spec.Pool4.String(), Gateway: spec.Gw4}}})
	if err != nil {
		return nil, fmt.Errorf("AllocateNetwork %s on %s: %w", spec.Name, leader.Name, err)
	}
	vni, err := strconv.ParseUint(alloc.Options["vxlanid_list"], 10, 32)
	if err != nil || vni == 0 || vni >= 1<<24 {
		return nil, fmt.Errorf("AllocateNetwork %s options %v: want a VNI in vxlanid_list", spec.Name, alloc.Options)
	}
	want := maps.Clone(userOpts)
	want["vxlanid_list"] = alloc.Options["vxlanid_list"]
	if mtu, ok := alloc.Options[driver.OptMTU]; ok && userOpts[driver.OptMTU] == "" {
		// The leader's MTU for every host, from the nodes' underlays
		// (a release before 0.2.0 adds none).
		want[driver.OptMTU] = mtu
	}
	if !maps.Equal(alloc.Options, want) {
		return nil, fmt.Errorf("AllocateNetwork %s returned options %v: want the options asked for (%v), exactly, the VNI and the MTU", spec.Name, alloc.Options, userOpts)
	}
	nw.VNI, nw.Allocated = uint32(vni), alloc.Options
	for _, n := range c.Nodes {
		req := CreateNetworkRequest(nw.ID, alloc.Options, spec.Pool4, spec.Gw4, spec.Pool6, spec.Gw6)
		if err := n.Plugin.API.CreateNetwork(req); err != nil {
			return nil, fmt.Errorf("%s CreateNetwork %s: %w", n.Name, spec.Name, err)
		}
	}
	c.Bed.Logf("network %s (%s): VNI %d, options %v", spec.Name, nw.ID, nw.VNI, nw.Allocated)
	return nw, nil
}

// Join does CreateEndpoint and Join on n for an endpoint of nw whose
// namespace is sandboxKey; the endpoint is live from then on.
func (c *Cluster) Join(n *Node, nw *Network, sandboxKey string, addrs ...netip.Prefix) (*Endpoint, error) {
	ep, err := n.Plugin.CreateJoin(nw.ID, sandboxKey, addrs...)
	if err != nil {
		return nil, err
	}
	c.record(ep)
	return ep, nil
}

// RunContainer starts a container on n attached to nw with addrs, as
// dockerd does (Plugin.RunContainer); its endpoint is live from then on.
func (c *Cluster) RunContainer(n *Node, nw *Network, name string, addrs ...netip.Prefix) (*Endpoint, error) {
	ctr, err := n.Plugin.RunContainer(nw.ID, name, addrs...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.Name, err)
	}
	c.record(ctr.Endpoint)
	return ctr.Endpoint, nil
}

// StopContainer does what dockerd does when a container stops: detach its
// interface, then Leave.
func (c *Cluster) StopContainer(ep *Endpoint) error {
	if err := ep.Ctr.Detach(); err != nil {
		return fmt.Errorf("%s: %w", ep.Host.Name, err)
	}
	return c.Leave(ep)
}

// Leave does Leave and DeleteEndpoint on the endpoint's host; the endpoint
// is no longer live from the start.
func (c *Cluster) Leave(ep *Endpoint) error {
	c.Forget(ep)
	papi := c.Node(ep.Host).Plugin.API
	if err := papi.Leave(&api.LeaveRequest{NetworkID: ep.NetworkID, EndpointID: ep.ID}); err != nil {
		return fmt.Errorf("%s Leave %s: %w", ep.Host.Name, ep, err)
	}
	if err := papi.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: ep.NetworkID, EndpointID: ep.ID}); err != nil {
		return fmt.Errorf("%s DeleteEndpoint %s: %w", ep.Host.Name, ep, err)
	}
	return nil
}

func (c *Cluster) record(ep *Endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live[ep.ID] = ep
}

// Forget stops counting ep as live without telling any plugin: for an
// endpoint whose host is gone.
func (c *Cluster) Forget(ep *Endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.live, ep.ID)
}

// Live returns the live endpoints of nw, sorted by id.
func (c *Cluster) Live(nw *Network) []*Endpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Endpoint
	for _, ep := range c.live {
		if ep.NetworkID == nw.ID {
			out = append(out, ep)
		}
	}
	slices.SortFunc(out, func(a, b *Endpoint) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Remotes is what obs should hold of nw: every live endpoint on another
// host whose plugin runs.
func (c *Cluster) Remotes(obs *Node, nw *Network) []*Endpoint {
	var out []*Endpoint
	for _, ep := range c.Live(nw) {
		if ep.Host != obs.Host && c.Node(ep.Host).Plugin.Running() {
			out = append(out, ep)
		}
	}
	return out
}
