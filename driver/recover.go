package driver

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// After a lost or unreadable state database the driver adopts the running
// sandboxes (restore.go), but the endpoints of their containers are
// strays: veths attached to containers, of endpoints it has no record of.
// Unrecovered, they would not be published, and every other host would
// drop them after the grace although the containers run. The engine still
// knows them (GET /networks/<id> lists this node's containers with their
// endpoint ids, addresses and MACs); RecoverEndpoints takes its word for
// each one the kernel confirms: the sandbox holds an attached veth named
// after the endpoint id, as Join made it.

// RecoveredEndpoint is an endpoint as the engine lists it.
type RecoveredEndpoint struct {
	ID    string
	MAC   hwaddr.MAC
	Addrs []netip.Prefix
}

// Strays lists the networks whose sandboxes hold containers of endpoints
// the driver has no record of, sorted.
func (d *Driver) Strays() []string {
	var out []string
	for _, id := range d.networkIDs() {
		n := d.lockNetwork(id)
		if n == nil {
			continue
		}
		if len(n.strays) > 0 {
			out = append(out, id)
		}
		n.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// RecoverEndpoints gives back to network nid the endpoints eps (the
// engine's list of this node's containers on it) whose veths are strays
// of its sandbox: each is stored, joined, and published if the control
// plane runs (SetControlPlane publishes it otherwise). An endpoint whose
// veth the sandbox does not hold, or that is already known, is left out;
// one that is invalid or collides with a known endpoint is refused, and
// reported. It returns the ids recovered.
func (d *Driver) RecoverEndpoints(nid string, eps []RecoveredEndpoint) ([]string, error) {
	n, err := d.mustLockNetwork(nid)
	if err != nil {
		return nil, err
	}
	defer n.mu.Unlock()
	var recovered []string
	var errs []error
	for _, r := range eps {
		veth := vethFor(r.ID, r.MAC, n.mtu)
		if _, known := n.endpoints[r.ID]; known || !n.strays[veth.SandboxName] {
			continue
		}
		ep := &endpoint{id: r.ID, mac: r.MAC, addrs: slices.Clone(r.Addrs), veth: veth, joined: true}
		if err := d.checkRecovered(n, ep); err != nil {
			errs = append(errs, fmt.Errorf("endpoint %s: %w", r.ID, err))
			continue
		}
		changes, err := n.peers.Add(peerdb.Peer{EndpointID: ep.id, IPs: ep.ips(), MAC: ep.mac, Local: true})
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: endpoint %s: %v", ErrInvalid, r.ID, err))
			continue
		}
		n.addLocal(ep)
		delete(n.strays, veth.SandboxName) // still counted in n.joined: now as this endpoint
		if err := d.apply(n, changes); err != nil {
			errs = append(errs, err) // a remote holder of its address gave way; the reconciler retries
		}
		if err := d.store.putEndpoint(n.id, ep); err != nil {
			d.log.Warn("persist endpoint", "network", n.id, "endpoint", ep.id, "err", err)
		}
		if cp := d.controlPlane(); cp != nil {
			cp.Publish(n.id, peerdb.Peer{EndpointID: ep.id, IPs: ep.ips(), MAC: ep.mac, Local: true})
		}
		d.endpointChanged(n, ep.id)
		recovered = append(recovered, ep.id)
	}
	return recovered, errors.Join(errs...)
}

// checkRecovered checks ep as CreateEndpoint checks a new one. Caller
// holds n.mu.
func (d *Driver) checkRecovered(n *network, ep *endpoint) error {
	if err := validID("endpoint", ep.id); err != nil {
		return err
	}
	if ep.mac.IsZero() || ep.mac[0]&1 != 0 {
		return fmt.Errorf("%w: MAC %s is not a unicast MAC", ErrInvalid, ep.mac)
	}
	if len(ep.addrs) == 0 {
		return fmt.Errorf("%w: no address", ErrInvalid)
	}
	if err := n.checkAddrs(ep.ips()); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if o := n.localWithMAC(ep.mac); o != nil {
		return fmt.Errorf("%w: MAC %s is held by local endpoint %s", ErrConflict, ep.mac, o.id)
	}
	for _, o := range n.endpoints {
		for _, a := range o.addrs {
			if slices.ContainsFunc(ep.addrs, func(b netip.Prefix) bool { return b.Addr() == a.Addr() }) {
				return fmt.Errorf("%w: address %s is held by local endpoint %s", ErrConflict, a.Addr(), o.id)
			}
		}
	}
	return nil
}
