package demo

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// gossipTimeout bounds the wait for every host to learn every endpoint.
const gossipTimeout = 20 * time.Second

// remotePeers is what the plugin learned of other hosts' endpoints.
func (r *run) remotePeers(p *testbed.Plugin) ([]peerdb.Peer, string, error) {
	n, err := p.Network(r.netID)
	if err != nil {
		return nil, "", err
	}
	var remote []peerdb.Peer
	for _, peer := range n.Peers {
		if !peer.Local {
			remote = append(remote, peer)
		}
	}
	slices.SortFunc(remote, func(a, b peerdb.Peer) int { return a.VTEP.Compare(b.VTEP) })
	return remote, n.Sandbox, nil
}

// waitGossip waits until every host holds the endpoints of all the others;
// past gossipTimeout it carries on, and the pings will tell.
func (r *run) waitGossip(ctx context.Context) error {
	r.out.step("Waiting for gossip to spread the endpoints (no peer is fed by hand)")
	start := time.Now()
	want := len(r.plugins) - 1
	for {
		done := 0
		for _, p := range r.plugins {
			if remote, _, err := r.remotePeers(p); err == nil && len(remote) == want {
				done++
			}
		}
		if done == len(r.plugins) {
			r.out.say("every host knows the other %d endpoints (after %.1f s)", want, time.Since(start).Seconds())
			return nil
		}
		if time.Since(start) > gossipTimeout {
			r.out.say("%s", r.out.paint(yellow, fmt.Sprintf("only %d of %d hosts know all remote endpoints after %v; carrying on", done, len(r.plugins), gossipTimeout)))
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// showMembers prints each plugin's view of the gossip cluster.
func (r *run) showMembers(context.Context) error {
	r.out.step("Gossip members, as each plugin sees them (GET /v1/cluster, or: overlay-plugin cluster)")
	for _, p := range r.plugins {
		var v struct{ Members []cluster.Member }
		if err := p.AdminJSON("/v1/cluster", &v); err != nil {
			return err
		}
		var line []string
		for _, m := range v.Members {
			name := m.Name
			if m.Self {
				name += "(self)"
			}
			line = append(line, fmt.Sprintf("%s=%s@%s", name, m.State, m.VTEP))
		}
		r.out.say("%s sees: %s", p.Host.Name, strings.Join(line, "  "))
	}
	return nil
}

// showLearned prints, per host, the remote endpoints its plugin learned and
// the neighbour and FDB entries its sandbox holds, read from the kernel.
func (r *run) showLearned(context.Context) error {
	r.out.step("What each host learned by gossip, and the kernel entries in its sandbox")
	for _, p := range r.plugins {
		remote, sandbox, err := r.remotePeers(p)
		if err != nil {
			return err
		}
		r.out.say("%s remote peers (GET /v1/networks):", r.out.paint(bold, p.Host.Name))
		for _, peer := range remote {
			ips := make([]string, len(peer.IPs))
			for i, ip := range peer.IPs {
				ips[i] = ip.String()
			}
			r.out.say("    endpoint %s  ips %s  mac %s  on VTEP %s", peer.EndpointID[:12], strings.Join(ips, ","), peer.MAC, peer.VTEP)
		}
		if sandbox == "" {
			continue
		}
		neighs, fdbs, err := p.SandboxEntries(sandbox)
		if err != nil {
			return err
		}
		r.out.say("  kernel, read inside the sandbox (nsenter --net=%s):", p.SandboxPath(sandbox))
		for _, n := range neighs {
			r.out.say("      neigh %-15s lladdr %s dev %s permanent", n.IP, n.MAC, kernel.VXLANName)
		}
		for _, f := range fdbs {
			r.out.say("      fdb   %s dst %s dev %s self permanent", f.MAC, f.VTEP, kernel.VXLANName)
		}
	}
	return nil
}
