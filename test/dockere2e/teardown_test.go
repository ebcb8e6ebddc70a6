package dockere2e

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// TestCheckTeardown is check_teardown, (e): scale up and down, service
// rm and network rm leave nothing behind on any host.
func TestCheckTeardown(t *testing.T) {
	c := Start(t)
	if !c.HaveHostx() {
		t.Fatal("E2E_NODE_HOSTX is needed to inspect the hosts")
	}
	if err := c.Network("e2e-td", c.Plugin); err != nil {
		t.Fatalf("network create: %v", err)
	}
	// Scale up: two tasks per node.
	if err := c.WebService("e2e-td", "--replicas", strconv.Itoa(2*len(c.Nodes)), "--replicas-max-per-node", "2", "--network", "e2e-td"); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTasks("e2e-td", 2); err != nil {
		t.Fatal(err)
	}
	if err := c.Mesh("e2e-td", "e2e-td", true); err != nil {
		t.Error(err)
	}
	for _, n := range c.Nodes {
		c.logHost(n, fmt.Sprintf("at scale %d", 2*len(c.Nodes)))
	}
	// Scale down to one task: the nodes without a task must drop the network.
	if _, err := c.manager().Docker("service", "scale", "-d", "e2e-td=1"); err != nil {
		t.Fatalf("service scale e2e-td=1: %v", err)
	}
	err := c.Retry(60*time.Second, func() error {
		if k := c.runningTotal("e2e-td"); k != 1 {
			return fmt.Errorf("scale to 1: %d tasks still running", k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	for _, n := range c.Nodes {
		local := len(c.RunningTasks(n, "e2e-td"))
		c.logHost(n, fmt.Sprintf("at scale 1 (%d local task)", local))
		if local > 0 {
			continue
		}
		err := c.Retry(30*time.Second, func() error {
			if sbs, err := c.Sandboxes(n); err != nil || len(sbs) > 0 {
				return fmt.Errorf("%s has no task of e2e-td but still sandboxes %v (%v)", n, sbs, err)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
	// Scale to zero, remove the service and the network: nothing may be left.
	if _, err := c.manager().Docker("service", "scale", "-d", "e2e-td=0"); err != nil {
		t.Error(err)
	}
	c.RemoveLeavingNothing("e2e-td", 30*time.Second)
}

// runningTotal is how many tasks of svc run over all nodes.
func (c *Check) runningTotal(svc string) int {
	k := 0
	for _, n := range c.Nodes {
		k += len(c.RunningTasks(n, svc))
	}
	return k
}

// logHost notes n's sandboxes and remote FDB entries.
func (c *Check) logHost(n *Node, when string) {
	sbs, err := c.Sandboxes(n)
	c.T.Logf("%s %s: %d sandbox(es) (%v), %d remote FDB entries", n, when, len(sbs), err, len(c.RemoteFDB(n)))
}
