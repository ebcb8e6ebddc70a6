package gossip

import (
	"testing"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// A network with the flood option has an all-zero FDB entry to every
// remote VTEP with endpoints, and broadcasts reach the other hosts; the
// entry goes with the VTEP's last endpoint.
func testFlood(t *testing.T) {
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Secret: true}, flood: true})
	eps := c.containerPerHost()
	c.waitConverged(converge, "flood network, one container per host")
	c.checkTraffic(eps, false)
	c.broadcastReach(eps, true)
	c.leave(eps[2])
	c.waitConverged(converge, "flood network after c3 left: h3's flood entries gone")
	c.broadcastReach(eps[:2], true)
}
