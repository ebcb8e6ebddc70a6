package dockere2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Port is what the checks' web tasks serve HTTP on.
const Port = 8080

// webCmd serves the task's host name over HTTP on Port.
var webCmd = []string{"sh", "-c", fmt.Sprintf("hostname >/www/index.html; exec httpd -f -p %d -h /www", Port)}

// Check is one running check: the swarm, and what the check made there,
// removed when the test ends (services, then containers, then networks).
type Check struct {
	*Env
	T          *testing.T
	services   []string
	containers map[*Node][]string
	networks   []string
}

// Start sets a check up, or skips t without the e2e environment.
func Start(t *testing.T) *Check {
	t.Helper()
	c := &Check{Env: Setup(t), T: t, containers: map[*Node][]string{}}
	t.Cleanup(c.remove)
	return c
}

func (c *Check) manager() *Node { return c.Nodes[0] }

// Network creates a swarm-scope network on the manager; the error holds
// Docker's message.
func (c *Check) Network(name, driver string, args ...string) error {
	argv := append([]string{"network", "create", "-d", driver, "--scope", "swarm"}, args...)
	id, err := c.manager().Docker(append(argv, name)...)
	if err != nil {
		return err
	}
	c.networks = append(c.networks, name)
	c.T.Logf("network %s (%s %v) = %.12s", name, driver, args, id)
	return nil
}

// Service creates a service, detached, with the args given.
func (c *Check) Service(name string, args ...string) error {
	c.services = append(c.services, name)
	id, err := c.manager().Docker(append([]string{"service", "create", "-d", "--name", name, "--no-resolve-image"}, args...)...)
	if err != nil {
		return err
	}
	c.T.Logf("service %s %v = %.12s", name, args, id)
	return nil
}

// WebService is a dnsrr service whose tasks serve their node's host name
// over HTTP on Port.
func (c *Check) WebService(name string, args ...string) error {
	argv := append([]string{"--endpoint-mode", "dnsrr", "--hostname", "{{.Node.Hostname}}", "--stop-grace-period", "1s"}, args...)
	return c.Service(name, append(append(argv, c.Image), webCmd...)...)
}

// RunContainer runs a detached container on n and returns its id.
func (c *Check) RunContainer(n *Node, name string, args ...string) (string, error) {
	id, err := n.Docker(append([]string{"run", "-d", "--name", name}, args...)...)
	if err != nil {
		return "", err
	}
	c.containers[n] = append(c.containers[n], name)
	return id, nil
}

// RunningTasks are the running task containers of svc on n.
func (c *Check) RunningTasks(n *Node, svc string) []string {
	out, _ := n.Docker("ps", "-q", "-f", "label=com.docker.swarm.service.name="+svc, "-f", "status=running")
	return strings.Fields(out)
}

// allTasks are svc's containers, in any state, on every node.
func (c *Check) allTasks(svc string) int {
	k := 0
	for _, n := range c.Nodes {
		out, _ := n.Docker("ps", "-aq", "-f", "label=com.docker.swarm.service.name="+svc)
		k += len(strings.Fields(out))
	}
	return k
}

// TaskErrors are the distinct errors of svc's tasks, most frequent first.
func (c *Check) TaskErrors(svc string) string {
	out, _ := c.manager().Docker("service", "ps", "--no-trunc", "--format", "{{.Error}}", svc)
	count := map[string]int{}
	for l := range strings.SplitSeq(out, "\n") {
		if l != "" {
			count[l]++
		}
	}
	errs := make([]string, 0, len(count))
	for e := range count {
		errs = append(errs, e)
	}
	slices.SortFunc(errs, func(a, b string) int { return count[b] - count[a] })
	var b strings.Builder
	for i, e := range errs {
		if i == 3 {
			break
		}
		fmt.Fprintf(&b, "%dx %s; ", count[e], e)
	}
	return b.String()
}

func (c *Check) failedTasks(svc string) int {
	out, _ := c.manager().Docker("service", "ps", "--format", "{{.CurrentState}}", svc)
	k := 0
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(l, "Failed") || strings.HasPrefix(l, "Rejected") {
			k++
		}
	}
	return k
}

// WaitTasks waits until every node runs perNode tasks of svc, giving up
// early when they keep failing.
func (c *Check) WaitTasks(svc string, perNode int) error {
	start := time.Now()
	for {
		ok := true
		for _, n := range c.Nodes {
			if len(c.RunningTasks(n, svc)) != perNode {
				ok = false
			}
		}
		if ok {
			return nil
		}
		if time.Since(start) >= 15*time.Second && c.failedTasks(svc) >= 2*len(c.Nodes) {
			return fmt.Errorf("service %s: tasks keep failing: %s", svc, c.TaskErrors(svc))
		}
		if time.Since(start) >= c.TaskTimeout {
			ps, _ := c.manager().Docker("service", "ps", "--no-trunc", svc)
			c.T.Logf("tasks of %s after %v:\n%s", svc, c.TaskTimeout, ps)
			return fmt.Errorf("service %s: not %d running task(s) on each of %d nodes after %v; errors: %s",
				svc, perNode, len(c.Nodes), c.TaskTimeout, c.TaskErrors(svc))
		}
		time.Sleep(time.Second)
	}
}

// IP is container cid's address on network net.
func (c *Check) IP(n *Node, cid, net string) (string, error) {
	return n.Docker("inspect", "-f", fmt.Sprintf(`{{with index .NetworkSettings.Networks %q}}{{.IPAddress}}{{end}}`, net), cid)
}

// Retry runs f until it succeeds or limit (times the scale) passes, and
// returns its last error.
func (c *Check) Retry(limit time.Duration, f func() error) error {
	end := time.Now().Add(c.Scaled(limit))
	for {
		err := f()
		if err == nil || time.Now().After(end) {
			return err
		}
		time.Sleep(time.Second)
	}
}

// remove takes down what the check made; a network is retried while its
// last tasks leave it.
func (c *Check) remove() {
	for _, s := range c.services {
		_, _ = c.manager().Docker("service", "rm", s)
	}
	for n, names := range c.containers {
		_, _ = n.Docker(append([]string{"rm", "-f"}, names...)...)
	}
	for _, s := range c.services {
		for range 60 {
			if c.allTasks(s) == 0 {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	for _, net := range c.networks {
		for range 20 {
			if _, err := c.manager().Docker("network", "rm", net); err == nil {
				break
			}
			if _, err := c.manager().Docker("network", "inspect", net); err != nil {
				break
			}
			time.Sleep(time.Second)
		}
	}
	c.services, c.networks, c.containers = nil, nil, map[*Node][]string{}
}
