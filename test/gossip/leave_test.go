package gossip

import (
	"slices"
	"strings"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// An endpoint that leaves disappears from every other host's tables; a new
// endpoint on the same host re-using its addresses (new MAC) replaces it
// everywhere.
func testLeave(t *testing.T) {
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Secret: true}})
	eps := c.containerPerHost()
	c.waitConverged(converge, "initial")
	c.checkTraffic(eps, false)
	c2 := eps[1]
	c.leave(c2)
	c.waitConverged(converge, "c2 left h2 (Leave, DeleteEndpoint)")
	// Spelled out, though the exact comparison above implies it.
	for _, n := range []*testbed.Node{c.Nodes[0], c.Nodes[2]} {
		st, err := n.Plugin.Network(c.nw.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, nb := range st.Kernel.Neighbors {
			if slices.Contains(c2.IPs(), nb.IP) {
				c.fatalf("%s still has a neighbour entry for %s of departed c2", n.Name, nb.IP)
			}
		}
		for _, f := range st.Kernel.FDB {
			if f.MAC.String() == c2.MAC {
				c.fatalf("%s still has an FDB entry for %s of departed c2", n.Name, c2.MAC)
			}
		}
	}
	c.checkTraffic([]*testbed.Endpoint{eps[0], eps[2]}, false)

	// IP reuse: a new container takes c2's addresses.
	slot := 2 // c2 was the second slot handed out
	if got := c.nw.Addrs(slot); !slices.Equal(got, c2.Addrs) {
		t.Fatalf("slot bookkeeping: slot %d is %v, c2 had %v", slot, got, c2.Addrs)
	}
	c2b := c.addContainerAt(c.Nodes[1], "c2b", slot)
	if c2b.MAC == c2.MAC {
		t.Logf("note: the plugin gave the re-created endpoint the same MAC %s", c2b.MAC)
	}
	c.waitConverged(converge, "c2b re-uses c2's addresses on h2")
	// The data path to the re-used addresses, from a container whose
	// neighbour cache never held c2's MAC. (Containers that talked to c2
	// keep its old MAC cached: see testAddressReuseWarmCache.)
	c3n := c.addContainer(c.Nodes[2], "c3n")
	c.waitConverged(converge, "c3n joined h3")
	c.checkTraffic([]*testbed.Endpoint{c3n, c2b}, false)
}

// A container that talked to an endpoint reaches the endpoint that takes
// over its addresses (swarm's IPAM re-uses them) without a long blackout.
//
// When dockerd gives no MAC, the plugin derives it from the address, as
// Docker's overlay does, so the new endpoint has the MAC the peers'
// containers have cached. (A random MAC per endpoint once cost 30-40 s of
// blackout here, until the kernel's neighbour timers expired; gratuitous
// ARPs cannot cross hosts without flood.)
func testAddressReuseWarmCache(t *testing.T) {
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Secret: true}})
	eps := c.containerPerHost()
	c.waitConverged(converge, "initial")
	c.checkTraffic(eps, false) // warms every container's neighbour cache
	c2 := eps[1]
	c.leave(c2)
	c.waitConverged(converge, "c2 left h2")
	c2b := c.addContainerAt(c.Nodes[1], "c2b", 2)
	if !slices.Equal(c2b.Addrs, c2.Addrs) {
		t.Fatalf("c2b has %v, want c2's %v", c2b.Addrs, c2.Addrs)
	}
	c.waitConverged(converge, "c2b re-uses c2's addresses on h2")
	for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		dst := addr(c2b, fam)
		if err := eps[0].Ctr.PingUntil(dst, firstPing); err != nil {
			out, _ := eps[0].Ctr.IP("-j", "neigh", "show", dst.String())
			c.fatalf("%v: c1 -> c2b at c2's old address: %v\nc1's neighbour entry: %s\n(c2's old MAC %s, c2b's MAC %s)",
				fam, err, strings.TrimSpace(out), c2.MAC, c2b.MAC)
		}
	}
	c.checkTraffic([]*testbed.Endpoint{eps[0], c2b, eps[2]}, false)
}
