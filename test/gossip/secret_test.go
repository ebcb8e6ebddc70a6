package gossip

import (
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// A host whose secret differs from the others' cannot join: its endpoint
// never shows up elsewhere, while the two hosts sharing a secret work.
func testSecretMismatch(t *testing.T) {
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Secret: true, OddSecret: map[int]bool{2: true}}})
	h3 := c.Nodes[2]
	c.isolated[h3] = true
	started := time.Now()
	eps := c.containerPerHost()
	c.waitMembers(converge, "h3 with another secret")
	c.waitConverged(converge, "h1 and h2 share a secret, h3 isolated")
	c.checkTraffic(eps[:2], false)
	// Watch long enough for h3's first join and at least one rejoin round
	// (every 10 s): it must stay out the whole time.
	watchUntil := started.Add(14 * time.Second)
	checks := 0
	for time.Now().Before(watchUntil) {
		if d := c.membershipDiffs(); len(d) > 0 {
			c.fatalf("h3 with a different secret: %s", strings.Join(d, "\n  "))
		}
		if d := c.diffs(false); len(d) > 0 {
			c.fatalf("h3 with a different secret: %s", strings.Join(d, "\n  "))
		}
		checks++
		time.Sleep(500 * time.Millisecond)
	}
	c.checkNow("h3 with a different secret, at the end of the watch")
	for _, a := range eps[:2] {
		if err := a.Ctr.PingFails(addr(eps[2], testbed.IPv4), 2); err != nil {
			c.fatalf("%v", err)
		}
	}
	t.Logf("h3 stayed out of the cluster for %v (%d checks); c1 and c2 cannot reach c3", time.Since(started).Round(time.Millisecond), checks)
}
