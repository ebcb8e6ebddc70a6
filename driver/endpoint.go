package driver

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// Container-facing interface names: Docker renames SrcName to
// DstPrefix+N inside the container.
const (
	sandboxVethPrefix = "ovs"
	dstPrefix         = "eth"
)

// endpoint is a container's attachment to a network on this host. Guarded
// by its network's mu.
type endpoint struct {
	id     string
	mac    hwaddr.MAC
	addrs  []netip.Prefix
	veth   kernel.Veth
	joined bool
	// sandboxKey is the container's namespace as Docker names it (Join's
	// SandboxKey); balanced is the fingerprint of the service VIPs last
	// programmed there, empty when they must be (again).
	sandboxKey string
	balanced   string
}

func (ep *endpoint) ips() []netip.Addr {
	ips := make([]netip.Addr, len(ep.addrs))
	for i, a := range ep.addrs {
		ips[i] = a.Addr()
	}
	return ips
}

func vethFor(eid string, mac hwaddr.MAC, mtu int) kernel.Veth {
	short := eid[:min(len(eid), 12)]
	return kernel.Veth{HostName: kernel.HostVethPrefix + short, SandboxName: sandboxVethPrefix + short, MAC: mac, MTU: mtu}
}

// CreateEndpoint records the endpoint with the addresses swarm's IPAM chose
// and assigns a MAC when Docker gives none. What it refuses changes
// nothing: the checks all come before the endpoint is stored.
func (d *Driver) CreateEndpoint(req *api.CreateEndpointRequest) (*api.CreateEndpointResponse, error) {
	if err := validID("endpoint", req.EndpointID); err != nil {
		return nil, err
	}
	if req.Interface == nil {
		return nil, fmt.Errorf("%w: endpoint %s: no Interface (addresses) in request", ErrInvalid, req.EndpointID)
	}
	addrs, err := parseAddrs(req.Interface.Address, req.Interface.AddressIPv6)
	if err != nil {
		return nil, fmt.Errorf("%w: endpoint %s: %v", ErrInvalid, req.EndpointID, err)
	}
	var mac hwaddr.MAC
	assigned := req.Interface.MacAddress == ""
	if assigned {
		mac = macFor(addrs)
	} else if mac, err = hwaddr.Parse(req.Interface.MacAddress); err != nil {
		return nil, fmt.Errorf("%w: endpoint %s: %v", ErrInvalid, req.EndpointID, err)
	}
	ep := &endpoint{id: req.EndpointID, mac: mac, addrs: addrs}
	if err := (peerdb.Peer{EndpointID: ep.id, IPs: ep.ips(), MAC: mac, Local: true}).Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}

	n, err := d.mustLockNetwork(req.NetworkID)
	if err != nil {
		return nil, err
	}
	defer n.mu.Unlock()
	if _, ok := n.endpoints[ep.id]; ok {
		return nil, fmt.Errorf("%w: endpoint %s exists already in network %s", ErrConflict, ep.id, n.id)
	}
	if p, ok := n.peers.Get(ep.id); ok && !p.Local {
		return nil, fmt.Errorf("%w: endpoint id %s is held by a remote endpoint of network %s (on %s)", ErrConflict, ep.id, n.id, p.VTEP)
	}
	if err := n.checkAddrs(ep.ips()); err != nil {
		return nil, fmt.Errorf("%w: endpoint %s: %v", ErrInvalid, ep.id, err)
	}
	// Only local endpoints are compared. A remote endpoint may still hold
	// one of these IPs: swarm hands an address out again soon after a task
	// on another host released it, and that host's retraction may not
	// have arrived yet. Refusing would fail a legitimate task; the peer db
	// lets the local endpoint win the IP meanwhile (peerdb's winner), and
	// the stale remote claim goes with its retraction, or with its owner.
	if err := n.localClash(ep); err != nil {
		return nil, fmt.Errorf("%w: endpoint %s: %v", ErrConflict, ep.id, err)
	}
	if err := n.remoteMACClash(ep); err != nil {
		return nil, fmt.Errorf("%w: endpoint %s: %v", ErrConflict, ep.id, err)
	}
	if err := d.store.putEndpoint(n.id, ep); err != nil {
		return nil, err
	}
	n.addLocal(ep)
	resp := &api.CreateEndpointResponse{}
	if assigned {
		// Docker rejects a response that repeats what it supplied.
		resp.Interface = &api.EndpointInterface{MacAddress: mac.String()}
	}
	return resp, nil
}

// localClash reports another local endpoint of the network holding one of
// ep's IPs or its MAC: the bridge would deliver to either. Caller holds
// n.mu.
func (n *network) localClash(ep *endpoint) error {
	if o := n.localWithMAC(ep.mac); o != nil {
		return fmt.Errorf("MAC %s is held by endpoint %s", ep.mac, o.id)
	}
	for _, o := range n.endpoints {
		for _, ip := range ep.ips() {
			if slices.Contains(o.ips(), ip) {
				return fmt.Errorf("address %s is held by endpoint %s", ip, o.id)
			}
		}
	}
	return nil
}

// remoteMACClash reports a remote endpoint of the network holding ep's MAC
// and none of its addresses: the new endpoint could not reach it (this
// host's bridge keeps the MAC), and that host would send its own
// container's frames here. A remote endpoint with ep's MAC that shares an
// address is the stale claim of an address swarm handed out again (a MAC
// derives from the address): the local endpoint wins it, as it wins the
// IP (see CreateEndpoint). Caller holds n.mu.
func (n *network) remoteMACClash(ep *endpoint) error {
	for _, p := range n.peers.WithMAC(ep.mac) {
		if p.Local {
			continue
		}
		if slices.ContainsFunc(p.IPs, func(ip netip.Addr) bool { return slices.Contains(ep.ips(), ip) }) {
			continue
		}
		return fmt.Errorf("MAC %s is held by remote endpoint %s (on %s)", ep.mac, p.EndpointID, p.VTEP)
	}
	return nil
}

// DeleteEndpoint forgets the endpoint, leaving first if Docker did not.
func (d *Driver) DeleteEndpoint(req *api.DeleteEndpointRequest) error {
	n, ep, err := d.lockEndpoint(req.NetworkID, req.EndpointID)
	if errors.Is(err, ErrNotFound) {
		if ok, ferr := d.forgetUnknown(req.NetworkID, req.EndpointID); ok {
			return ferr
		}
	}
	if err != nil {
		return err
	}
	defer n.mu.Unlock()
	if ep.joined {
		if err := d.leave(n, ep); err != nil {
			return err
		}
	}
	if err := d.store.deleteEndpoint(n.id, ep.id); err != nil {
		d.log.Warn("forget stored endpoint", "endpoint", ep.id, "err", err)
	}
	n.dropLocal(ep)
	d.retakeMAC(n, ep.mac)
	return nil
}

// retakeMAC adds the remote endpoints holding mac that were refused while
// a local endpoint held it (addPeer): a task that moved to another host
// with its address, and so its MAC, is reached once the local endpoint is
// gone rather than at the next resync. What fails is the reconciler's to
// repair; the endpoint is deleted either way. Caller holds n.mu.
func (d *Driver) retakeMAC(n *network, mac hwaddr.MAC) {
	cp := d.controlPlane()
	if cp == nil {
		return
	}
	var refused []peerdb.Peer
	for _, p := range cp.Snapshot(n.id) {
		if _, known := n.peers.Get(p.EndpointID); !known && !p.Local && p.MAC == mac {
			refused = append(refused, p)
		}
	}
	if len(refused) == 0 {
		return
	}
	if err := d.addPeers(n, refused); err != nil {
		d.log.Warn("remote endpoints of a freed MAC not added", "network", n.id, "mac", mac, "err", err)
	}
}

// EndpointInfo reports what an operator would want to see in
// `docker network inspect`.
func (d *Driver) EndpointInfo(req *api.InfoRequest) (*api.InfoResponse, error) {
	n, ep, err := d.lockEndpoint(req.NetworkID, req.EndpointID)
	if err != nil {
		return nil, err
	}
	defer n.mu.Unlock()
	v := map[string]string{"mac": ep.mac.String(), "vni": fmt.Sprint(n.vni)}
	if ep.joined {
		v["veth"] = ep.veth.HostName
	}
	return &api.InfoResponse{Value: v}, nil
}

// Join connects the endpoint: the network's sandbox is built on the first
// local Join, a veth pair is attached to its bridge, and the host end is
// handed to Docker to move into the container.
func (d *Driver) Join(req *api.JoinRequest) (*api.JoinResponse, error) {
	if err := validSandboxKey(req.SandboxKey); err != nil {
		return nil, err
	}
	n, ep, err := d.lockEndpoint(req.NetworkID, req.EndpointID)
	if err != nil {
		return nil, err
	}
	defer n.mu.Unlock()
	if ep.joined {
		return nil, fmt.Errorf("%w: endpoint %s is joined already", ErrConflict, ep.id)
	}
	created := n.sandbox == ""
	if err := d.ensureSandbox(n); err != nil {
		return nil, err
	}
	if !created {
		if err := d.repairForJoin(n); err != nil {
			return nil, fmt.Errorf("join endpoint %s: the sandbox of network %s is broken and could not be repaired: %w", ep.id, n.id, err)
		}
	}
	veth := vethFor(ep.id, ep.mac, n.mtu)
	if err := d.kernel.AddVeth(n.sandbox, veth); err != nil {
		if created {
			if terr := d.teardownSandbox(n); terr != nil {
				d.log.Error("undo sandbox after failed join", "network", n.id, "err", terr)
			}
		}
		return nil, fmt.Errorf("join endpoint %s: %w", ep.id, err)
	}
	changes, err := n.peers.Add(peerdb.Peer{EndpointID: ep.id, IPs: ep.ips(), MAC: ep.mac, Local: true})
	if err != nil {
		// Unreachable: CreateEndpoint validated the addresses and MAC.
		d.log.Error("local endpoint rejected by peer db", "endpoint", ep.id, "err", err)
	}
	if err := d.apply(n, changes); err != nil {
		d.log.Warn("program peers after join", "network", n.id, "err", err)
	}
	ep.veth, ep.joined = veth, true
	ep.sandboxKey, ep.balanced = req.SandboxKey, ""
	n.joined++
	if err := d.store.putEndpoint(n.id, ep); err != nil {
		d.log.Warn("persist endpoint", "endpoint", ep.id, "err", err)
	}
	if cp := d.controlPlane(); cp != nil {
		cp.Publish(n.id, peerdb.Peer{EndpointID: ep.id, IPs: ep.ips(), MAC: ep.mac, Local: true})
	}
	// The new container balances the services Docker listed last; the
	// watcher asks Docker again, as for any endpoint change.
	d.balance(n)
	d.endpointChanged(n, ep.id)

	resp := &api.JoinResponse{InterfaceName: api.InterfaceName{SrcName: veth.HostName, DstPrefix: dstPrefix}}
	// Other subnets of the network share its L2 segment: reach them on-link.
	for _, s := range n.subnets {
		if !slices.ContainsFunc(ep.addrs, func(a netip.Prefix) bool { return s.Contains(a.Addr()) }) &&
			slices.ContainsFunc(ep.addrs, func(a netip.Prefix) bool { return a.Addr().Is4() == s.Addr().Is4() }) {
			resp.StaticRoutes = append(resp.StaticRoutes, &api.StaticRoute{Destination: s.String(), RouteType: routeConnected})
		}
	}
	return resp, nil
}

// routeConnected is libnetwork's types.CONNECTED: a route with no next hop.
const routeConnected = 1

// Leave disconnects the endpoint; the last Leave removes the sandbox.
func (d *Driver) Leave(req *api.LeaveRequest) error {
	n, ep, err := d.lockEndpoint(req.NetworkID, req.EndpointID)
	if errors.Is(err, ErrNotFound) {
		if ok, ferr := d.forgetUnknown(req.NetworkID, req.EndpointID); ok {
			return ferr
		}
	}
	if err != nil {
		return err
	}
	defer n.mu.Unlock()
	if !ep.joined {
		// Already left, or its sandbox went with a plugin restart: the
		// outcome Docker asks for holds.
		return nil
	}
	return d.leave(n, ep)
}

// leave undoes join. Caller holds n.mu.
func (d *Driver) leave(n *network, ep *endpoint) error {
	if n.joined == 1 {
		// The whole sandbox goes, veth and entries with it.
		return d.teardownSandbox(n)
	}
	if err := d.kernel.DeleteVeth(n.sandbox, ep.veth.SandboxName); err != nil && !errors.Is(err, kernel.ErrNotFound) {
		return fmt.Errorf("leave endpoint %s: %w", ep.id, err)
	}
	d.unbalance(n, ep)
	ep.joined = false
	ep.sandboxKey, ep.balanced = "", ""
	n.joined--
	if err := d.store.putEndpoint(n.id, ep); err != nil {
		d.log.Warn("persist endpoint", "endpoint", ep.id, "err", err)
	}
	if err := d.apply(n, n.peers.Delete(ep.id)); err != nil {
		d.log.Warn("program peers after leave", "network", n.id, "err", err)
	}
	if cp := d.controlPlane(); cp != nil {
		cp.Retract(n.id, ep.id)
	}
	d.endpointChanged(n, ep.id)
	return nil
}

// lockEndpoint locks the network and finds the endpoint in it.
func (d *Driver) lockEndpoint(nid, eid string) (*network, *endpoint, error) {
	if err := validID("endpoint", eid); err != nil {
		return nil, nil, err
	}
	n, err := d.mustLockNetwork(nid)
	if err != nil {
		return nil, nil, err
	}
	ep, ok := n.endpoints[eid]
	if !ok {
		n.mu.Unlock()
		return nil, nil, fmt.Errorf("endpoint %s in network %s: %w", eid, nid, ErrNotFound)
	}
	return n, ep, nil
}

// macFor derives an endpoint's MAC from its address, as Docker's overlay
// does (02:42 and the IPv4 address; for IPv6-only endpoints, its last four
// bytes): a container that reuses an address keeps the MAC, so peers'
// neighbour caches stay right. Addresses are unique in a network, and so
// are the MACs.
func macFor(addrs []netip.Prefix) hwaddr.MAC {
	a := addrs[0].Addr()
	for _, p := range addrs {
		if p.Addr().Is4() {
			a = p.Addr()
		}
	}
	b := a.AsSlice()
	m := hwaddr.MAC{0x02, 0x42}
	copy(m[2:], b[len(b)-4:])
	return m
}

// parseAddrs parses the CIDR addresses Docker gives an endpoint: an IPv4
// one as Address, an IPv6 one as AddressIPv6 (an IPv4-mapped address is
// IPv4), either may be empty, and neither a /0, which would put every
// address on-link.
func parseAddrs(v4, v6 string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range [...]struct {
		field, s string
		is4      bool
	}{{"Address", v4, true}, {"AddressIPv6", v6, false}} {
		if f.s == "" {
			continue
		}
		p, err := netip.ParsePrefix(f.s)
		if err != nil {
			return nil, fmt.Errorf("%s %q: want address/prefix-length: %v", f.field, f.s, err)
		}
		if p.Addr().Is4() != f.is4 || p.Addr().Is4In6() {
			return nil, fmt.Errorf("%s %q is in the wrong field: Address takes IPv4, AddressIPv6 IPv6", f.field, f.s)
		}
		if p.Bits() == 0 {
			return nil, fmt.Errorf("%s %q: a /0 would put every address on-link", f.field, f.s)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errors.New("no IPv4 or IPv6 address")
	}
	return out, nil
}
