package driver

import (
	"cmp"
	"slices"
)

// NetworkStats are one network's figures, for metrics.
type NetworkStats struct {
	ID  string
	VNI uint32
	// Joined and Unjoined count the local endpoints; Remote the remote
	// endpoints in its peer table.
	Joined, Unjoined, Remote int
	Sandbox                  bool
	// FDBEntries are the static FDB entries read from the sandbox; -1
	// when there is none or it could not be read.
	FDBEntries int
	Services   []ServiceState
	Refused    *Refusal
}

// Stats returns every network's figures, and those of the networks this
// host refused, sorted by id. Each network is counted under its lock,
// which is released before the kernel is read (its FDB, the containers'
// connection counters): a scrape never holds up a Join or a burst of
// peers, nor copies a peer table.
func (d *Driver) Stats() []NetworkStats {
	var out []NetworkStats
	for _, id := range d.networkIDs() {
		n := d.lockNetwork(id)
		if n == nil {
			continue
		}
		s := NetworkStats{ID: n.id, VNI: n.vni, Remote: n.peers.RemoteCount(), Sandbox: n.sandbox != "", FDBEntries: -1}
		for _, ep := range n.endpoints {
			if ep.joined {
				s.Joined++
			} else {
				s.Unjoined++
			}
		}
		sandbox := n.sandbox
		var paths []string
		s.Services, paths = n.serviceStates(d)
		n.mu.Unlock()
		if sandbox != "" {
			if fdb, err := d.kernel.FDB(sandbox); err == nil {
				s.FDBEntries = len(fdb)
			}
		}
		d.countConnections(s.Services, paths)
		out = append(out, s)
	}
	for _, r := range d.refused.list() {
		if i := slices.IndexFunc(out, func(s NetworkStats) bool { return s.ID == r.id }); i >= 0 {
			out[i].Refused = &r.Refusal
		} else {
			out = append(out, NetworkStats{ID: r.id, FDBEntries: -1, Refused: &r.Refusal})
		}
	}
	slices.SortFunc(out, func(a, b NetworkStats) int { return cmp.Compare(a.ID, b.ID) })
	return out
}
