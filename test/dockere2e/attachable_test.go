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

// TestCheckCoexistence is check_coexistence, (d): Docker's overlay and a
// plugin network side by side, one service on both, reachable on each.
func TestCheckCoexistence(t *testing.T) {
	c := Start(t)
	if err := c.Network("e2e-co-builtin", "overlay"); err != nil {
		t.Fatal(err)
	}
	if err := c.Network("e2e-co-plug", c.Plugin); err != nil {
		t.Fatalf("network create: %v", err)
	}
	if err := c.WebService("e2e-co", "--mode", "global", "--network", "e2e-co-builtin", "--network", "e2e-co-plug"); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTasks("e2e-co", 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Mesh("e2e-co", "e2e-co-builtin", true); err != nil {
		t.Error(err)
	}
	if err := c.Mesh("e2e-co", "e2e-co-plug", false); err != nil {
		t.Error(err)
	}
}

// TestCheckBuiltinOverlay is check_builtin_overlay, the harness's
// self-test: Docker's own overlay and a global dnsrr service.
func TestCheckBuiltinOverlay(t *testing.T) {
	c := Start(t)
	if err := c.Network("e2e-builtin", "overlay"); err != nil {
		t.Fatal(err)
	}
	if err := c.WebService("e2e-builtin", "--mode", "global", "--network", "e2e-builtin"); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTasks("e2e-builtin", 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Mesh("e2e-builtin", "e2e-builtin", true); err != nil {
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
