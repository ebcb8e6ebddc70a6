package dockerengine

import (
	"context"
	"net/url"
)

// Attachment is a container's endpoint on a network, as the engine lists
// this node's (GET /networks/<id>, "Containers"): addresses with their
// prefix length, empty when the container has none of that family.
type Attachment struct {
	Name        string
	EndpointID  string
	MacAddress  string
	IPv4Address string
	IPv6Address string
}

// NetworkContainers returns this node's containers on network id (GET
// /networks/<id>). ErrNotFound if the engine has no such network.
func (c *Client) NetworkContainers(ctx context.Context, id string) ([]Attachment, error) {
	var inspect struct {
		Containers map[string]Attachment
	}
	if err := c.GetJSON(ctx, "/networks/"+url.PathEscape(id), &inspect); err != nil {
		return nil, err
	}
	out := make([]Attachment, 0, len(inspect.Containers))
	for _, a := range inspect.Containers {
		out = append(out, a)
	}
	return out, nil
}
