package gossip

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// A host killed with SIGKILL keeps its endpoints on the others for the
// dead grace after it is found dead, not less, and loses them afterwards.
func testDeadNodeGrace(t *testing.T) {
	const grace = 3 * time.Second
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Secret: true, DeadGrace: grace}})
	eps := c.containerPerHost()
	c.waitMembers(converge, "initial")
	c.waitConverged(converge, "initial")
	c.checkTraffic(eps, false)

	h3 := c.Nodes[2]
	c3 := eps[2]
	observers := c.Nodes[:2]
	// present: does obs still program c3?
	present := func(obs *testbed.Node) (bool, error) {
		st, err := obs.Plugin.Network(c.nw.ID)
		if err != nil {
			return false, err
		}
		if st.Kernel == nil {
			return false, fmt.Errorf("%s: no kernel view", obs.Name)
		}
		var n, f int
		for _, nb := range st.Kernel.Neighbors {
			if slices.Contains(c3.IPs(), nb.IP) {
				n++
			}
		}
		for _, e := range st.Kernel.FDB {
			if e.MAC.String() == c3.MAC {
				f++
			}
		}
		switch {
		case n == len(c3.IPs()) && f == 1:
			return true, nil
		case n == 0 && f == 0:
			return false, nil
		}
		return false, fmt.Errorf("%s holds c3 partially: %d neighbours, %d FDB entries", obs.Name, n, f)
	}

	killed := time.Now()
	if err := h3.Plugin.Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed h3's plugin (pid %d) with SIGKILL", h3.Plugin.Pid())
	type obsTimes struct{ detect, gone time.Time }
	times := map[*testbed.Node]*obsTimes{}
	for _, o := range observers {
		times[o] = &obsTimes{}
	}
	midChecked := false
	deadline := killed.Add(40 * time.Second)
	for {
		now := time.Now()
		all := true
		for _, o := range observers {
			tm := times[o]
			if tm.detect.IsZero() {
				s, err := o.MemberState("h3")
				if err != nil {
					c.fatalf("%v", err)
				}
				if s != "alive" {
					tm.detect = now
					t.Logf("%s: h3 %q %v after the kill", o.Name, s, now.Sub(killed).Round(time.Millisecond))
				}
			}
			if tm.gone.IsZero() {
				p, err := present(o)
				if err != nil {
					c.fatalf("%v", err)
				}
				if !p {
					tm.gone = now
					t.Logf("%s: c3's entries removed %v after the kill", o.Name, now.Sub(killed).Round(time.Millisecond))
					if tm.detect.IsZero() {
						c.fatalf("%s removed c3's entries %v after the kill while still listing h3 alive", o.Name, now.Sub(killed))
					}
					if early := tm.gone.Sub(tm.detect); early < grace-500*time.Millisecond {
						c.fatalf("%s removed c3's entries %v after it saw h3 fail: before the dead grace of %v", o.Name, early, grace)
					}
				}
			}
			all = all && !tm.gone.IsZero()
		}
		// At half the grace after the first detection, everything of h3
		// must still be in place on both observers, kernel tables included
		// (h3's own, dead, plugin is not checked).
		if !midChecked {
			var first time.Time
			for _, o := range observers {
				if d := times[o].detect; !d.IsZero() && (first.IsZero() || d.Before(first)) {
					first = d
				}
			}
			if !first.IsZero() && now.Sub(first) >= grace/2 {
				c.expect = func(obs *testbed.Node) []*testbed.Endpoint {
					var out []*testbed.Endpoint
					for _, ep := range c.Live(c.nw) {
						if ep.Host != obs.Host {
							out = append(out, ep)
						}
					}
					return out
				}
				c.checkNow(fmt.Sprintf("%v after h3 was seen failed (half the dead grace of %v): its endpoint must still be everywhere", now.Sub(first).Round(time.Millisecond), grace))
				c.expect = nil
				midChecked = true
				t.Logf("at %v after the failure was seen, c3 is still programmed on h1 and h2 (checked in the admin API and the sandboxes)", now.Sub(first).Round(time.Millisecond))
			}
		}
		if all {
			break
		}
		if now.After(deadline) {
			c.fatalf("c3's entries still present on some host %v after h3's plugin was killed (dead grace %v)", time.Since(killed), grace)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !midChecked {
		c.fatalf("the half-grace check never ran (the entries vanished before it)")
	}
	for _, o := range observers {
		if late := times[o].gone.Sub(times[o].detect); late > grace+5*time.Second {
			c.fatalf("%s removed c3's entries %v after seeing h3 fail: far past the dead grace of %v", o.Name, late, grace)
		}
	}
	c.Forget(c3)
	c.waitConverged(converge, "after h3's dead grace")
	c.waitMembers(converge, "h3 dead")
	c.checkTraffic(eps[:2], false)
}
