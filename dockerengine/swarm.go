package dockerengine

import (
	"context"
	"fmt"
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

// DataPathPort is the swarm's VXLAN data-path port as /info gives it:
// known only on a manager (Swarm.Cluster), where 0 means Docker's default
// of 4789; ok is false on a worker or outside a swarm.
func (c *Client) DataPathPort(ctx context.Context) (port uint16, ok bool, err error) {
	var info struct {
		Swarm struct {
			Cluster *struct{ DataPathPort uint32 }
		}
	}
	if err := c.GetJSON(ctx, "/info", &info); err != nil {
		return 0, false, err
	}
	if info.Swarm.Cluster == nil {
		return 0, false, nil
	}
	p := info.Swarm.Cluster.DataPathPort
	if p == 0 {
		p = 4789
	}
	if p > 65535 {
		return 0, false, fmt.Errorf("engine: data-path port %d out of range", p)
	}
	return uint16(p), true, nil
}
