package gossip

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// stepReach bounds how soon an endpoint joined during the roll must be in
// every other host's table: the 2 s, which only an unbroken
// gossip meets (a repair by anti-entropy takes longer).
const stepReach = 2 * time.Second

// keyringView is the part of `overlay-plugin cluster` the roll reads.
type keyringView struct {
	Secrets encryption.SecretsStatus `json:"secrets"`
}

// testSecretRotation is the README's three-step roll of the cluster secret
// on three hosts, each host's file changed in turn (h1's read at once by
// `overlay-plugin reload`, the others' by the plugin's own polling): at
// every change an endpoint joined on the next host is in every host's
// table within 2 s and answers pings, and no host refuses any gossip.
// Then h3 is left behind with the old secret alone: h1 and h2 refuse it,
// and count it, until it gets their file back and rejoins by itself.
func testSecretRotation(t *testing.T) {
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Secret: true, SecretPerHost: true}})
	eps := c.withContainers()
	oldLine := readSecretLine(t, c.Nodes[0].SecretFile)
	newLine := testbed.SecretLine()
	oldID, newID := lineID(t, oldLine), lineID(t, newLine)
	t.Logf("rolling from secret %s to %s", oldID, newID)

	step := 0
	// write changes n's file and waits until n holds what it says.
	write := func(n *testbed.Node, lines ...string) []string {
		t.Helper()
		if err := os.WriteFile(n.SecretFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if n == c.Nodes[0] {
			if err := n.Plugin.Admin.ReloadSecrets(); err != nil {
				c.fatalf("reload on %s: %v", n.Name, err)
			}
		}
		want := make([]string, len(lines))
		for i, l := range lines {
			want[i] = lineID(t, l)
		}
		wait.For(t, 3*time.Second, 50*time.Millisecond, n.Name+" holds the file's secrets", func() error {
			var v keyringView
			if err := n.Plugin.AdminJSON("/v1/cluster", &v); err != nil {
				return err
			}
			if !slices.Equal(v.Secrets.Held, want) {
				return fmt.Errorf("holds %v, want %v", v.Secrets.Held, want)
			}
			return nil
		})
		t.Logf("%s holds %v after %v", n.Name, want, time.Since(start).Round(time.Millisecond))
		return want
	}
	// change is a step of the roll: write, then an endpoint joined on the
	// next host must reach every table within stepReach, and answer.
	change := func(n *testbed.Node, lines ...string) {
		t.Helper()
		want := write(n, lines...)
		step++
		on := c.Nodes[step%len(c.Nodes)]
		ep := c.addContainer(on, fmt.Sprintf("r%d", step))
		eps = append(eps, ep)
		joined := time.Now()
		if _, err := c.WaitConverged(c.nw, c.remotesFor, stepReach, fmt.Sprintf("step %d (%s now %v)", step, n.Name, want)); err != nil {
			c.fatalf("an endpoint joined on %s after %s changed its secrets did not reach every host within %v: %v", on.Name, n.Name, stepReach, err)
		}
		reached := time.Since(joined)
		for _, from := range eps[:len(c.Nodes)] {
			if c.isolated[c.Node(from.Host)] || from.Host == ep.Host {
				continue
			}
			if err := from.Ctr.PingUntil(addr(ep, testbed.IPv4), firstPing); err != nil {
				c.fatalf("step %d: %s -> %s: %v", step, from.Ctr, ep.Ctr, err)
			}
		}
		t.Logf("step %d: r%d on %s in every table after %v", step, step, on.Name, reached.Round(time.Millisecond))
	}
	noRefusals := func(when string, nodes []*testbed.Node) {
		t.Helper()
		for _, n := range nodes {
			if v, err := n.Plugin.Metric(`overlay_plugin_gossip_rejected_total{reason="decrypt"}`); err != nil || v != 0 {
				c.fatalf("%s: %s refused %v gossip messages it could not decrypt (err %v)", when, n.Name, v, err)
			}
		}
	}
	allHold := func(id string, first bool) {
		t.Helper()
		for _, n := range c.Nodes {
			wait.For(t, 10*time.Second, 100*time.Millisecond, n.Name+" sees every member hold "+id, func() error {
				var v keyringView
				if err := n.Plugin.AdminJSON("/v1/cluster", &v); err != nil {
					return err
				}
				if len(v.Secrets.Members) != len(c.Nodes)-1 {
					return fmt.Errorf("%d members listed", len(v.Secrets.Members))
				}
				for _, m := range v.Secrets.Members {
					if !slices.Contains(m.Secrets, id) || first && m.Secrets[0] != id || m.LacksPrimary {
						return fmt.Errorf("%s holds %v (lacks the primary: %v)", m.Name, m.Secrets, m.LacksPrimary)
					}
				}
				return nil
			})
		}
	}

	for _, n := range c.Nodes { // 1: the new secret as the second line
		change(n, oldLine, newLine)
	}
	allHold(newID, false)
	noRefusals("new secret added", c.Nodes)
	for _, n := range c.Nodes { // 2: the new secret first
		change(n, newLine, oldLine)
	}
	allHold(newID, true)
	noRefusals("new secret first", c.Nodes)
	for _, n := range c.Nodes[:2] { // 3: the old line removed (h3 later)
		change(n, newLine)
	}
	noRefusals("old secret removed on h1 and h2", c.Nodes)

	h3 := c.Nodes[2]
	c.isolated[h3] = true
	write(h3, oldLine)
	wait.For(t, 15*time.Second, 200*time.Millisecond, "h1 refuses h3's gossip", func() error {
		v, err := c.Nodes[0].Plugin.Metric(`overlay_plugin_gossip_rejected_total{reason="decrypt"}`)
		if err != nil || v == 0 {
			return fmt.Errorf("refused %v (err %v)", v, err)
		}
		return nil
	})
	c.waitMembers(converge, "h3 left behind with the old secret")

	// The README's way back: h1's file on h3.
	data, err := os.ReadFile(c.Nodes[0].SecretFile)
	if err != nil {
		t.Fatal(err)
	}
	delete(c.isolated, h3)
	back := time.Now()
	change(h3, strings.TrimSpace(string(data)))
	c.waitMembers(converge, "h3 back with the new secret")
	c.waitConverged(converge, "h3 back with the new secret")
	t.Logf("h3 back in the cluster %v after it got the new secret", time.Since(back).Round(time.Millisecond))
	c.checkTraffic(eps[:len(c.Nodes)], false)
}

func readSecretLine(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

func lineID(t *testing.T, line string) string {
	t.Helper()
	ring, _, err := encryption.ParseSecrets([]byte(line))
	if err != nil || len(ring) != 1 {
		t.Fatalf("secret line %q: %v", line, err)
	}
	return ring[0].ID
}
