package cluster

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/overlay-plugin/overlay-plugin/driver"
)

// The driver and the cluster plug into each other.
var (
	_ driver.ControlPlane = (*Cluster)(nil)
	_ Sink                = (*driver.Driver)(nil)
)

// TestHundredNodes checks that 100 nodes run in one process (no global
// state, bounded goroutines) and converge. It takes tens of seconds under
// -race on two cores, so it runs only when asked for.
func TestHundredNodes(t *testing.T) {
	if os.Getenv("CLUSTER_SCALE") == "" {
		t.Skip("100-node run is slow (tens of seconds under -race); set CLUSTER_SCALE=1 to run it")
	}
	const n = 100
	h := newHarness(t)
	h.tweak = func(c *memberlist.Config) {
		fastTimers(c)
		c.ProbeInterval = 500 * time.Millisecond
		c.ProbeTimeout = 200 * time.Millisecond
		c.GossipInterval = 50 * time.Millisecond
		c.PushPullInterval = 5 * time.Second
		c.SuspicionMult = 4
		c.TCPTimeout = 2 * time.Second
	}
	before := runtime.NumGoroutine()
	start := time.Now()
	nodes := []*tnode{h.start(1)}
	for i := 2; i <= n; i++ {
		nodes = append(nodes, h.start(i, 1+(i%3)))
	}
	waitMembersWithin(t, nodes, n, 60*time.Second)
	t.Logf("%d nodes joined in %v; %d goroutines (%d per node)", n, time.Since(start), runtime.NumGoroutine()-before, (runtime.NumGoroutine()-before)/n)
	start = time.Now()
	want := map[string]ep{}
	for i, nd := range nodes {
		eid := fmt.Sprintf("%064x", i)
		p := testPeer(eid, i)
		nd.c.Publish(netA, p)
		want[eid] = ep{nd, p}
	}
	waitConverged(t, nodes, netA, want, 60*time.Second)
	t.Logf("%d endpoints converged on %d nodes in %v", n, n, time.Since(start))
	var sent, recv uint64
	for _, nd := range nodes {
		sent += nd.tr.BytesSent.Load()
		recv += nd.c.Stats().BytesReceived
	}
	t.Logf("wire bytes sent (all memberlist traffic) %d, cluster payload received %d", sent, recv)
}
