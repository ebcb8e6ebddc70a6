package dockere2e

import "testing"

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
