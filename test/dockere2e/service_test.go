package dockere2e

import (
	"fmt"
	"strings"
	"testing"
)

// TestCheckPluginService is check_plugin_service, (a): a plugin network, a
// global dnsrr service whose tasks reach each other by address and through
// tasks.<svc>, that network's VXLAN in clear on the wire (the capture's
// proof, where the encrypted checks must find none), and the metrics on
// each node's admin socket counting the endpoints and Docker's calls.
func TestCheckPluginService(t *testing.T) {
	c := Start(t)
	wire, err := c.WatchWire()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.GlobalMesh("e2e-plug", c.Plugin); err != nil {
		t.Fatal(err)
	}
	if !c.HaveHostx() {
		return
	}
	st, err := c.NetworkState(c.Nodes[0], "e2e-plug")
	if err != nil {
		t.Fatal(err)
	}
	if err := wire.VerifyClear(st.VNI); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		m, err := c.Metrics(n)
		if err != nil {
			t.Fatalf("%s: no metrics on the admin socket: %v", n, err)
		}
		for _, want := range []string{
			fmt.Sprintf(`overlay_plugin_network_endpoints{joined="true",network=%q`, st.ID),
			fmt.Sprintf(`overlay_plugin_network_remote_endpoints{network=%q`, st.ID),
			`overlay_plugin_driver_calls_total{call="Join",outcome="ok"}`,
			fmt.Sprintf("overlay_plugin_gossip_members_alive %d", len(c.Nodes)),
		} {
			if !strings.Contains(m, want) {
				t.Fatalf("%s: metrics lack %s", n, want)
			}
		}
	}
	t.Log("metrics on every node's admin socket count the network's endpoints and Docker's calls")
}
