package dockere2e

import (
	"cmp"
	"fmt"
	"os"
	"testing"
	"time"
)

// TestCheckDisableEnable is check_disable_enable, (f): docker plugin
// disable -f and enable, one node at a time as an operator would, with
// tasks running: the kernel data path lives on while the plugin is gone
// (its sandboxes sit on a host mount), the same tasks keep talking, and new
// tasks work after. Where the kernel has ESP, on an encrypted network: the
// plugin hands its IPsec state over to its next run too, and nothing of the
// network crosses the wire in clear meanwhile (a capture all along).
func TestCheckDisableEnable(t *testing.T) {
	c := Start(t)
	opts := []string{"--attachable"}
	var wire *Wire
	if c.ExpectESP {
		opts = append(opts, "--opt", "encrypted")
		var err error
		if wire, err = c.WatchWire(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Network("e2e-de", c.Plugin, opts...); err != nil {
		t.Fatalf("network create: %v", err)
	}
	if err := c.WebService("e2e-de", "--mode", "global", "--network", "e2e-de"); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTasks("e2e-de", 1); err != nil {
		t.Fatal(err)
	}
	// A second endpoint on node 0: same-host traffic, which crosses only
	// node 0's sandbox.
	node0 := c.Nodes[0]
	local, err := c.RunContainer(node0, "e2e-de-local", "--network", "e2e-de", c.Image, "sleep", "100000")
	if err != nil {
		t.Fatalf("docker run on e2e-de: %v", err)
	}
	traffic := func(when string) error {
		err := c.Retry(10*time.Second, func() error {
			tasks := c.RunningTasks(node0, "e2e-de")
			if len(tasks) == 0 {
				return fmt.Errorf("no task on %s", node0)
			}
			ip, err := c.IP(node0, tasks[0], "e2e-de")
			if err != nil {
				return err
			}
			_, err = Endpoint{Node: node0, CID: local}.Get(ip, Port)
			return err
		})
		if err != nil {
			links, _ := node0.Exec(local, "ip", "-o", "link")
			return fmt.Errorf("%s: node 0's container no longer reaches node 0's task: %v (interfaces: %s)", when, err, links)
		}
		if err := c.Mesh("e2e-de", "e2e-de", false); err != nil {
			return fmt.Errorf("%s: the running tasks no longer reach each other across hosts: %w", when, err)
		}
		t.Logf("%s: same-host and cross-host traffic of the running tasks: ok", when)
		return nil
	}
	if err := traffic("before the disable"); err != nil {
		t.Fatal(err)
	}
	firstTask := func(n *Node) string {
		if tasks := c.RunningTasks(n, "e2e-de"); len(tasks) > 0 {
			return tasks[0]
		}
		return ""
	}
	before := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		before[i] = firstTask(n)
	}
	enableTimeout := cmp.Or(os.Getenv("PLUGIN_ENABLE_TIMEOUT"), "30")
	for _, n := range c.Nodes {
		if _, err := n.Docker("plugin", "disable", "-f", c.Plugin); err != nil {
			t.Fatalf("%s: plugin disable -f: %v", n, err)
		}
		t.Logf("%s: plugin disabled", n)
		if c.HaveHostx() {
			sbs, err := c.Sandboxes(n)
			if err != nil || len(sbs) == 0 {
				t.Errorf("%s: no sandbox left on the host while the plugin is disabled (%v)", n, err)
			}
			t.Logf("%s while disabled: %d sandbox(es) on the host", n, len(sbs))
			// The probes' endpoints go with the plugin: they carry no
			// container.
			if hs, err := c.HealthSandboxes(n); err != nil || len(hs) > 0 {
				t.Errorf("%s: health endpoints left while the plugin is disabled: %v (%v)", n, hs, err)
			}
		}
		if err := traffic(n.String() + "'s plugin disabled"); err != nil {
			t.Error(err)
		}
		if _, err := n.DockerT(c.Scaled(commandTimeout)+time.Minute*3, "plugin", "enable", "--timeout", enableTimeout, c.Plugin); err != nil {
			t.Fatalf("%s: plugin enable: %v", n, err)
		}
		t.Logf("%s: plugin enabled again", n)
	}
	after := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		if after[i] = firstTask(n); after[i] != before[i] {
			t.Errorf("%s: swarm replaced the task %.12s -> %.12s: the check needs the same containers", n, before[i], after[i])
		}
	}
	if err := traffic("after enable"); err != nil {
		t.Error(err)
	}
	// The plugin resumed its networks from its state: Docker's calls for
	// the old tasks succeed, and new tasks (a new Join on the adopted
	// sandbox) work by address and by name.
	if _, err := node0.Docker("rm", "-f", "e2e-de-local"); err != nil {
		t.Errorf("docker rm of the extra container: %v", err)
	}
	if _, err := c.manager().Docker("service", "update", "-d", "--force", "e2e-de"); err != nil {
		t.Fatalf("service update --force: %v", err)
	}
	err = c.Retry(c.TaskTimeout, func() error {
		for i, n := range c.Nodes {
			if task := firstTask(n); task == "" || task == after[i] {
				return fmt.Errorf("%s: task not replaced", n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the service's tasks were not replaced after service update --force: %v", err)
	}
	if err := c.Mesh("e2e-de", "e2e-de", true); err != nil {
		t.Errorf("new tasks on the plugin network do not reach each other after disable -f / enable: %v", err)
	} else {
		t.Log("after enable: new tasks reach each other across hosts, by address and by name")
	}
	if wire != nil {
		st, err := c.NetworkState(node0, "e2e-de")
		if err != nil {
			t.Fatal(err)
		}
		if err := wire.VerifyESP(st.VNI); err != nil {
			t.Error(err)
		}
	}
}
