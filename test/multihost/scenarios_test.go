package multihost

import (
	"fmt"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

func runTwoHosts(t *testing.T, fam testbed.Family) {
	requireTestbed(t)
	c := setup(t, fam, 2)
	c.checkState(t)
	c.checkTraffic(t)
	c.teardown(t)
}

// TestTwoHostsIPv4Underlay: two hosts on an IPv4 underlay carry IPv4 and
// IPv6 container traffic over VXLAN.
func TestTwoHostsIPv4Underlay(t *testing.T) { runTwoHosts(t, testbed.IPv4) }

// TestTwoHostsIPv6Underlay: the same over an IPv6 underlay.
func TestTwoHostsIPv6Underlay(t *testing.T) { runTwoHosts(t, testbed.IPv6) }

// TestPeerDeleteStopsTraffic: deleting a peer through the admin API removes
// its kernel entries and cuts traffic to it; adding it back restores both.
func TestPeerDeleteStopsTraffic(t *testing.T) {
	requireTestbed(t)
	c := setup(t, testbed.IPv4, 2)
	n1, n2 := c.nodes[0], c.nodes[1]
	c.checkState(t)
	// Traffic flows first, so that a failure below is due to the delete,
	// with the containers' neighbour caches warm (c1 keeps sending to c2's
	// MAC: only the plugin's entries can stop it).
	for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		for _, p := range [][2]*node{{n1, n2}, {n2, n1}} {
			dst, _ := p[1].ep.Ctr.Addr(fam)
			if err := p[0].ep.Ctr.PingUntil(dst, firstPing); err != nil {
				t.Fatalf("before delete, %v: %v", fam, err)
			}
		}
	}

	if err := n1.Plugin.Admin.DeletePeer(c.nw.ID, n2.ep.ID); err != nil {
		t.Fatalf("h1 DeletePeer: %v", err)
	}
	// Deletes may repeat.
	if err := n1.Plugin.Admin.DeletePeer(c.nw.ID, n2.ep.ID); err != nil {
		t.Fatalf("h1 DeletePeer again: %v", err)
	}
	c.checkState(t, n1)
	for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		d2, _ := n2.ep.Ctr.Addr(fam)
		d1, _ := n1.ep.Ctr.Addr(fam)
		if err := n1.ep.Ctr.PingFails(d2, 2); err != nil {
			t.Errorf("after h1 deleted c2's peer, %v: %v", fam, err)
		}
		// c1 still receives c2's requests, but its replies have no way back.
		if err := n2.ep.Ctr.PingFails(d1, 2); err != nil {
			t.Errorf("after h1 deleted c2's peer, %v: %v", fam, err)
		}
	}

	if err := n2.Plugin.Admin.DeletePeer(c.nw.ID, n1.ep.ID); err != nil {
		t.Fatalf("h2 DeletePeer: %v", err)
	}
	c.checkState(t, n1, n2)

	// Restore: the same peers bring traffic back.
	if err := n1.Plugin.Admin.AddPeer(c.nw.ID, n2.ep.Peer()); err != nil {
		t.Fatal(err)
	}
	if err := n2.Plugin.Admin.AddPeer(c.nw.ID, n1.ep.Peer()); err != nil {
		t.Fatal(err)
	}
	c.checkState(t)
	c.checkTraffic(t)
	c.teardown(t)
}

// TestRestartResumesState: SIGTERM while containers are joined exits 0,
// and plugins started again on the same state know the network and its
// endpoints, so Docker's later calls for the old containers succeed and
// tear everything down. Here each plugin runs in a private mount namespace
// (`ip netns exec`), so its sandbox mounts die with it and the endpoints
// come back unjoined. A managed plugin's sandboxes sit on a host mount and
// survive (scripts/e2e-docker.sh checks that), and the driver's tests cover
// adopting a surviving sandbox.
func TestRestartResumesState(t *testing.T) {
	requireTestbed(t)
	c := setup(t, testbed.IPv4, 2)
	n1, n2 := c.nodes[0], c.nodes[1]
	d2, _ := n2.ep.Ctr.Addr(testbed.IPv4)
	if err := n1.ep.Ctr.PingUntil(d2, firstPing); err != nil {
		t.Fatal(err)
	}
	c.stopPlugins(t)
	for _, n := range c.nodes {
		if err := c.Restart(n.Node); err != nil {
			t.Fatalf("%s: restart on the same state: %v", n.Name, err)
		}
		p := n.Plugin
		nets, err := p.Admin.Networks()
		if err != nil || len(nets) != 1 || nets[0].ID != c.nw.ID || nets[0].Sandbox != "" ||
			len(nets[0].Endpoints) != 1 || nets[0].Endpoints[0].Joined {
			t.Fatalf("%s: restarted plugin lists %+v %v, want the network with its endpoint, unjoined (its sandbox is gone)", n.Name, nets, err)
		}
	}
	// The lost sandbox takes the container's interface with it: the veth
	// pair goes when the kernel frees the namespace, which it does in the
	// background, so the interface may still be there for a moment.
	for _, n := range c.nodes {
		err := wait.Until(10*time.Second, 20*time.Millisecond, func() error {
			if links, err := n.ep.Ctr.Links(); err != nil || len(links) != 1 {
				return fmt.Errorf("the container still has %v (%v)", links, err)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: after its sandbox was lost: %v", n.Name, err)
		}
	}
	c.teardown(t)
}
