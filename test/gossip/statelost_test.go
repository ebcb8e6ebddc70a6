package gossip

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// TestStateLossCostsNothing: h2's plugin is killed and its state.db
// deleted; restarted, it adopts its sandbox, learns its container's
// endpoint back from the engine and publishes it before settling its own
// records, so the other hosts never drop it: numbered streams into and out
// of h2's container lose nothing through the restart and past the dead
// grace, and `overlay-plugin state` on h2 lists the endpoint by its id.
func TestStateLossCostsNothing(t *testing.T) {
	requireTestbed(t)
	const grace = 3 * time.Second
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{DeadGrace: grace}, engines: true})
	eps := c.withContainers()
	c1, c2, c3 := eps[0], eps[1], eps[2]
	h2 := c.Nodes[1]
	// What h2's engine says of its containers, as Docker would.
	att := dockerengine.Attachment{Name: "c2", EndpointID: c2.ID, MacAddress: c2.MAC}
	for _, a := range c2.Addrs {
		if a.Addr().Is4() {
			att.IPv4Address = a.String()
		} else {
			att.IPv6Address = a.String()
		}
	}
	c.engines[h2.Host].SetContainers(c.nw.ID, att)

	var streams []*testbed.Stream
	for _, p := range [][2]*testbed.Endpoint{{c1, c2}, {c2, c3}} {
		s, err := testbed.StartStream(p[0].Ctr.Netns, p[1].Ctr.Netns, addr(p[1], testbed.IPv4), streamPort, streamEvery)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	stopped := false
	defer func() {
		if !stopped {
			for _, s := range streams {
				s.Stop()
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)

	if err := h2.Plugin.HoldSandboxes(); err != nil {
		t.Fatal(err)
	}
	if err := h2.Plugin.Kill(); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(h2.Plugin.StateDir, "state.db")
	if err := os.Remove(db); err != nil {
		t.Fatal(err)
	}
	t.Logf("h2's plugin killed, %s deleted", db)
	if err := c.Restart(h2); err != nil {
		t.Fatal(err)
	}
	if err := c.Enable(h2); err != nil {
		t.Fatal(err)
	}
	c.waitMembers(converge, "h2 back")
	// Through and past the grace, counted from the kill.
	time.Sleep(grace + 3*time.Second)
	c.waitConverged(converge, "after the grace")

	stopped = true
	var lost []string
	for i, s := range streams {
		st := s.Stop()
		t.Logf("stream %d: %s", i, st)
		if st.Sent == 0 || len(st.Lost) != 0 {
			lost = append(lost, fmt.Sprintf("stream %d: %s", i, st))
		}
	}
	if len(lost) != 0 {
		c.fatalf("traffic of h2's container lost:\n  %s", strings.Join(lost, "\n  "))
	}
	st, err := h2.Plugin.Network(c.nw.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(st.Endpoints, func(e driver.EndpointState) bool { return e.ID == c2.ID && e.Joined }) {
		c.fatalf("h2's state lacks its container's endpoint %s: %+v", c2.ID, st.Endpoints)
	}
	if !strings.Contains(h2.Plugin.Log(), "endpoints recovered from the engine") {
		t.Fatalf("h2's log does not say it recovered endpoints")
	}
	c.checkTraffic(eps, false)
}
