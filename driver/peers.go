package driver

import (
	"errors"
	"fmt"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// errMACConflict is a remote endpoint refused for a local endpoint's MAC.
var errMACConflict = fmt.Errorf("%w: MAC conflict", ErrConflict)

// MACConflicts counts the remote endpoints refused since start because a
// local endpoint of the network holds their MAC.
func (d *Driver) MACConflicts() uint64 { return d.macConflicts.Load() }

// AddPeer records a remote endpoint of a network and programs it if the
// network has a sandbox here; otherwise it is replayed when the sandbox is
// built. p is the caller's value: the driver keeps its own copy. It is
// checked as CreateEndpoint checks a local one (validate.go); a refused
// update leaves the peer's previous value.
func (d *Driver) AddPeer(networkID string, p peerdb.Peer) error {
	return d.AddPeers(networkID, []peerdb.Peer{p})
}

// AddPeers is AddPeer for a burst of one network's remote endpoints, as
// the control plane delivers them: one lock and one kernel batch for all.
// A refused peer is reported and the others are added.
func (d *Driver) AddPeers(networkID string, peers []peerdb.Peer) error {
	n, err := d.mustLockNetwork(networkID)
	if err != nil {
		return err
	}
	defer n.mu.Unlock()
	return d.addPeers(n, peers)
}

// addPeers checks and records peers in n and programs them in one batch.
// Caller holds n.mu.
func (d *Driver) addPeers(n *network, peers []peerdb.Peer) error {
	var errs []error
	var changes []peerdb.Change
	added := peers[:0:0]
	for _, p := range peers {
		c, err := n.addPeer(p)
		if err != nil {
			if errors.Is(err, errMACConflict) {
				d.macConflicts.Add(1)
			}
			errs = append(errs, err)
			continue
		}
		changes = append(changes, c...)
		added = append(added, p)
	}
	errs = append(errs, d.apply(n, changes))
	for _, p := range added {
		d.endpointChanged(n, p.EndpointID)
	}
	return errors.Join(errs...)
}

// addPeer checks p and records it in the peer db. Caller holds n.mu.
func (n *network) addPeer(p peerdb.Peer) ([]peerdb.Change, error) {
	if p.Local {
		return nil, fmt.Errorf("%w: peer %s: only remote peers can be added", ErrInvalid, p.EndpointID)
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if _, local := n.endpoints[p.EndpointID]; local {
		return nil, fmt.Errorf("%w: endpoint %s is local to this host", ErrConflict, p.EndpointID)
	}
	// Never programmed over a local endpoint's MAC: this host's bridge
	// would send the local container's frames away (retakeMAC adds it
	// once the local endpoint is gone).
	if o := n.localWithMAC(p.MAC); o != nil {
		return nil, fmt.Errorf("%w: peer %s: MAC %s is held by local endpoint %s", errMACConflict, p.EndpointID, p.MAC, o.id)
	}
	// The same addresses as CreateEndpoint's. An IP a local endpoint holds
	// is not refused: the peer db lets the local one win it (see
	// CreateEndpoint).
	if err := n.checkAddrs(p.IPs); err != nil {
		return nil, fmt.Errorf("%w: peer %s: %v", ErrInvalid, p.EndpointID, err)
	}
	changes, err := n.peers.Add(p)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return changes, nil
}

// localWithMAC is the local endpoint holding mac, nil if none. Caller
// holds n.mu. An index, not a walk: the control plane asks it for every
// remote peer.
func (n *network) localWithMAC(mac hwaddr.MAC) *endpoint {
	return n.byMAC[mac]
}

// addLocal records ep as a local endpoint of n. Caller holds n.mu and has
// checked that no other local endpoint holds its id or MAC.
func (n *network) addLocal(ep *endpoint) {
	n.endpoints[ep.id] = ep
	n.byMAC[ep.mac] = ep
}

// dropLocal forgets local endpoint ep. Caller holds n.mu.
func (n *network) dropLocal(ep *endpoint) {
	delete(n.endpoints, ep.id)
	if n.byMAC[ep.mac] == ep {
		delete(n.byMAC, ep.mac)
	}
}

// DeletePeer removes a remote endpoint. Removing one that is not there is
// not an error: deletes may repeat.
func (d *Driver) DeletePeer(networkID, endpointID string) error {
	if err := validID("endpoint", endpointID); err != nil {
		return err
	}
	n, err := d.mustLockNetwork(networkID)
	if err != nil {
		return err
	}
	defer n.mu.Unlock()
	if _, local := n.endpoints[endpointID]; local {
		return fmt.Errorf("%w: endpoint %s is local to this host", ErrConflict, endpointID)
	}
	_, known := n.peers.Get(endpointID)
	err = d.apply(n, n.peers.Delete(endpointID))
	if known {
		d.endpointChanged(n, endpointID)
	}
	return err
}
