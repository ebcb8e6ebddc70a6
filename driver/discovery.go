package driver

import (
	"fmt"
	"net/netip"

	api "github.com/docker/go-plugins-helpers/network"
)

// discoveryNode is libnetwork's driverapi.NodeDiscoveryType.
const discoveryNode = 1

// nodeDiscovery is the data of a node discovery notification.
type nodeDiscovery struct {
	Address netip.Addr
	Self    bool
}

func parseNodeDiscovery(n *api.DiscoveryNotification) (nodeDiscovery, error) {
	m, ok := n.DiscoveryData.(map[string]any)
	if !ok {
		return nodeDiscovery{}, fmt.Errorf("%w: node discovery data: want an object, got %T", ErrInvalid, n.DiscoveryData)
	}
	s, _ := m["Address"].(string)
	addr, err := netip.ParseAddr(s)
	if err != nil {
		return nodeDiscovery{}, fmt.Errorf("%w: node discovery Address %q: %v", ErrInvalid, s, err)
	}
	self, _ := m["Self"].(bool)
	return nodeDiscovery{Address: addr.Unmap(), Self: self}, nil
}

// DiscoverNew learns this node's address from Docker (Self), for
// AdvertiseAddr. Other discovery types (swarm's encryption keys) never reach a
// plugin and are ignored.
func (d *Driver) DiscoverNew(n *api.DiscoveryNotification) error {
	if n.DiscoveryType != discoveryNode {
		return nil
	}
	nd, err := parseNodeDiscovery(n)
	if err != nil {
		return err
	}
	if nd.Self {
		d.mu.Lock()
		first := !d.discovered.IsValid()
		d.discovered = nd.Address
		vtep := d.vtep
		if first {
			close(d.selfKnown)
		}
		d.mu.Unlock()
		if vtep.IsValid() && vtep != nd.Address {
			d.log.Warn("advertise address differs from Docker's", "why", "Docker reports another address for this node than the plugin advertises", "hint", "set --advertise-addr to the swarm's data address",
				"docker", nd.Address, "advertised", vtep)
		}
		return nil
	}
	d.log.Debug("docker reports a swarm node", "addr", nd.Address)
	// Kept for a control plane that starts later (SetControlPlane replays
	// them): Docker says this once, at start-up, which may be before it.
	d.mu.Lock()
	d.nodes[nd.Address] = true
	d.mu.Unlock()
	if cp := d.controlPlane(); cp != nil {
		cp.NodeHint(nd.Address)
	}
	return nil
}

// DiscoverDelete forgets a node Docker removed from the swarm, and tells
// the control plane, which would otherwise keep re-joining its address.
// (Its endpoints go by gossip: the control plane sees the member leave.)
func (d *Driver) DiscoverDelete(n *api.DiscoveryNotification) error {
	if n.DiscoveryType != discoveryNode {
		return nil
	}
	nd, err := parseNodeDiscovery(n)
	if err != nil {
		return err
	}
	d.mu.Lock()
	delete(d.nodes, nd.Address)
	d.mu.Unlock()
	if cp := d.controlPlane(); cp != nil {
		cp.ForgetNode(nd.Address)
	}
	return nil
}

// ProgramExternalConnectivity: overlay networks give no external
// connectivity of their own (Docker's gateway bridge does that).
func (d *Driver) ProgramExternalConnectivity(req *api.ProgramExternalConnectivityRequest) error {
	n, _, err := d.lockEndpoint(req.NetworkID, req.EndpointID)
	if err != nil {
		return err
	}
	n.mu.Unlock()
	return nil
}

// RevokeExternalConnectivity: see ProgramExternalConnectivity.
func (d *Driver) RevokeExternalConnectivity(req *api.RevokeExternalConnectivityRequest) error {
	n, _, err := d.lockEndpoint(req.NetworkID, req.EndpointID)
	if err != nil {
		return err
	}
	n.mu.Unlock()
	return nil
}
