package gossip

import (
	"fmt"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// A host cut off from the switch (link down) is found failed; changes on
// both sides during the partition are right everywhere after the link
// comes back. pastGrace lets the partition outlast the dead grace, so both
// sides purge the other's endpoints and must get them back by re-joining,
// and memberlist's memory of the dead. Either way every host's tables are
// exact within heal of the link coming back.
func testPartition(t *testing.T, pastGrace bool) {
	grace := 60 * time.Second
	if pastGrace {
		grace = 3 * time.Second
	}
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Secret: true, DeadGrace: grace}})
	eps := c.containerPerHost()
	c1, c2, c3 := eps[0], eps[1], eps[2]
	h1, h2, h3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	c.waitMembers(converge, "initial")
	c.waitConverged(converge, "initial")
	c.checkTraffic(eps, false)

	if err := h3.SetLink(false); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	linkUp := false
	defer func() {
		if !linkUp {
			_ = h3.SetLink(true)
		}
	}()
	t.Logf("h3's switch port is down")
	for _, obs := range []*testbed.Node{h1, h2} {
		c.waitNotAlive(obs, "h3", 30*time.Second)
	}
	for _, name := range []string{"h1", "h2"} {
		c.waitNotAlive(h3, name, 30*time.Second)
	}
	seen := time.Now()
	t.Logf("both sides see the partition %v after the cut", seen.Sub(cut).Round(time.Millisecond))

	if pastGrace {
		// Each side purges the other's endpoints after the grace.
		c.isolated[h3] = true
		c.waitConverged(grace+converge, "partition past the dead grace: each side purged the other's endpoints")
	} else {
		// Within the grace nothing is removed.
		c.checkNow("partition within the dead grace: every endpoint still everywhere")
	}

	// Changes on both sides while cut off.
	c.leave(c1)
	c1b := c.addContainer(h1, "c1b")
	c2b := c.addContainer(h2, "c2b")
	c.leave(c3)
	c3b := c.addContainer(h3, "c3b")
	t.Logf("during the partition: c1 left h1, c1b joined h1, c2b joined h2, c3 left h3, c3b joined h3")

	// What each side can know meanwhile.
	c.expect = func(obs *testbed.Node) []*testbed.Endpoint {
		var out []*testbed.Endpoint
		if obs == h3 {
			if !pastGrace {
				out = append(out, c1, c2) // c1's leave cannot reach h3
			}
			return out
		}
		for _, ep := range []*testbed.Endpoint{c1b, c2, c2b} {
			if ep.Host != obs.Host {
				out = append(out, ep)
			}
		}
		if !pastGrace {
			out = append(out, c3) // c3's leave cannot reach h1, h2
		}
		return out
	}
	c.waitConverged(converge, "changes during the partition, each side on its own")
	if !pastGrace {
		if d := time.Since(cut); d > grace/2 {
			t.Fatalf("the partition lasted %v, too close to the %v grace for this variant", d, grace)
		}
	} else if d := 35*time.Second - time.Since(seen); d > 0 {
		// As in the minute-long partition of issue 12: memberlist
		// forgets a dead member 30 s after declaring it dead
		// (GossipToTheDeadTime), and then nothing but a join crosses
		// the cut.
		t.Logf("keeping the partition %v longer, until memberlist forgot the other side", d.Round(time.Second))
		time.Sleep(d)
	}

	if err := h3.SetLink(true); err != nil {
		t.Fatal(err)
	}
	linkUp = true
	healed := time.Now()
	t.Logf("h3's switch port is up again after %v", healed.Sub(cut).Round(time.Millisecond))
	c.expect = nil
	c.isolated = map[*testbed.Node]bool{}
	c.waitConverged(heal, "after the partition")
	t.Logf("healed: tables right %v after the link came back (bound %v)", time.Since(healed).Round(time.Millisecond), heal)
	c.waitMembers(converge, "after the partition")
	// Stays right (no late resurrection by anti-entropy).
	time.Sleep(2 * time.Second)
	c.checkNow("2s after convergence")
	c.checkTraffic([]*testbed.Endpoint{c1b, c2, c2b, c3b}, false)
}

// waitNotAlive waits until obs reports member name in a state other
// than "alive" (gone, purged, or no longer listed).
func (c *gcluster) waitNotAlive(obs *testbed.Node, name string, timeout time.Duration) {
	c.t.Helper()
	start := time.Now()
	err := wait.Until(timeout, 50*time.Millisecond, func() error {
		s, err := obs.MemberState(name)
		if err != nil {
			c.fatalf("%s /v1/cluster: %v", obs.Name, err)
		}
		if s == "alive" {
			return fmt.Errorf("%s still sees %s alive", obs.Name, name)
		}
		c.t.Logf("%s sees %s as %q %v after the fault", obs.Name, name, s, time.Since(start).Round(time.Millisecond))
		return nil
	})
	if err != nil {
		c.fatalf("after the fault: %v", err)
	}
}
