package dockere2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/check"
)

// probeDetect is what issue 22 asks: a blocked path named, and an opened
// one cleared, within 10 s.
const probeDetect = 10 * time.Second

// TestCheckPluginDataPath is check_plugin_datapath: containers of a plugin
// network on every node; `overlay-plugin check`, run on a node's host as
// the README says for a managed plugin, finds nothing wrong with the data
// path. Then the switch drops the VXLAN port (the swarm's data-path port,
// which the plugin follows: UDP 4789 by default) from node1 to node2: the check on
// both exits 1 naming the other node's address and the port within 10 s,
// and is clean again within 10 s of the rule going.
func TestCheckPluginDataPath(t *testing.T) {
	c := Start(t)
	if c.WireNetns == "" {
		t.Skipf("no switch namespace (%s) to filter in", envWireNetns)
	}
	if err := c.Network("e2e-dp", c.Plugin, "--attachable"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WebContainers("e2e-dp", "e2e-dp"); err != nil {
		t.Fatal(err)
	}
	n1, n2 := c.Nodes[0], c.Nodes[1]
	addr := map[*Node]string{}
	for _, n := range []*Node{n1, n2} {
		a, err := n.Docker("info", "-f", "{{.Swarm.NodeAddr}}")
		if err != nil {
			t.Fatal(err)
		}
		addr[n] = a
	}
	other := map[*Node]*Node{n1: n2, n2: n1}
	dp, err := c.DataPathPort()
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(int(dp))
	dataPath := func(r check.Report) []string {
		var out []string
		for _, f := range r.Findings {
			if f.Area == "data path" {
				out = append(out, f.Problem)
			}
		}
		return out
	}
	clean := func(n *Node) error {
		out, _ := c.PluginCLI(n, "check", "--json")
		var r check.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			return fmt.Errorf("%s: overlay-plugin check --json: %w: %.300s", n, err, out)
		}
		up := 0
		for _, p := range r.Paths {
			if p.Peer.String() == addr[other[n]] && p.Path == "vxlan" && p.State == "up" {
				up++
			}
		}
		if f := dataPath(r); len(f) > 0 || up != 1 {
			return fmt.Errorf("%s: the vxlan path to %s up %d times, data-path findings %v", n, addr[other[n]], up, f)
		}
		return nil
	}
	both := func(f func(*Node) error) func() error {
		return func() error { return errors.Join(f(n1), f(n2)) }
	}
	if err := c.Retry(30*time.Second, both(clean)); err != nil {
		t.Fatal(err)
	}

	nft := func(args ...string) error {
		out, err := exec.Command("ip", append([]string{"netns", "exec", c.WireNetns, "nft"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft %v: %w: %s", args, err, out)
		}
		return nil
	}
	if err := nft("add", "table", "bridge", "e2e_block"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nft("delete", "table", "bridge", "e2e_block") })
	for _, args := range [][]string{
		{"add", "chain", "bridge", "e2e_block", "filter", "{ type filter hook forward priority 0; }"},
		{"add", "rule", "bridge", "e2e_block", "filter", "ip", "saddr", addr[n1], "ip", "daddr", addr[n2], "udp", "dport", port, "drop"},
	} {
		if err := nft(args...); err != nil {
			t.Fatal(err)
		}
	}
	blocked := time.Now()
	named := func(n *Node) error {
		out, err := c.PluginCLI(n, "check")
		if err == nil {
			return fmt.Errorf("%s: overlay-plugin check exits 0 with UDP %s blocked:\n%s", n, port, out)
		}
		if !strings.Contains(out, "PROBLEM data path "+addr[other[n]]) || !strings.Contains(out, "UDP "+port) {
			return fmt.Errorf("%s: overlay-plugin check does not name %s and UDP %s:\n%s", n, addr[other[n]], port, out)
		}
		return nil
	}
	if err := c.Retry(probeDetect, both(named)); err != nil {
		t.Fatal(err)
	}
	t.Logf("UDP %s blocked %s -> %s: both nodes' overlay-plugin check named it after %v", port, n1, n2, time.Since(blocked).Round(time.Millisecond))
	out, _ := c.PluginCLI(n2, "check")
	t.Logf("%s: overlay-plugin check:\n%s", n2, out)

	if err := nft("delete", "table", "bridge", "e2e_block"); err != nil {
		t.Fatal(err)
	}
	opened := time.Now()
	if err := c.Retry(probeDetect, both(clean)); err != nil {
		t.Fatal(err)
	}
	t.Logf("cleared on both after %v", time.Since(opened).Round(time.Millisecond))
}
