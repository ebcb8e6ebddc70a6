package gossip

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// TestMACConflict: a MAC a remote endpoint holds is refused to a new
// endpoint through Docker's API, and a record arriving by gossip with a
// local endpoint's MAC is refused and counted on each side, never
// programmed over the local endpoint (whose host's containers keep
// reaching it); traffic between the containers works before, and after the
// duplicate goes as fully as before.
func TestMACConflict(t *testing.T) {
	requireTestbed(t)
	const grace = 3 * time.Second
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{DeadGrace: grace}})
	eps := c.withContainers()
	h1, h2 := c.Nodes[0], c.Nodes[1]
	c1 := eps[0]
	c1b := c.addContainer(h1, "c1b") // c1's neighbour on h1
	eps = append(eps, c1b)
	c.waitConverged(converge, "c1b joined")

	// 1. Docker's API: h2 is asked for an endpoint with c1's MAC.
	_, err := h2.Plugin.CreateJoinMAC(c.nw.ID, "/var/run/docker/netns/"+testbed.RandomHex(12), c1.MAC, c.nw.Addrs(c.newSlot())...)
	var perr *testbed.PluginError
	if !errors.As(err, &perr) || !strings.Contains(err.Error(), "MAC "+c1.MAC+" is held by remote endpoint "+c1.ID) {
		c.fatalf("h2 CreateEndpoint with c1's MAC: %v, want a conflict naming c1", err)
	}
	t.Logf("API: %v", err)
	c.checkNow("after the refused endpoint")
	c.checkTraffic(eps, false)

	// 2. Gossip: h2 is cut off past the grace, so that the two sides
	// forget each other's endpoints; h2 then gets an endpoint with c1's
	// MAC (nothing on h2 knows it any more), and the heal brings each side
	// a record with the MAC of one of its own endpoints.
	heal := c.cutGossip(h2)
	c.isolated[h2] = true
	c.waitConverged(grace+converge, "h2 cut off past the grace")
	dup, err := h2.Plugin.CreateJoinMAC(c.nw.ID, "/var/run/docker/netns/"+testbed.RandomHex(12), c1.MAC, c.nw.Addrs(c.newSlot())...)
	if err != nil {
		t.Fatalf("h2, knowing no c1 any more, refused its MAC: %v", err)
	}
	before := map[*testbed.Node]uint64{h1: macConflicts(t, h1), h2: macConflicts(t, h2)}
	heal()
	delete(c.isolated, h2)
	c.waitMembers(converge, "h2 back")
	// Each side refuses the other's holder of the MAC, and counts it.
	err = wait.Until(converge, 100*time.Millisecond, func() error {
		for obs, foreign := range map[*testbed.Node]string{h1: dup.ID, h2: c1.ID} {
			if n := macConflicts(t, obs); n <= before[obs] {
				return fmt.Errorf("%s counts %d MAC conflicts, as before the heal", obs.Name, n)
			}
			st, err := obs.Plugin.Network(c.nw.ID)
			if err != nil {
				return err
			}
			for _, p := range st.Peers {
				if p.EndpointID == foreign {
					return fmt.Errorf("%s took %s, which holds the MAC of its own endpoint", obs.Name, foreign)
				}
			}
			for _, e := range st.Kernel.FDB {
				if e.MAC.String() == c1.MAC {
					return fmt.Errorf("%s sends its own endpoint's MAC %s to %v", obs.Name, c1.MAC, e.VTEP)
				}
			}
		}
		return nil
	})
	if err != nil {
		c.fatalf("after the heal: %v", err)
	}
	t.Logf("gossip: h1 refused h2's %.12s and h2 refused h1's %.12s, both counted", dup.ID, c1.ID)
	// h1's bridge still delivers c1's MAC to c1.
	c.checkTraffic([]*testbed.Endpoint{c1, c1b}, false)

	// The duplicate goes: h2 takes c1's record at last, and every host is
	// as it was.
	if err := c.Leave(dup); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(converge, "the duplicate MAC gone")
	c.checkTraffic(eps, false)
}

// macConflicts reads overlay_plugin_peers_refused_total{reason="mac_conflict"}.
func macConflicts(t *testing.T, n *testbed.Node) uint64 {
	t.Helper()
	v, err := n.Plugin.Metric(`overlay_plugin_peers_refused_total{reason="mac_conflict"}`)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(v)
}
