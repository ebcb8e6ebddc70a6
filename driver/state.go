package driver

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// NetworkState is a point-in-time copy of one network, for inspection.
type NetworkState struct {
	ID        string          `json:"id"`
	VNI       uint32          `json:"vni"`
	Subnets   []netip.Prefix  `json:"subnets"`
	Sandbox   string          `json:"sandbox,omitempty"`
	MTU       int             `json:"mtu,omitempty"`
	Endpoints []EndpointState `json:"endpoints"`
	Peers     []peerdb.Peer   `json:"peers"`
	// Services are its service VIPs and this host's use of them.
	Services []ServiceState `json:"services,omitempty"`
	// Kernel is what the sandbox holds now, read back from the kernel.
	Kernel *KernelState `json:"kernel,omitempty"`
	// Refused says why this host refused the network (refusals.go). A
	// network refused at creation has no other field set.
	Refused *Refusal `json:"refused,omitempty"`
	// VXLANFilter is the source filter's word on the network's VNI; nil
	// without a filter or a sandbox.
	VXLANFilter *VXLANFilterState `json:"vxlan_filter,omitempty"`
}

// VXLANFilterState is the source filter's view of one network.
type VXLANFilterState struct {
	// Dropped counts the network's VXLAN packets from sources outside the
	// cluster, dropped since its VNI was last filtered.
	Dropped uint64 `json:"dropped"`
}

// EndpointState is one local endpoint.
type EndpointState struct {
	ID       string         `json:"id"`
	MAC      hwaddr.MAC     `json:"mac"`
	Addrs    []netip.Prefix `json:"addrs"`
	Joined   bool           `json:"joined"`
	HostVeth string         `json:"hostVeth,omitempty"`
}

// KernelState lists the static entries programmed in a sandbox.
type KernelState struct {
	Neighbors []kernel.Neighbor `json:"neighbors"`
	FDB       []kernel.FDBEntry `json:"fdb"`
	// Error is why the kernel could not be read, or the last reconcile
	// failed (a device that cannot be rebuilt, say).
	Error string `json:"error,omitempty"`
}

// State returns copies of every network, and of every network this host
// refused, sorted by id; each network is read under its own lock, so each
// is consistent in itself.
func (d *Driver) State() []NetworkState {
	ids := d.networkIDs()
	out := make([]NetworkState, 0, len(ids))
	dropped, filtered := d.sources.DroppedByVNI()
	for _, id := range ids {
		n := d.lockNetwork(id)
		if n == nil {
			continue
		}
		s := d.networkState(n)
		if filtered && n.sandbox != "" {
			s.VXLANFilter = &VXLANFilterState{Dropped: dropped[n.vni]}
		}
		out = append(out, s)
		n.mu.Unlock()
	}
	for _, r := range d.refused.list() {
		if i := slices.IndexFunc(out, func(s NetworkState) bool { return s.ID == r.id }); i >= 0 {
			out[i].Refused = &r.Refusal
		} else {
			out = append(out, NetworkState{ID: r.id, Subnets: []netip.Prefix{}, Endpoints: []EndpointState{},
				Peers: []peerdb.Peer{}, Refused: &r.Refusal})
		}
	}
	slices.SortFunc(out, func(a, b NetworkState) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func (d *Driver) networkState(n *network) NetworkState {
	s := NetworkState{ID: n.id, VNI: n.vni, Subnets: slices.Clone(n.subnets), Sandbox: n.sandbox, MTU: n.mtu,
		Endpoints: []EndpointState{}, Peers: n.peers.Peers(), Services: d.servicesState(n)}
	for _, ep := range n.endpoints {
		e := EndpointState{ID: ep.id, MAC: ep.mac, Addrs: slices.Clone(ep.addrs), Joined: ep.joined}
		if ep.joined {
			e.HostVeth = ep.veth.HostName
		}
		s.Endpoints = append(s.Endpoints, e)
	}
	slices.SortFunc(s.Endpoints, func(a, b EndpointState) int { return cmp.Compare(a.ID, b.ID) })
	if n.sandbox != "" {
		ks := &KernelState{}
		var err error
		if ks.Neighbors, err = d.kernel.Neighbors(n.sandbox); err != nil {
			ks.Error = err.Error()
		}
		if ks.FDB, err = d.kernel.FDB(n.sandbox); err != nil {
			ks.Error = err.Error()
		}
		if ks.Error == "" && n.reconcileErr != nil {
			ks.Error = n.reconcileErr.Error()
		}
		slices.SortFunc(ks.Neighbors, func(a, b kernel.Neighbor) int { return a.IP.Compare(b.IP) })
		slices.SortFunc(ks.FDB, func(a, b kernel.FDBEntry) int {
			return cmp.Or(cmp.Compare(a.MAC.String(), b.MAC.String()), a.VTEP.Compare(b.VTEP))
		})
		s.Kernel = ks
	}
	return s
}
