package testbed

import (
	"fmt"
	"net/netip"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// Endpoint is an endpoint a plugin created and joined, as dockerd knows it.
type Endpoint struct {
	ID        string
	NetworkID string
	Host      *Host
	// MAC is the one the plugin chose, in canonical form.
	MAC   string
	Addrs []netip.Prefix
	Join  *api.JoinResponse
	// Ctr is the container it was attached to; nil for an endpoint joined
	// with a sandbox key but never moved into a container (churn).
	Ctr *Container
}

func (e *Endpoint) String() string {
	name := e.ID[:min(12, len(e.ID))]
	if e.Ctr != nil {
		name = e.Ctr.Name
	}
	return name + "@" + e.Host.Name
}

// IPs are the endpoint's addresses without prefix length.
func (e *Endpoint) IPs() []netip.Addr {
	out := make([]netip.Addr, len(e.Addrs))
	for i, a := range e.Addrs {
		out[i] = a.Addr()
	}
	return out
}

// Addr is the endpoint's address of the family, if it has one.
func (e *Endpoint) Addr(f Family) (netip.Addr, bool) { return addrOf(e.Addrs, f) }

// addrOf is the address of the family among addrs, if there is one.
func addrOf(addrs []netip.Prefix, f Family) (netip.Addr, bool) {
	for _, a := range addrs {
		if a.Addr().Is6() == (f == IPv6) {
			return a.Addr(), true
		}
	}
	return netip.Addr{}, false
}

// Peer is the endpoint as the other hosts' peer tables hold it.
func (e *Endpoint) Peer() peerdb.Peer {
	mac, err := hwaddr.Parse(e.MAC)
	if err != nil {
		panic(err) // CreateJoin parsed it
	}
	return peerdb.Peer{EndpointID: e.ID, IPs: e.IPs(), MAC: mac, VTEP: e.Host.Underlay}
}

// CreateJoin does what dockerd does for a container whose namespace is
// sandboxKey: CreateEndpoint with the addresses swarm's IPAM chose (an
// IPv4 and an IPv6 prefix at most), then Join. The answers are checked as
// the suites rely on them: a unicast MAC chosen by the plugin, the
// addresses not repeated (dockerd refuses that), an interface to move
// (SrcName) named eth<n> (DstPrefix "eth").
func (p *Plugin) CreateJoin(networkID, sandboxKey string, addrs ...netip.Prefix) (*Endpoint, error) {
	return p.CreateJoinMAC(networkID, sandboxKey, "", addrs...)
}

// CreateJoinMAC is CreateJoin with the MAC dockerd passes for `docker run
// --mac-address` ("": none, the plugin assigns one).
func (p *Plugin) CreateJoinMAC(networkID, sandboxKey, mac string, addrs ...netip.Prefix) (*Endpoint, error) {
	iface := &api.EndpointInterface{MacAddress: mac}
	for _, a := range addrs {
		if a.Addr().Is6() {
			iface.AddressIPv6 = a.String()
		} else {
			iface.Address = a.String()
		}
	}
	ep := &Endpoint{ID: RandomHex(64), NetworkID: networkID, Host: p.Host, Addrs: addrs}
	resp, err := p.API.CreateEndpoint(&api.CreateEndpointRequest{NetworkID: networkID, EndpointID: ep.ID, Interface: iface})
	if err != nil {
		return nil, fmt.Errorf("%s CreateEndpoint: %w", p.Host.Name, err)
	}
	switch {
	case mac != "":
		// dockerd refuses an answer that changes a MAC it gave.
		if resp.Interface != nil {
			return nil, fmt.Errorf("%s CreateEndpoint answered %+v to a request with MAC %s: want no interface", p.Host.Name, *resp.Interface, mac)
		}
		ep.MAC = mac
	case resp.Interface == nil || resp.Interface.MacAddress == "":
		return nil, fmt.Errorf("%s CreateEndpoint answered %+v: no MAC, want the one the plugin assigned", p.Host.Name, resp)
	default:
		assigned, err := hwaddr.Parse(resp.Interface.MacAddress)
		if err != nil || assigned.IsZero() || assigned[0]&1 != 0 {
			return nil, fmt.Errorf("%s CreateEndpoint assigned MAC %q: want a unicast MAC (%v)", p.Host.Name, resp.Interface.MacAddress, err)
		}
		if resp.Interface.Address != "" || resp.Interface.AddressIPv6 != "" {
			return nil, fmt.Errorf("%s CreateEndpoint answered %+v: repeats addresses dockerd supplied (dockerd rejects that)", p.Host.Name, *resp.Interface)
		}
		ep.MAC = assigned.String()
	}
	ep.Join, err = p.API.Join(&api.JoinRequest{NetworkID: networkID, EndpointID: ep.ID, SandboxKey: sandboxKey})
	if err != nil {
		return nil, fmt.Errorf("%s Join: %w", p.Host.Name, err)
	}
	if ep.Join.InterfaceName.SrcName == "" || ep.Join.InterfaceName.DstPrefix != "eth" {
		return nil, fmt.Errorf("%s Join answered %+v: want an interface name and DstPrefix eth", p.Host.Name, *ep.Join)
	}
	return ep, nil
}
