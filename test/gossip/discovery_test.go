package gossip

import (
	"testing"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// Without --join, Docker's DiscoverNew(Self=false) notifications make the
// hosts join (sent once the control planes run; for hints sent earlier see
// testDiscoveryBeforeControlPlane).
func testDockerDiscovery(t *testing.T) {
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Secret: true, Discovery: true}})
	eps := c.containerPerHost()
	c.waitMembers(converge, "hosts joined through DiscoverNew hints")
	c.waitConverged(converge, "discovery, one container per host")
	c.checkTraffic(eps, false)
}

// Docker's hints sent the moment each plugin answers, as when dockerd
// enables the plugin on every node at once (no --join anywhere): the
// hosts must still find each other.
//
// Calls dockerd makes as soon as the socket appears reach the driver
// before the control plane has started (it waits for the settled address):
// the driver keeps Docker's Self=false hints and replays them when the
// control plane connects. (They were once dropped, and a cluster whose
// hints all came early never formed.)
func testDiscoveryBeforeControlPlane(t *testing.T) {
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Secret: true, Discovery: true, HintsAtStart: true}})
	eps := c.containerPerHost()
	c.waitMembers(converge, "Docker's hints sent as soon as each plugin's socket appeared")
	c.waitConverged(converge, "discovery at plugin start")
	c.checkTraffic(eps, false)
}
