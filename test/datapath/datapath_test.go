// Package datapath holds the data-path probes to account with the real
// plugin on hosts that are network namespaces: a firewall rule in the
// switch that drops UDP 4789 between two hosts, and an MTU clamp on a
// switch port, must each be named by `overlay-plugin check` on both hosts
// within 10 s, shown in the metrics, and cleared within 10 s of the fix.
package datapath

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/check"
	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/dockerengine/enginetest"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m, "datapath") }

var req = testbed.NewRequirement("datapath", func() error {
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("needs the nft command to filter the test switch (package nftables)")
	}
	return nil
})

// detect is what the issue asks: a broken path is named, and a healed
// one cleared, within 10 s. poll is how often the check is asked.
const (
	detect = 10 * time.Second
	poll   = 250 * time.Millisecond
)

// bed is two hosts with the plugin, gossip on, one network and an
// endpoint joined on each, so each programs the other's VTEP.
type bed struct {
	t *testing.T
	c *testbed.Cluster
}

func newBed(t *testing.T, cfg testbed.ClusterConfig) *bed {
	b := startBed(t, cfg)
	b.waitAll("every path up", 30*time.Second, healthy)
	return b
}

// startBed starts the hosts, the network and an endpoint on each.
func startBed(t *testing.T, cfg testbed.ClusterConfig) *bed {
	req.Require(t)
	// With a secret, as a fleet runs: a cluster without one is a finding
	// of its own. This machine's kernel has no ESP, which is one too: the
	// conditions below look at the data path's findings.
	cfg.Hosts, cfg.Gossip, cfg.Secret = 2, true, true
	c, err := testbed.New(t).NewCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nw, err := c.CreateNetwork(testbed.Overlay)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range c.Nodes {
		if _, err := c.Join(n, nw, "/var/run/docker/netns/"+testbed.RandomHex(12), nw.Addrs(i+1)...); err != nil {
			t.Fatal(err)
		}
	}
	return &bed{t: t, c: c}
}

func (b *bed) report(n *testbed.Node) (check.Report, error) {
	var r check.Report
	err := n.Plugin.AdminJSON("/v1/check", &r)
	return r, err
}

// waitAll waits until cond holds for every node's check and returns how
// long that took; it fails the test after limit.
func (b *bed) waitAll(what string, limit time.Duration, cond func(check.Report) error) time.Duration {
	b.t.Helper()
	start := time.Now()
	for {
		var errs []error
		for _, n := range b.c.Nodes {
			r, err := b.report(n)
			if err == nil {
				err = cond(r)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
			}
		}
		if len(errs) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			b.t.Fatalf("%s: not within %v: %v", what, limit, errors.Join(errs...))
		}
		time.Sleep(poll)
	}
}

// saying is a condition: the check fails with a data-path finding about
// the other host that contains every one of words.
func (b *bed) saying(words ...string) func(check.Report) error {
	return func(r check.Report) error {
		for _, f := range r.Findings {
			if f.Area != "data path" {
				continue
			}
			ok := true
			for _, w := range words {
				ok = ok && strings.Contains(f.Problem, w)
			}
			if ok {
				return nil
			}
		}
		return fmt.Errorf("no data-path finding saying %q: %v; paths %+v", words, r.Findings, r.Paths)
	}
}

// healthy: every path probed and up, no data-path finding.
func healthy(r check.Report) error {
	if len(r.Paths) == 0 {
		return errors.New("no path probed")
	}
	for _, p := range r.Paths {
		if p.State != "up" {
			return fmt.Errorf("%s path to %s is %s", p.Path, p.Peer, p.State)
		}
	}
	for _, f := range r.Findings {
		if f.Area == "data path" {
			return fmt.Errorf("finding: %v", f)
		}
	}
	return nil
}

// cli runs `overlay-plugin check` as an operator would and returns its
// output and exit status.
func (b *bed) cli(n *testbed.Node, args ...string) (string, int) {
	b.t.Helper()
	bin, err := testbed.PluginBinary()
	if err != nil {
		b.t.Fatal(err)
	}
	out, err := exec.Command(bin, append([]string{"check", "--admin-socket", n.Plugin.AdminSocket}, args...)...).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		b.t.Fatal(err)
	}
	return string(out), 0
}

// metric reads the plugin's metrics and returns the lines naming name.
func (b *bed) metric(n *testbed.Node, name string) string {
	b.t.Helper()
	body, err := n.Plugin.AdminGet("/metrics")
	if err != nil {
		b.t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, name+"{") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func (b *bed) switchNft(args ...string) {
	b.t.Helper()
	if _, err := b.c.Topo.Switch.Exec(append([]string{"nft"}, args...)...); err != nil {
		b.t.Fatal(err)
	}
}

func TestBlockedVXLANPort(t *testing.T) {
	b := newBed(t, testbed.ClusterConfig{})
	h1, h2 := b.c.Nodes[0], b.c.Nodes[1]
	if out, _ := b.cli(h1); strings.Contains(out, "PROBLEM data path") || !strings.Contains(out, "  up  ") {
		t.Fatalf("check on a healthy cluster:\n%s", out)
	}

	// One direction only, h1 to h2: h1's probes and h1's answers to h2's
	// both die, so both hosts must see it.
	b.switchNft("add", "table", "bridge", "block")
	b.t.Cleanup(func() { b.c.Topo.Switch.Exec("nft", "delete", "table", "bridge", "block") })
	b.switchNft("add", "chain", "bridge", "block", "filter", "{ type filter hook forward priority 0; }")
	b.switchNft("add", "rule", "bridge", "block", "filter", "ip", "saddr", h1.Underlay.String(), "ip", "daddr", h2.Underlay.String(), "udp", "dport", "4789", "drop")
	took := b.waitAll("blocked UDP 4789 named", detect, b.saying("UDP 4789", "gossip with it works", "drops UDP 4789"))
	t.Logf("UDP 4789 blocked h1->h2: both hosts' check named it after %v", took)

	out, code := b.cli(h2)
	if code != 1 || !strings.Contains(out, h1.Underlay.String()) || !strings.Contains(out, "UDP 4789") {
		t.Errorf("overlay-plugin check on h2: exit %d, want 1 naming %s and UDP 4789:\n%s", code, h1.Underlay, out)
	}
	if m := b.metric(h2, "overlay_plugin_datapath_up"); !strings.Contains(m, `path="vxlan",peer="`+h1.Underlay.String()+`",state="down"} 0`) {
		t.Errorf("h2's metric does not show the path down:\n%s", m)
	}

	b.switchNft("delete", "table", "bridge", "block")
	took = b.waitAll("cleared after the rule went", detect, healthy)
	t.Logf("cleared after %v", took)
}

func TestMTUClamp(t *testing.T) {
	b := newBed(t, testbed.ClusterConfig{})
	h1, h2 := b.c.Nodes[0], b.c.Nodes[1]
	// The switch's port to h2 takes in at most 1400 bytes: h2's 1500-byte
	// frames of full-size VXLAN packets are dropped there, silently. Only
	// h2's probes see it; h2 tells h1.
	port := "p2"
	if _, err := b.c.Topo.Switch.IP("link", "set", port, "mtu", "1400"); err != nil {
		t.Fatal(err)
	}
	restore := func() { b.c.Topo.Switch.IP("link", "set", port, "mtu", "1500") }
	t.Cleanup(restore)
	took := b.waitAll("MTU problem named", detect, b.saying("are lost: the network's MTU is 1450"))
	t.Logf("MTU 1400 on the switch: both hosts named it after %v", took)
	r, err := b.report(h1)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range r.Paths {
		// 1400 less the 50 bytes of VXLAN and outer headers, plus the 4
		// of a VLAN tag the kernel's length check lets through.
		if p.Peer == h2.Underlay && (p.PathMTU > 1354 || p.PathMTU < 1335) {
			t.Errorf("h1 measured %d bytes crossing to h2, want 1335..1354", p.PathMTU)
		}
	}
	restore()
	took = b.waitAll("cleared after the MTU came back", detect, healthy)
	t.Logf("cleared after %v", took)
}

// TestOtherVXLANPort: h2 is set to UDP 4790, h1 to 4789 (a node given no
// port would follow the other's). Each host refuses
// the other (its endpoints are not programmed: traffic to them would go to
// a port nobody listens on), and its check names the other's port as a
// settings disagreement with the fix.
func TestOtherVXLANPort(t *testing.T) {
	b := startBed(t, testbed.ClusterConfig{HostArgs: func(h *testbed.Host) []string {
		if h.Name == "h2" {
			return []string{"--vxlan-port", "4790"}
		}
		return []string{"--vxlan-port", "4789"}
	}})
	took := b.waitAll("the other port named", 20*time.Second, func(r check.Report) error {
		for _, f := range r.Findings {
			if f.Area == "settings" && strings.Contains(f.Problem, "set the same --vxlan-port") {
				return nil
			}
		}
		return fmt.Errorf("no settings finding: %v", r.Findings)
	})
	t.Logf("both hosts named the other's VXLAN port after %v", took)
	for _, n := range b.c.Nodes {
		nets, err := n.Plugin.Admin.Networks()
		if err != nil {
			t.Fatal(err)
		}
		for _, nw := range nets {
			for _, p := range nw.Peers {
				if !p.Local {
					t.Errorf("%s programmed %s's endpoint %s of a host on another VXLAN port", n.Name, p.VTEP, p.EndpointID)
				}
			}
		}
		if !strings.Contains(n.Plugin.Log(), `msg="member refused"`) {
			t.Errorf("%s does not log the refusal", n.Name)
		}
	}
}

// TestVXLANPortFollowsDocker: neither host is given a VXLAN port. h1's
// engine, a manager's, says the swarm's data-path port is 4790; h2's says
// nothing, as a worker's does. h1 takes Docker's port, h2 takes it from h1
// over the gossip, both store it, and the data path works on it. A restart
// of h2 keeps it from its state database.
func TestVXLANPortFollowsDocker(t *testing.T) {
	e := enginetest.New()
	e.SetSwarm(true, nil, nil)
	e.SetDataPathPort(4790)
	sock := filepath.Join(t.TempDir(), "engine.sock")
	e.Serve(t, sock)
	b := newBed(t, testbed.ClusterConfig{HostArgs: func(h *testbed.Host) []string {
		if h.Name == "h1" {
			return []string{"--docker-socket", sock}
		}
		return nil
	}})
	for _, n := range b.c.Nodes {
		var st struct {
			Members []cluster.Member `json:"members"`
		}
		if err := n.Plugin.AdminJSON("/v1/cluster", &st); err != nil {
			t.Fatal(err)
		}
		for _, m := range st.Members {
			if m.Settings.VXLANPort != 4790 || !m.Settings.Swarm {
				t.Errorf("%s sees %s on VXLAN port %d (follows Docker: %v), want 4790 following Docker", n.Name, m.Name, m.Settings.VXLANPort, m.Settings.Swarm)
			}
		}
	}
	from := map[string]string{"h1": `from="Docker's data-path port"`, "h2": `from="member `}
	for _, n := range b.c.Nodes {
		if log := n.Plugin.Log(); !strings.Contains(log, `msg="VXLAN port settled" port=4790 `+from[n.Name]) {
			t.Errorf("%s does not log its port as settled on 4790 %s", n.Name, from[n.Name])
		}
	}
	h2 := b.c.Nodes[1]
	if err := h2.Plugin.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.c.Restart(h2); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(h2.Plugin.Log(), `msg="VXLAN port settled" port=4790 from=state`) {
		if time.Now().After(deadline) {
			t.Fatal("h2's restart does not take its port from the state database")
		}
		time.Sleep(poll)
	}
}
