package dockerengine

import (
	"context"
	"net/url"
)

// Service is a swarm service attached to a network, as the engine's
// verbose network inspect shows it on any node with the network (from
// Docker's own gossip): VIP is empty for a dnsrr service.
type Service struct {
	Name  string
	VIP   string
	Ports []string
	Tasks []Task
}

// Task is one of a service's tasks on the network.
type Task struct {
	Name       string
	EndpointID string
	EndpointIP string
}

// NetworkServices returns the services of network id (GET
// /networks/<id>?verbose=true). ErrNotFound if the engine has no such
// network.
func (c *Client) NetworkServices(ctx context.Context, id string) ([]Service, error) {
	var inspect struct {
		Services map[string]struct {
			VIP   string
			Ports []string
			Tasks []Task
		}
	}
	if err := c.GetJSON(ctx, "/networks/"+url.PathEscape(id)+"?verbose=true", &inspect); err != nil {
		return nil, err
	}
	out := make([]Service, 0, len(inspect.Services))
	for name, s := range inspect.Services {
		out = append(out, Service{Name: name, VIP: s.VIP, Ports: s.Ports, Tasks: s.Tasks})
	}
	return out, nil
}
