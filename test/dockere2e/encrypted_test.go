package dockere2e

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// reESP: an error that names the missing kernel support.
var reESP = regexp.MustCompile(`ESP|esp4|GCM|gcm|rfc4106|xfrm|IPsec|ipsec`)

// TestCheckPluginEncrypted is check_plugin_encrypted, (c): --opt encrypted.
// Without ESP in the kernel, a clear refusal; with it, a service and
// containers talking by address and name over ESP, a forced key rotation
// under a sequenced stream losing nothing, no VXLAN of the network in
// clear on the wire, and no SA, policy or nft table left once it is removed.
func TestCheckPluginEncrypted(t *testing.T) {
	c := Start(t)
	if c.ExpectESP {
		encryptedWithESP(c)
		return
	}
	err := c.Network("e2e-enc", c.Plugin, "--opt", "encrypted")
	if err != nil {
		if !reESP.MatchString(err.Error()) {
			t.Fatalf("network create --opt encrypted failed, but the error names no missing kernel support: %v", err)
		}
		t.Logf("network create refused with a clear error: %v", err)
		return
	}
	// Created: swarm allocates networks asynchronously, so the refusal
	// comes from each host's CreateNetwork, and Docker shows it on the
	// failed tasks: `docker service ps --no-trunc`, as the README says.
	if err := c.WebService("e2e-enc", "--mode", "global", "--network", "e2e-enc", "--restart-condition", "none"); err != nil {
		t.Fatal(err)
	}
	var errs string
	for end := time.Now().Add(45 * time.Second); time.Now().Before(end); time.Sleep(3 * time.Second) {
		for _, n := range c.Nodes {
			if len(c.RunningTasks(n, "e2e-enc")) > 0 {
				t.Fatalf("a task runs on encrypted network e2e-enc on %s although the kernel lacks ESP: plaintext network", n)
			}
		}
		if errs = c.TaskErrors("e2e-enc"); reESP.MatchString(errs) {
			break
		}
	}
	if !reESP.MatchString(errs) {
		states, _ := c.manager().Docker("service", "ps", "--format", "{{.CurrentState}}", "e2e-enc")
		t.Fatalf("no task error names the missing kernel support (ESP/GCM) in docker service ps --no-trunc (states: %s; errors: [%s])",
			strings.Join(strings.Fields(states), " "), errs)
	}
	t.Logf("tasks fail with a clear error: %s", errs)
	// The plugin's own account, on every node: `overlay-plugin state`
	// names the refused network and why, and a metric counts it. A node
	// whose task swarm has not tried yet is waited for.
	for _, n := range c.Nodes {
		err := c.Retry(30*time.Second, func() error {
			st, err := c.NetworkState(n, "e2e-enc")
			if err != nil {
				return err
			}
			if st.Refused == nil || !reESP.MatchString(st.Refused.Reason) {
				return fmt.Errorf("%s: overlay-plugin state does not name refused network %s with the reason: %+v", n, st.ID, st.Refused)
			}
			m, err := c.Metrics(n)
			if err != nil || !strings.Contains(m, fmt.Sprintf("overlay_plugin_network_refusals_total{network=%q}", st.ID)) {
				return fmt.Errorf("%s: no overlay_plugin_network_refusals_total for %s (%v)", n, st.ID, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Log("overlay-plugin state and the metrics name the refused network on every node")
}

// encryptedWithESP is check_plugin_encrypted where the kernel has ESP. On
// an encrypted attachable network, a global dnsrr service and a container
// per node: traffic both ways between every two nodes, by address and by
// name; every node's xfrm counters grow; a forced key rotation under a
// sequenced stream loses nothing; once all is removed, nothing is left on
// any node; and a capture all along holds ESP between every two nodes and
// not one VXLAN packet of the network's VNI in clear.
func encryptedWithESP(c *Check) {
	t := c.T
	if !c.HaveHostx() {
		t.Fatal("E2E_NODE_HOSTX is needed to read the hosts' xfrm state")
	}
	wire, err := c.WatchWire()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Network("e2e-enc", c.Plugin, "--attachable", "--opt", "encrypted"); err != nil {
		t.Fatalf("network create --opt encrypted: %v", err)
	}
	if err := c.WebService("e2e-enc", "--mode", "global", "--network", "e2e-enc"); err != nil {
		t.Fatal(err)
	}
	eps, err := c.WebContainers("e2e-enc", "e2e-enc-c")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitTasks("e2e-enc", 1); err != nil {
		t.Fatal(err)
	}
	st, err := c.NetworkState(c.Nodes[0], "e2e-enc")
	if err != nil {
		t.Fatal(err)
	}
	before := make([]uint64, len(c.Nodes))
	for i, n := range c.Nodes {
		before[i], _, _ = c.xfrmPackets(n)
	}
	if err := c.Mesh("e2e-enc", "e2e-enc", true); err != nil {
		t.Fatal(err)
	}
	if err := c.ContainersMesh(eps, "e2e-enc-c", true); err != nil {
		t.Fatal(err)
	}
	for i, n := range c.Nodes {
		after, states, err := c.xfrmPackets(n)
		t.Logf("%s: %d ESP states, xfrm packets %d -> %d", n, states, before[i], after)
		if err != nil || states == 0 || after <= before[i] {
			t.Errorf("%s: traffic on e2e-enc did not go through ESP (states=%d, packets %d -> %d, %v)", n, states, before[i], after, err)
		}
	}
	if t.Failed() {
		return
	}
	if err := c.RotationUnderStream(eps); err != nil {
		t.Error(err)
	}
	if err := c.SecretRollUnderStream(eps); err != nil {
		t.Error(err)
	}
	// Teardown: the plugin removes what it programmed, SAs 20 s after the
	// last endpoint towards a host went (README, Encryption).
	c.RemoveLeavingNothing("e2e-enc", 60*time.Second)
	if err := wire.VerifyESP(st.VNI); err != nil {
		t.Error(err)
	}
}

// xfrmPackets are the packets all ESP states on n's host counted, and how
// many states there are.
func (c *Check) xfrmPackets(n *Node) (pkts uint64, states int, err error) {
	out, err := n.Host("ip", "-s", "xfrm", "state", "list")
	if err != nil {
		return 0, 0, err
	}
	sts, err := testbed.ParseXfrmStates(out)
	for _, s := range sts {
		if s.Proto == "esp" {
			pkts += s.Packets
			states++
		}
	}
	return pkts, states, err
}

// policySPIs is n's outbound SPI per remote host, "vtep=spi ..." sorted.
func (c *Check) policySPIs(n *Node) (string, error) {
	st, err := c.Encryption(n)
	if err != nil {
		return "", err
	}
	if len(st.Remotes) == 0 {
		return "", errors.New("no remote")
	}
	var s []string
	for _, r := range st.Remotes {
		s = append(s, fmt.Sprintf("%v=%d", r.VTEP, r.PolicySPI))
	}
	slices.Sort(s)
	return strings.Join(s, " "), nil
}
