package gossip

import (
	"testing"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// Containers on three hosts reach each other (ICMP, TCP; IPv4 and IPv6)
// with peers distributed by gossip alone; without the flood option,
// broadcasts stay on their host.
func testReachability(t *testing.T) {
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Secret: true}})
	eps := c.containerPerHost()
	c.waitMembers(converge, "three hosts, h2 and h3 joined h1")
	c.waitConverged(converge, "one container per host")
	c.checkTraffic(eps, true)
	c.broadcastReach(eps, false)
	c.checkNow("after the traffic")
}

// The same over an IPv6 underlay (gossip and VXLAN over IPv6), without a
// cluster secret.
func testReachabilityIPv6Underlay(t *testing.T) {
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Underlay: testbed.IPv6}})
	eps := c.containerPerHost()
	c.waitMembers(converge, "IPv6 underlay")
	c.waitConverged(converge, "IPv6 underlay, one container per host")
	c.checkTraffic(eps, true)
}
