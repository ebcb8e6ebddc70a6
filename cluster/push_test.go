package cluster

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// A push whose send fails is sent again while the member is alive: with
// streams to n2 cut (its datagrams pass, so it stays alive), n1's new
// endpoint reaches n2 within a retry of the cut healing, long before
// anti-entropy would ship it (n3 holds it back while it settles, n1
// while it is queued).
func TestFailedPushIsRetried(t *testing.T) {
	h := newHarness(t)
	nodes := []*tnode{h.start(1), h.start(2, 1), h.start(3, 1)}
	waitMembers(t, nodes, 3)
	deaf := nodes[1].tr.Addr()
	h.net.SetFilter(func(_, to netip.AddrPort, stream bool) bool { return !stream || to != deaf })
	nodes[0].c.Publish(netA, testPeer("e1", 1))
	want := map[string]ep{"e1": {nodes[0], testPeer("e1", 1)}}
	waitConverged(t, []*tnode{nodes[0], nodes[2]}, netA, want, 5*time.Second)
	wait.For(t, 5*time.Second, tick, "a failed push", func() error {
		if nodes[0].c.Stats().PushErrors == 0 {
			return fmt.Errorf("no push failed yet")
		}
		return nil
	})
	h.net.SetFilter(nil)
	healed := time.Now()
	waitConverged(t, nodes, netA, want, 3*time.Second)
	t.Logf("delivered %v after the heal", time.Since(healed))
	if s := nodes[1].c.Stats(); s.Received.Push == 0 {
		t.Errorf("n2 got e1 by %+v, not by a push", s.Received)
	}
}
