package dockerengine

import (
	"context"
	"net"
	"net/netip"
)

// SwarmAddrs lists the addresses of the swarm nodes the engine knows: the
// managers from /info, and every node from /nodes where /info says this
// node is a manager (Swarm.ControlAvailable). A worker's engine answers
// /nodes with 503 and logs it as an error, twice, every time it is asked.
// With an error, what was learnt before it is returned too.
func (c *Client) SwarmAddrs(ctx context.Context) ([]netip.Addr, error) {
	var info struct {
		Swarm struct {
			ControlAvailable bool
			RemoteManagers   []struct{ Addr string }
		}
	}
	if err := c.GetJSON(ctx, "/info", &info); err != nil {
		return nil, err
	}
	var out []netip.Addr
	add := func(hostport string) {
		host, _, err := net.SplitHostPort(hostport)
		if err != nil {
			host = hostport
		}
		if a, err := netip.ParseAddr(host); err == nil {
			out = append(out, a.Unmap())
		}
	}
	for _, m := range info.Swarm.RemoteManagers {
		add(m.Addr)
	}
	if !info.Swarm.ControlAvailable {
		return out, nil
	}
	var nodes []struct {
		Status struct{ Addr string }
	}
	if err := c.GetJSON(ctx, "/nodes", &nodes); err != nil {
		return out, err
	}
	for _, n := range nodes {
		add(n.Status.Addr)
	}
	return out, nil
}
