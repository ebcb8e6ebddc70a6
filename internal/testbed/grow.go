package testbed

import "fmt"

// AddNode grows the cluster by a host: a new namespace on the switch, a
// plugin started like the others' (with gossip it joins h1), enabled as
// dockerd enables it, and nws created on it as swarm creates a network on
// a node that gets a task of it. Call it while no other goroutine uses
// the cluster's Nodes.
func (c *Cluster) AddNode(nws ...*Network) (*Node, error) {
	h, err := c.Topo.AddHost()
	if err != nil {
		return nil, fmt.Errorf("add host: %w", err)
	}
	if err := c.Topo.WaitUnderlay(c.cfg.UnderlayWait); err != nil {
		return nil, fmt.Errorf("underlay with %s: %w", h.Name, err)
	}
	n := &Node{Host: h}
	if n.Config, err = c.pluginConfig(len(c.Nodes), n); err != nil {
		return nil, err
	}
	if err := c.start(n); err != nil {
		return nil, err
	}
	c.Nodes = append(c.Nodes, n)
	if err := c.Enable(n); err != nil {
		return nil, err
	}
	for _, nw := range nws {
		req := CreateNetworkRequest(nw.ID, nw.Allocated, nw.Pool4, nw.Gw4, nw.Pool6, nw.Gw6)
		if err := n.Plugin.API.CreateNetwork(req); err != nil {
			return nil, fmt.Errorf("%s CreateNetwork %s: %w", n.Name, nw.Name, err)
		}
	}
	return n, nil
}
