package dockere2e

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCheckPluginVIP is check_plugin_vip, (h): services in Docker's
// default endpoint mode (VIP) on a plugin network. A 3-replica service
// answers by name from a container on every node, each task in turn; it
// follows scale 1, 0 (nothing answers) and 3; removed, it leaves no rule in
// the containers. Then a `docker stack deploy` of two services, one
// calling the other by name.
func TestCheckPluginVIP(t *testing.T) {
	c := Start(t)
	const net, svc, cl = "e2e-vip", "e2e-vip", "e2e-vipc"
	if err := c.Network(net, c.Plugin, "--attachable"); err != nil {
		t.Fatalf("docker network create -d %s: %v", c.Plugin, err)
	}
	args := append([]string{"--replicas", "3", "--network", net, "--hostname", "task{{.Task.Slot}}", "--stop-grace-period", "1s", c.Image}, webCmd...)
	if err := c.Service(svc, args...); err != nil {
		t.Fatal(err)
	}
	// The clients are dnsrr: no VIP of their own, so that once the service
	// goes their namespaces must hold no table at all.
	if err := c.Service(cl, "--mode", "global", "--network", net, "--endpoint-mode", "dnsrr", "--stop-grace-period", "1s", c.Image, "sleep", "3600"); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTasks(cl, 1); err != nil {
		t.Fatal(err)
	}
	clients := make([]Endpoint, len(c.Nodes))
	for i, n := range c.Nodes {
		clients[i] = Endpoint{Node: n, CID: c.RunningTasks(n, cl)[0], Host: n.String()}
	}
	scale := func(k int, want ...string) {
		t.Helper()
		if _, err := c.manager().Docker("service", "scale", "-d", fmt.Sprintf("%s=%d", svc, k)); err != nil {
			t.Fatalf("service scale %s=%d: %v", svc, k, err)
		}
		if err := c.waitRunningTotal(svc, k); err != nil {
			t.Fatal(err)
		}
		for _, ep := range clients {
			if err := c.vipExpect(ep, svc, want); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.waitRunningTotal(svc, 3); err != nil {
		t.Fatal(err)
	}
	for _, ep := range clients {
		t.Logf("%s: %s resolves to %v (the VIP)", ep.Node, svc, ep.Resolve(svc))
		if err := c.vipExpect(ep, svc, []string{"task1", "task2", "task3"}); err != nil {
			t.Fatal(err)
		}
	}
	scale(1, "task1")
	// With no task, Docker drops the name's record and the service from
	// its listing (as on its own overlay): nothing may answer.
	if _, err := c.manager().Docker("service", "scale", "-d", svc+"=0"); err != nil {
		t.Fatalf("service scale %s=0: %v", svc, err)
	}
	if err := c.waitRunningTotal(svc, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	for _, ep := range clients {
		if out, err := ep.Get(svc, Port); err == nil {
			t.Fatalf("%s: %s with no task answered: %s", ep.Node, svc, out)
		}
		t.Logf("%s: %s with no task: no answer", ep.Node, svc)
	}
	scale(3, "task1", "task2", "task3")

	if _, err := c.manager().Docker("service", "rm", svc); err != nil {
		t.Fatalf("service rm %s: %v", svc, err)
	}
	if c.HaveHostx() {
		for _, ep := range clients {
			err := c.Retry(15*time.Second, func() error {
				if left := c.lbTables(ep); left != "" {
					return fmt.Errorf("%s: the client still holds [%s] after %s was removed", ep.Node, left, svc)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		t.Log("after service rm: no load-balancing table left in the clients")
	}
	c.vipStack()
}

// waitRunningTotal waits until svc runs k tasks over all nodes.
func (c *Check) waitRunningTotal(svc string, k int) error {
	end := time.Now().Add(c.TaskTimeout)
	for {
		got := c.runningTotal(svc)
		if got == k {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("service %s: %d running tasks, want %d, after %v", svc, got, k, c.TaskTimeout)
		}
		time.Sleep(time.Second)
	}
}

// vipNames are the answers of k requests from ep to http://name:Port/,
// counted: one exec for all (a docker exec costs seconds in the emulated
// VM), each wget its own connection, balanced on its own.
func vipNames(ep Endpoint, name string, k int) map[string]int {
	out, _ := ep.Node.Exec(ep.CID, "sh", "-c", `n=$1; while [ "$n" -gt 0 ]; do timeout 3 wget -q -O- "$2"; echo; n=$((n - 1)); done; true`,
		"sh", strconv.Itoa(k), fmt.Sprintf("http://%s:%d/", name, Port))
	got := map[string]int{}
	for l := range strings.SplitSeq(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			got[l]++
		}
	}
	return got
}

// vipExpect: within 15 s, 30 requests from ep to name are answered by
// exactly the tasks in want, each at least once.
func (c *Check) vipExpect(ep Endpoint, name string, want []string) error {
	var got map[string]int
	err := c.Retry(15*time.Second, func() error {
		got = vipNames(ep, name, 30)
		if !slices.Equal(slices.Sorted(maps.Keys(got)), want) {
			return fmt.Errorf("%s: 30 requests to %s answered by %v, want each of %v", ep.Node, name, got, want)
		}
		return nil
	})
	if err == nil {
		c.T.Logf("%s: 30 requests to %s: %v", ep.Node, name, got)
	}
	return err
}

// lbTables is the plugin's load-balancing table in ep's container, read
// from the host ("" when none).
func (c *Check) lbTables(ep Endpoint) string {
	pid, err := ep.Node.Docker("inspect", "-f", "{{.State.Pid}}", ep.CID)
	if err != nil {
		return "inspect: " + err.Error()
	}
	out, _ := ep.Node.Host("nsenter", "--net=/proc/"+pid+"/ns/net", "nft", "list", "tables")
	var left []string
	for l := range strings.SplitSeq(out, "\n") {
		if strings.Contains(l, "overlay_plugin") {
			left = append(left, l)
		}
	}
	return strings.Join(left, "; ")
}

// vipStack: `docker stack deploy` of a compose file, unchanged from what
// Docker's own overlay takes but for the driver: "front" serves what it
// fetched from "api" by name, through api's VIP; a client reads it through
// front's VIP on every node.
func (c *Check) vipStack() {
	t := c.T
	const stack = "e2evs"
	compose := fmt.Sprintf(`version: "3.8"
services:
  api:
    image: %[1]s
    command: ["sh", "-c", "echo api-says-hello >/www/index.html; exec httpd -f -p %[2]d -h /www"]
    deploy: {replicas: 2}
    networks: [app]
  front:
    image: %[1]s
    command: ["sh", "-c", "while :; do wget -q -O /www/index.html.new http://api:%[2]d/ && mv /www/index.html.new /www/index.html; sleep 1; done & exec httpd -f -p %[2]d -h /www"]
    deploy: {replicas: 2}
    networks: [app]
  client:
    image: %[1]s
    command: ["sleep", "3600"]
    deploy: {mode: global}
    networks: [app]
networks:
  app:
    driver: %[3]s
`, c.Image, Port, c.Plugin)
	file := filepath.Join(t.TempDir(), "stack.yml")
	if err := os.WriteFile(file, []byte(compose), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := c.manager().Docker("stack", "deploy", "--resolve-image", "never", "-c", file, stack)
	c.services = append(c.services, stack+"_front", stack+"_api", stack+"_client")
	c.networks = append(c.networks, stack+"_app")
	if ls, _ := c.manager().Docker("stack", "ls", "--format", "{{.Name}}"); !slices.Contains(strings.Fields(ls), stack) {
		t.Fatalf("stack deploy: %s %v", out, err)
	}
	t.Logf("docker stack deploy %s: %s", stack, out)
	if err := c.WaitTasks(stack+"_client", 1); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"_front", "_api"} {
		if err := c.waitRunningTotal(stack+s, 2); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes {
		ep := Endpoint{Node: n, CID: c.RunningTasks(n, stack+"_client")[0]}
		var body string
		err := c.Retry(30*time.Second, func() error {
			var err error
			if body, err = ep.Get("front", Port); err == nil && body != "api-says-hello" {
				err = fmt.Errorf("answered %.100q", body)
			}
			return err
		})
		if err != nil {
			t.Fatalf("%s: http://front:%d/: %v, want what front fetched from api", n, Port, err)
		}
		t.Logf("%s: client -> front (VIP) -> api (VIP): %s", n, body)
	}
	_, _ = c.manager().Docker("stack", "rm", stack)
}
