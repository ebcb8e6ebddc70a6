package dockerengine

import "context"

// Network is one network as the engine lists it. On a swarm manager the
// list holds every swarm network, with Options as the network's driver
// returned them from AllocateNetwork.
type Network struct {
	ID      string
	Name    string
	Driver  string
	Scope   string
	Options map[string]string
}

// Networks lists the engine's networks (GET /networks).
func (c *Client) Networks(ctx context.Context) ([]Network, error) {
	var out []Network
	if err := c.GetJSON(ctx, "/networks", &out); err != nil {
		return nil, err
	}
	return out, nil
}
