package driver

import (
	"net/netip"

	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// ControlPlane distributes this host's endpoints to the other hosts and
// supplies theirs; the gossip cluster implements it. Remote changes reach
// the driver through AddPeer and DeletePeer.
//
// The driver calls these methods with a network's lock held, so an
// implementation's own locks sit below network.mu in the lock order, and it
// must neither block nor call back into the driver from them.
type ControlPlane interface {
	// Publish announces a local endpoint that joined networkID.
	Publish(networkID string, p peerdb.Peer)
	// Retract withdraws a local endpoint that left.
	Retract(networkID, endpointID string)
	// Snapshot returns copies of the network's current remote endpoints.
	Snapshot(networkID string) []peerdb.Peer
	// NetworkAdded says the network now exists here: its remote endpoints
	// are to be delivered (again) through AddPeer.
	NetworkAdded(networkID string)
	// NetworkRemoved says the network no longer exists here: its remote
	// endpoints are no longer wanted.
	NetworkRemoved(networkID string)
	// NodeHint passes on Docker's word that a swarm node exists at addr.
	NodeHint(addr netip.Addr)
	// ForgetNode passes on Docker's word that the node at addr left the
	// swarm: it is no longer to be re-joined.
	ForgetNode(addr netip.Addr)
	// Connected is closed once another host is reachable, so that the
	// remote endpoints arrive within about a second from then on.
	Connected() <-chan struct{}
	// Delivered reports whether the host with that VTEP address is
	// reachable and has delivered its endpoints since: an entry of its
	// VTEP that none of them wants is stale.
	Delivered(vtep netip.Addr) bool
}

// SetControlPlane connects the control plane, which may start after the
// driver serves (it needs the settled advertise address): the swarm nodes
// Docker reported, and the networks and joined endpoints that exist by
// then, are announced to it.
func (d *Driver) SetControlPlane(cp ControlPlane) {
	d.cp.Store(&cp)
	go d.settleWhenConnected(cp)
	d.mu.Lock()
	nodes := make([]netip.Addr, 0, len(d.nodes))
	for a := range d.nodes {
		nodes = append(nodes, a)
	}
	d.mu.Unlock()
	for _, a := range nodes {
		cp.NodeHint(a)
	}
	for _, id := range d.networkIDs() {
		n := d.lockNetwork(id)
		if n == nil {
			continue
		}
		cp.NetworkAdded(n.id)
		for _, ep := range n.endpoints {
			if ep.joined {
				cp.Publish(n.id, peerdb.Peer{EndpointID: ep.id, IPs: ep.ips(), MAC: ep.mac, Local: true})
			}
		}
		n.mu.Unlock()
	}
}

func (d *Driver) controlPlane() ControlPlane {
	if p := d.cp.Load(); p != nil {
		return *p
	}
	return nil
}

// syncRemotePeers makes the network's remote peers exactly snapshot, the
// control plane's current view, before a new sandbox is programmed: a delete
// still queued for delivery must not leave a stale peer behind. Caller holds
// n.mu; the sandbox is not programmed yet, so the changes need no kernel work.
func (d *Driver) syncRemotePeers(n *network, snapshot []peerdb.Peer) {
	keep := make(map[string]bool, len(snapshot))
	for _, p := range snapshot {
		if _, local := n.endpoints[p.EndpointID]; local || p.Local {
			continue
		}
		if n.localWithMAC(p.MAC) != nil {
			d.macConflicts.Add(1)
			continue // as addPeer refuses it
		}
		if _, err := n.peers.Add(p); err != nil {
			d.log.Warn("control plane supplied an invalid peer", "network", n.id, "err", err)
			continue
		}
		keep[p.EndpointID] = true
	}
	for _, p := range n.peers.Peers() {
		if !p.Local && !keep[p.EndpointID] {
			n.peers.Delete(p.EndpointID)
		}
	}
}
