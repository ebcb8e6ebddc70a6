package dockere2e

import (
	"fmt"
	"testing"
)

// TestCheckPluginAttachable is check_plugin_attachable, (b): an
// --attachable plugin network used by docker run on every node; the
// containers reach each other across hosts by address (by container name
// only noted: swarm-scope service discovery).
func TestCheckPluginAttachable(t *testing.T) {
	c := Start(t)
	if err := c.Network("e2e-att", c.Plugin, "--attachable"); err != nil {
		t.Fatalf("network create --attachable: %v", err)
	}
	eps, err := c.WebContainers("e2e-att", "e2e-att")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ContainersMesh(eps, "e2e-att", false); err != nil {
		t.Fatal(err)
	}
}

// ContainersMesh: the containers (WebContainers name) reach each other
// across hosts by address; with names, by container name too (Docker's
// embedded DNS must give the container's address), otherwise what the
// name resolves to is only noted.
func (c *Check) ContainersMesh(eps []Endpoint, name string, names bool) error {
	m := &Matrix{c: c}
	m.ByAddress(eps, Port)
	for i, from := range eps {
		for j, to := range eps {
			if i == j {
				continue
			}
			peer := fmt.Sprintf("%s-%d", name, j)
			if names {
				m.ByName([]Endpoint{from}, peer, []Endpoint{to}, true)
			} else {
				c.T.Logf("note: %s resolves %s to %v", from.Host, peer, from.Resolve(peer))
			}
		}
	}
	return m.Err()
}
