package driver

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// What a previous run left in the kernel is removed only when it is
// provably a leftover: a sandbox whose network the state database knows
// and says has no joined endpoint, and in which no container is attached
// (no veth whose other end has left the host namespace), or a mount point
// whose namespace is gone. Everything else is kept:
//
//   - a known network's sandbox with joined endpoints, or with containers
//     attached whatever the database says, is adopted, and the endpoints
//     whose veth is attached come back joined;
//   - a sandbox of a network the database does not know (its record lost
//     or unreadable) is adopted from the kernel: id from the sandbox's
//     name, VNI and port from its VXLAN device, MTU from its bridge. Its
//     subnets and options are unknown until Docker creates the network
//     again (CreateNetwork merges); its containers keep their traffic, and
//     Docker's Leave and DeleteEndpoint for endpoints the plugin cannot
//     know succeed, the Leave removing that container's veth;
//   - a sandbox that cannot be read is left alone, with an error logged.
//
// Host-side veth ends Docker never moved into a container carry none and
// go (kernel.RemoveLeftovers).

// restore rebuilds the networks of the previous run, from the state
// database and the kernel, and returns the sandboxes to keep. No other
// goroutine sees the driver yet.
func (d *Driver) restore(expectEncryption bool) (map[string]bool, error) {
	nets, eps, partial, errs := d.store.load()
	for _, err := range errs {
		d.log.Error("unreadable state record", "why", "it is left as it is and not used; a network it described is adopted from its sandbox if one runs",
			"err", err)
	}
	present, err := d.kernel.Sandboxes()
	if err != nil {
		return nil, err
	}
	keep := map[string]bool{}
	// inspect reads a sandbox; nil for one that is provably gone, and
	// keep[name] for one that cannot be read.
	inspect := func(name string) *kernel.SandboxInfo {
		info, err := d.kernel.Inspect(name)
		switch {
		case err == nil:
			return &info
		case errors.Is(err, kernel.ErrNotFound):
			d.log.Info("sandbox of the previous run is gone", "sandbox", name, "err", err)
		default:
			d.log.Error("previous sandbox unreadable", "why", "leaving it as it is", "sandbox", name, "err", err)
			keep[name] = true
		}
		return nil
	}
	isPresent := map[string]bool{}
	for _, name := range present {
		isPresent[name] = true
	}
	known := map[string]bool{}
	for _, r := range nets {
		known[r.ID] = true
		n := newNetwork(r.ID, r.VNI, netOptions{vni: r.VNI, mtu: r.MTUOption, encrypted: r.Encrypted, flood: r.Flood}, r.Subnets, r.Gateways)
		dbJoined := false
		for _, e := range eps[r.ID] {
			dbJoined = dbJoined || e.Joined
		}
		var info *kernel.SandboxInfo
		if isPresent[r.ID] {
			info = inspect(r.ID)
		}
		adopt := info != nil && (dbJoined || info.Attached() > 0)
		if adopt {
			keep[r.ID] = true
			n.sandbox, n.mtu, n.adopted = r.ID, r.SandboxMTU, true
			if n.mtu == 0 {
				n.mtu = info.Spec.MTU
			}
		}
		n.partial = partial[r.ID]
		d.restoreEndpoints(n, eps[r.ID], info, adopt)
		if adopt && r.SandboxMTU == 0 || !adopt && r.SandboxMTU != 0 {
			if err := d.store.putNetwork(n); err != nil {
				d.log.Warn("persist network", "err", err)
			}
		}
		d.networks[n.id] = n
		d.log.Info("restored network", "network", n.id, "vni", n.vni, "endpoints", len(n.endpoints), "sandbox adopted", adopt)
	}
	for _, name := range present {
		if known[name] || keep[name] {
			continue
		}
		info := inspect(name)
		if info == nil {
			continue
		}
		keep[name] = true
		if info.Spec.VNI == 0 || info.Spec.MTU == 0 {
			// Without its devices nothing says which network it was.
			d.log.Error("unknown sandbox broken", "why", "a running sandbox the state database does not know has lost its bridge or VXLAN device; leaving it as it is",
				"sandbox", name, "containers", info.Attached())
			continue
		}
		// Options unknown: encrypted until the encryption side says
		// otherwise (SetEncryption), so that nothing is sent in clear.
		n := newNetwork(name, info.Spec.VNI, netOptions{vni: info.Spec.VNI, encrypted: expectEncryption}, nil, nil)
		n.unrecorded, n.partial, n.adopted = true, true, true
		n.sandbox, n.mtu = name, info.Spec.MTU
		d.restoreEndpoints(n, eps[name], info, true)
		d.networks[n.id] = n
		d.log.Warn("unknown sandbox adopted",
			"why", "a running sandbox the state database does not know: its containers keep their traffic; its subnets and options are unknown until Docker creates the network again",
			"network", n.id, "vni", n.vni, "port", info.Spec.Port, "mtu", n.mtu, "containers", info.Attached())
		if d.port != 0 && info.Spec.Port != d.port { // New, before anything runs: d.port is the one given
			d.log.Warn("adopted sandbox port differs", "network", n.id, "port", info.Spec.Port, "this run", d.port)
		}
	}
	return keep, nil
}

// recoverVNIs records the VNI of every restored or adopted network in the
// VNI table, should this host be or become the leader: a table lost with
// the state database must not hand them out again.
func (d *Driver) recoverVNIs() {
	for id, n := range d.networks {
		if err := d.vnis.Recover(id, n.vni); err != nil {
			d.log.Error("running VNI conflicts", "why", "the VNI of a network running here is held by another in the VNI table", "network", id, "vni", n.vni, "err", err)
		}
	}
}

// newNetwork returns a network with nothing joined, not in the table.
func newNetwork(id string, vni uint32, opts netOptions, subnets []netip.Prefix, gateways []netip.Addr) *network {
	return &network{id: id, vni: vni, opts: opts, subnets: subnets, gateways: gateways, endpoints: map[string]*endpoint{},
		byMAC: map[hwaddr.MAC]*endpoint{}, planner: newPlanner(), kick: make(chan struct{}, 1), gone: make(chan struct{})}
}

// restoreEndpoints brings back the stored endpoints of n: joined if the
// sandbox is adopted and either the database says so or the endpoint's
// veth is attached to a container. Attached veths of no stored endpoint
// are strays: they count as joined, so that the sandbox stays while they
// do. Caller owns n.
func (d *Driver) restoreEndpoints(n *network, recs []epRecord, info *kernel.SandboxInfo, adopted bool) {
	attached := map[string]bool{}
	if info != nil && adopted {
		for _, v := range info.Veths {
			attached[v.Name] = v.Attached
		}
	}
	for _, e := range recs {
		veth := e.Veth
		if veth.SandboxName == "" {
			veth = vethFor(e.ID, e.MAC, n.mtu)
		}
		ep := &endpoint{id: e.ID, mac: e.MAC, addrs: e.Addrs, veth: veth,
			joined: adopted && (e.Joined || attached[veth.SandboxName])}
		delete(attached, veth.SandboxName)
		if ep.joined && validSandboxKey(e.SandboxKey) == nil {
			// The container may hold the previous run's VIPs.
			ep.sandboxKey, ep.balanced = e.SandboxKey, balancedByEarlierRun
		}
		n.addLocal(ep)
		if ep.joined {
			n.joined++
			if _, err := n.peers.Add(peerdb.Peer{EndpointID: ep.id, IPs: ep.ips(), MAC: ep.mac, Local: true}); err != nil {
				d.log.Error("stored endpoint rejected by the peer db", "endpoint", ep.id, "err", err)
			}
		}
		if ep.joined != e.Joined {
			if err := d.store.putEndpoint(n.id, ep); err != nil {
				d.log.Warn("persist endpoint", "err", err)
			}
		}
	}
	for name, isAttached := range attached {
		if isAttached {
			if n.strays == nil {
				n.strays = map[string]bool{}
			}
			n.strays[name] = true
			n.joined++
			n.partial = true
		}
	}
}

// forgetUnknown answers Docker's Leave or DeleteEndpoint for an endpoint
// the plugin has no record of, in a network whose record may be
// incomplete (partial): the outcome Docker asks for holds once the
// container's veth, a stray if the container was attached, is gone; the
// last one takes the sandbox with it, as the last Leave does. It reports
// false for a network that is complete, or unknown.
func (d *Driver) forgetUnknown(nid, eid string) (bool, error) {
	n := d.lockNetwork(nid)
	if n == nil {
		return false, nil
	}
	defer n.mu.Unlock()
	if !n.partial {
		return false, nil
	}
	name := vethFor(eid, hwaddr.MAC{}, 0).SandboxName
	if !n.strays[name] {
		return true, nil
	}
	if n.joined == 1 {
		if err := d.teardownSandbox(n); err != nil {
			return true, err
		}
	} else if err := d.kernel.DeleteVeth(n.sandbox, name); err != nil && !errors.Is(err, kernel.ErrNotFound) {
		return true, fmt.Errorf("leave endpoint %s: %w", eid, err)
	} else {
		n.joined--
	}
	delete(n.strays, name)
	d.log.Info("unknown veth removed", "network", n.id, "endpoint", eid, "veth", name)
	return true, nil
}

// mergeAdopted completes a network adopted from the kernel with what
// Docker's CreateNetwork (n, not published) says of it: the same network
// if the VNI is the one its sandbox runs. Caller holds old.mu.
func (d *Driver) mergeAdopted(old, n *network) error {
	if old.vni != n.vni {
		return fmt.Errorf("%w: network %s runs on this host with VNI %d (a sandbox adopted from the previous run), not %d",
			ErrConflict, n.id, old.vni, n.vni)
	}
	presumedEncrypted := old.opts.encrypted && !old.guarded
	old.opts, old.subnets, old.gateways, old.unrecorded = n.opts, n.subnets, n.gateways, false
	if err := d.store.putNetwork(old); err != nil {
		return fmt.Errorf("network %s: %w", n.id, err)
	}
	switch enc := d.encryption(); {
	case old.sandbox == "" || old.guarded:
	case old.opts.encrypted && enc != nil:
		d.settleAdopted(old, enc)
	case !old.opts.encrypted && presumedEncrypted:
		d.reconcileNow(old, "program merged network")
	}
	d.log.Info("adopted network recreated", "why", "Docker created the network again; merged with the sandbox adopted from the previous run",
		"network", old.id, "vni", old.vni, "subnets", old.subnets)
	return nil
}
