package dockere2e

import (
	"fmt"
	"testing"
)

// TestCheckBuiltinOverlay is check_builtin_overlay, the harness's
// self-test: Docker's own overlay and a global dnsrr service.
func TestCheckBuiltinOverlay(t *testing.T) {
	c := Start(t)
	if err := c.GlobalMesh("e2e-builtin", "overlay"); err != nil {
		t.Fatal(err)
	}
}

// GlobalMesh: a network name of driver and a global web service of the
// same name on it, whose tasks reach each other by address and by name.
func (c *Check) GlobalMesh(name, driver string) error {
	if err := c.Network(name, driver); err != nil {
		return fmt.Errorf("docker network create -d %s: %w", driver, err)
	}
	if err := c.WebService(name, "--mode", "global", "--network", name); err != nil {
		return err
	}
	if err := c.WaitTasks(name, 1); err != nil {
		return err
	}
	return c.Mesh(name, name, true)
}
