package testbed

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// Poll is how often the cluster's waits look again.
const Poll = 200 * time.Millisecond

// floodMAC is the FDB entry of a flood network's head-end replication.
const floodMAC = "00:00:00:00:00:00"

// Want says which remote endpoints of a network a host should hold; nil
// stands for Cluster.Remotes.
type Want func(obs *Node) []*Endpoint

// WantTables are the neighbour and FDB entries a host holding remotes of
// nw must have: one neighbour per remote IP, one FDB entry per remote MAC
// and, on a flood network, one all-zero entry per remote VTEP with
// endpoints.
func WantTables(nw *Network, remotes []*Endpoint) ([]Neigh, []FDB) {
	neigh, fdb := []Neigh{}, []FDB{}
	vteps := map[string]bool{}
	for _, ep := range remotes {
		for _, ip := range ep.IPs() {
			neigh = append(neigh, Neigh{IP: ip.String(), MAC: ep.MAC})
		}
		v := ep.Host.Underlay.String()
		fdb = append(fdb, FDB{MAC: ep.MAC, VTEP: v})
		vteps[v] = true
	}
	if nw.Flood() {
		for v := range vteps {
			fdb = append(fdb, FDB{MAC: floodMAC, VTEP: v})
		}
	}
	return SortNeigh(neigh), SortFDB(fdb)
}

func peerKey(id string, ips []netip.Addr, mac, vtep string) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	slices.Sort(s)
	return fmt.Sprintf("%s %v %s %s", id, s, mac, vtep)
}

// Diffs compares what every host whose plugin runs holds of nw with what
// it should: its remote peers, and the neighbour and FDB entries of its
// sandbox as the plugin reports them and, with sandbox, as ip and bridge
// read them there. An empty result means converged.
func (c *Cluster) Diffs(nw *Network, want Want, sandbox bool) []string {
	if want == nil {
		want = func(obs *Node) []*Endpoint { return c.Remotes(obs, nw) }
	}
	var out []string
	for _, n := range c.Nodes {
		if !n.Plugin.Running() {
			continue
		}
		out = append(out, c.nodeDiffs(n, nw, want(n), sandbox)...)
	}
	return out
}

func (c *Cluster) nodeDiffs(n *Node, nw *Network, remotes []*Endpoint, sandbox bool) []string {
	st, err := n.Plugin.Network(nw.ID)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", n.Name, err)}
	}
	var out []string
	wantPeers, gotPeers := []string{}, []string{}
	for _, ep := range remotes {
		wantPeers = append(wantPeers, peerKey(ep.ID, ep.IPs(), ep.MAC, ep.Host.Underlay.String()))
	}
	for _, p := range st.Peers {
		if !p.Local {
			gotPeers = append(gotPeers, peerKey(p.EndpointID, p.IPs, p.MAC.String(), p.VTEP.String()))
		}
	}
	slices.Sort(wantPeers)
	slices.Sort(gotPeers)
	if !slices.Equal(gotPeers, wantPeers) {
		out = append(out, fmt.Sprintf("%s: remote peers\n   got  %q\n   want %q", n.Name, gotPeers, wantPeers))
	}
	if st.Kernel == nil {
		for _, e := range st.Endpoints {
			if e.Joined {
				return append(out, fmt.Sprintf("%s: joined endpoint %s but no sandbox/kernel view", n.Name, e.ID))
			}
		}
		return out
	}
	if st.Kernel.Error != "" {
		out = append(out, fmt.Sprintf("%s: kernel view error: %s", n.Name, st.Kernel.Error))
	}
	wn, wf := WantTables(nw, remotes)
	gn, gf := ReportedEntries(st.Kernel)
	if !slices.Equal(gn, wn) {
		out = append(out, fmt.Sprintf("%s: neighbours (admin API)\n   got  %v\n   want %v", n.Name, gn, wn))
	}
	if !slices.Equal(gf, wf) {
		out = append(out, fmt.Sprintf("%s: FDB (admin API)\n   got  %v\n   want %v", n.Name, gf, wf))
	}
	if !sandbox {
		return out
	}
	kn, kf, err := n.Plugin.SandboxEntries(st.Sandbox)
	if err != nil {
		return append(out, fmt.Sprintf("%s: reading sandbox %s: %v", n.Name, st.Sandbox, err))
	}
	if !slices.Equal(kn, wn) {
		out = append(out, fmt.Sprintf("%s: neighbours (ip -j neigh in sandbox %s)\n   got  %v\n   want %v", n.Name, st.Sandbox, kn, wn))
	}
	if !slices.Equal(kf, wf) {
		out = append(out, fmt.Sprintf("%s: FDB (bridge -j fdb in sandbox %s)\n   got  %v\n   want %v", n.Name, st.Sandbox, kf, wf))
	}
	return out
}

// WaitConverged waits up to timeout until every host holds exactly what
// it should of nw according to the admin API, then checks strictly, once,
// both the admin API and the sandboxes read with ip and bridge. It
// returns how long convergence took.
func (c *Cluster) WaitConverged(nw *Network, want Want, timeout time.Duration, what string) (time.Duration, error) {
	start := time.Now()
	noted := false
	err := wait.Until(timeout, Poll, func() error {
		d := c.Diffs(nw, want, false)
		if len(d) == 0 {
			return nil
		}
		if !noted && time.Since(start) > 5*time.Second {
			noted = true
			c.Bed.Logf("%s: still not converged after 5s:\n  %s", what, strings.Join(d, "\n  "))
		}
		return errors.New(strings.Join(d, "\n  "))
	})
	if err != nil {
		return 0, fmt.Errorf("%s: not converged: %w", what, err)
	}
	took := time.Since(start)
	if d := c.Diffs(nw, want, true); len(d) != 0 {
		return took, fmt.Errorf("%s: admin API converged after %v, but the strict check (admin API and sandbox tables) found:\n  %s", what, took, strings.Join(d, "\n  "))
	}
	c.Bed.Logf("%s: converged in %v (admin API and sandbox tables exact on every host)", what, took.Round(time.Millisecond))
	return took, nil
}
