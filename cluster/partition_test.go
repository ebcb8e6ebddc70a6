package cluster

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// healBound is the protocol's share, in virtual time, of the 5 s within
// which every table must be exact after a partition heals (issue 12); the
// rest is for the CPU of a loaded host (test/gossip checks the 5 s in
// real time).
const healBound = 2 * time.Second

// TestPartitionPastGraceHeals: three or five nodes with memberlist and
// the intervals as shipped, in virtual time (testing/synctest), so the
// figure is the protocol's. One or two of them are cut off from the rest
// past the dead grace: each side declares the other dead and purges its
// records. Both sides change endpoints meanwhile: deletes, adds, the
// address of an endpoint deleted on one side taken on the other.
// Endpoints change as the partition heals, too. Every node must then hold
// exactly the other nodes' live endpoints within healBound, and no deleted
// endpoint may come back. The heal falls at several phases of the nodes'
// timers; the partition either refuses connections (an unreachable
// network) or drops them (a dial waits out memberlist's TCPTimeout); and
// it ends either after memberlist forgot the dead (30 s after their
// death, GossipToTheDeadTime: it no longer talks to them at all) or
// before, while it holds them dead at the incarnation it saw last.
func TestPartitionPastGraceHeals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		grace time.Duration
		after time.Duration // from the purge on both sides to the heal
	}{
		{"forgotten", DefaultDeadGrace, 5 * time.Second},
		{"dead", 2 * time.Second, time.Second},
	} {
		for _, hosts := range []int{3, 5} {
			for _, hang := range []bool{false, true} {
				for i := range 4 {
					// Steps that are not multiples of any interval.
					after := tc.after + time.Duration(i)*2370*time.Millisecond
					mode := map[bool]string{false: "refused", true: "dropped"}[hang]
					t.Run(fmt.Sprintf("%s/%dhosts/%s/+%v", tc.name, hosts, mode, after), func(t *testing.T) {
						synctest.Test(t, func(t *testing.T) { testPartitionHeal(t, hosts, tc.grace, after, hang) })
					})
				}
			}
		}
	}
}

func testPartitionHeal(t *testing.T, hosts int, grace, after time.Duration, hang bool) {
	// memberlist's probes and streams outlive Close until they time out
	// (TCPTimeout, 10 s); the bubble must see them end. Runs last.
	t.Cleanup(func() { time.Sleep(15 * time.Second) })
	h := newHarness(t)
	h.tweak = nil
	h.grace, h.rejoin = grace, DefaultRejoinInterval
	h.net.SetLatency(100 * time.Microsecond)
	h.net.SetHang(hang)
	var nodes []*tnode
	for i := 1; i <= hosts; i++ {
		// Started apart, as real hosts are: their timers are out of phase.
		nodes = append(nodes, h.start(i, 1))
		time.Sleep(1300 * time.Millisecond)
	}
	// A node that misses the gossip of a later one's arrival learns of
	// it at a push/pull, every 10 s.
	waitMembersWithin(t, nodes, hosts, 30*time.Second)

	want := map[string]ep{}
	ip := 0
	publish := func(n *tnode, eid string, at int) {
		p := testPeer(eid, at)
		n.c.Publish(netA, p)
		want[eid] = ep{n, p}
	}
	retract := func(n *tnode, eid string) {
		n.c.Retract(netA, eid)
		delete(want, eid)
	}
	addr := map[string]int{} // endpoint → its address's index
	fresh := func(n *tnode, eid string) {
		ip++
		addr[eid] = ip
		publish(n, eid, ip)
	}
	for _, n := range nodes {
		fresh(n, n.name+"a")
		fresh(n, n.name+"b")
	}
	waitConverged(t, nodes, netA, want, 5*time.Second)

	a, b := nodes[:hosts/2+1], nodes[hosts/2+1:]
	a0, aN, b0, bN := a[0], a[len(a)-1], b[0], b[len(b)-1]
	inB := map[netip.AddrPort]bool{}
	for _, n := range b {
		inB[n.tr.Addr()] = true
	}
	h.net.SetFilter(func(from, to netip.AddrPort, _ bool) bool { return inB[from] == inB[to] })
	cutAt := time.Now()

	// Each side purges the other's endpoints the grace after it declared
	// them dead. Failure detection alone takes up to a minute here: a side
	// of two has no one to confirm a suspicion, and memberlist's awareness
	// stretches the probe interval of a node whose probes fail (with five
	// hosts, 30 s measured, so a bound of one minute for both, detection
	// and a 30 s grace, failed now and then).
	for _, side := range [][]*tnode{a, b} {
		only := map[string]ep{}
		for eid, e := range want {
			if slices.Contains(side, e.owner) {
				only[eid] = e
			}
		}
		waitConverged(t, side, netA, only, time.Minute+grace)
	}
	purged := time.Now()
	t.Logf("both sides purged the other's endpoints %v after the cut", purged.Sub(cutAt))

	// Changes on both sides while cut off; each side takes the address
	// of an endpoint deleted on the other.
	retract(a0, a0.name+"a")
	retract(b0, b0.name+"a")
	publish(aN, aN.name+"c", addr[b0.name+"a"])
	publish(bN, bN.name+"c", addr[a0.name+"a"])
	fresh(b0, b0.name+"t")
	retract(b0, b0.name+"t") // born and deleted within the partition
	deleted := []string{a0.name + "a", b0.name + "a", b0.name + "t"}

	time.Sleep(after - time.Since(purged))
	h.net.SetFilter(nil)
	healed := time.Now()
	adds := map[string]int{}
	for _, n := range nodes {
		for _, eid := range deleted {
			a, _, _ := n.sink.counts(eid)
			adds[n.name+"/"+eid] = a
		}
	}
	// Churn while the partition heals.
	fresh(aN, aN.name+"d")
	time.Sleep(50 * time.Millisecond)
	retract(bN, bN.name+"b")
	fresh(b0, b0.name+"d")

	var members, tables time.Duration
	for {
		if members == 0 && allAlive(nodes) {
			members = time.Since(healed)
		}
		if converged(nodes, netA, want) == nil {
			tables = time.Since(healed)
			break
		}
		if time.Since(healed) > time.Minute {
			t.Fatalf("not converged a minute after the heal: %v", converged(nodes, netA, want))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("partition of %v healed: all members alive after %v, every table exact after %v", healed.Sub(cutAt), members, tables)
	if tables > healBound {
		t.Errorf("tables exact %v after the heal, want at most %v", tables, healBound)
	}

	// It stays so: no anti-entropy round or push/pull brings back what
	// was deleted.
	time.Sleep(15 * time.Second)
	if err := converged(nodes, netA, want); err != nil {
		t.Errorf("15 s later: %v", err)
	}
	for _, n := range nodes {
		for _, eid := range deleted {
			if a, _, _ := n.sink.counts(eid); a != adds[n.name+"/"+eid] {
				t.Errorf("%s: endpoint %s, deleted during the partition, was added again after the heal", n.name, eid)
			}
		}
	}
}

func allAlive(nodes []*tnode) bool {
	for _, n := range nodes {
		if aliveMembers(n.c) != len(nodes) {
			return false
		}
	}
	return true
}
