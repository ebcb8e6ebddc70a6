package multihost

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/kernel"
)

// repairWithin bounds a repair of drift the kernel reports with an event.
const repairWithin = time.Second

// repairs reads overlay_plugin_reconcile_repairs_total of kind.
func repairs(t *testing.T, n *node, kind string) uint64 {
	t.Helper()
	body, err := n.Plugin.AdminGet("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^overlay_plugin_reconcile_repairs_total\{kind="` + kind + `"\} (\d+)$`).FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseUint(string(m[1]), 10, 64)
	return v
}

// inSync reports whether n's sandbox holds exactly what its peers imply,
// as the plugin reads it (NOARP entries included).
func (c *cluster) inSync(n *node) (bool, string) {
	wantN, wantF := testbed.WantTables(c.nw, c.Remotes(n.Node, c.nw))
	st, err := n.Plugin.Network(c.nw.ID)
	if err != nil || st.Kernel == nil {
		return false, fmt.Sprintf("state: %v", err)
	}
	for _, nb := range st.Kernel.Neighbors {
		if nb.NotPermanent {
			return false, fmt.Sprintf("neighbour %+v not permanent", nb)
		}
	}
	for _, e := range st.Kernel.FDB {
		if e.NotPermanent {
			return false, fmt.Sprintf("fdb %+v not permanent", e)
		}
	}
	gotN, gotF := testbed.ReportedEntries(st.Kernel)
	if !slices.Equal(gotN, wantN) || !slices.Equal(gotF, wantF) || st.Kernel.Error != "" {
		return false, fmt.Sprintf("plugin reads %v %v (%s), want %v %v", gotN, gotF, st.Kernel.Error, wantN, wantF)
	}
	return true, ""
}

// TestDriftRepaired changes a running plugin's sandbox behind its back, as
// an operator or another program might, and requires every change to be
// repaired within a second (the periodic resync is 30 s away) and counted
// in the metric, with traffic flowing afterwards.
func TestDriftRepaired(t *testing.T) {
	requireTestbed(t)
	c := setup(t, testbed.IPv4, 2)
	n1, n2 := c.nodes[0], c.nodes[1]
	ip4 := n2.ep.Addrs[0].Addr().String()
	vtep := n2.Underlay.String()
	vx, br := kernel.VXLANName, kernel.BridgeName
	for _, d := range []struct {
		name string
		cmd  []string
		kind string
	}{
		{"neighbour deleted", []string{"ip", "neigh", "del", ip4, "dev", vx}, "neighbor_added"},
		{"neighbour changed", []string{"ip", "neigh", "replace", ip4, "lladdr", "02:42:0a:0b:0c:0d", "dev", vx, "nud", "permanent"}, "neighbor_replaced"},
		{"neighbour made NOARP", []string{"ip", "neigh", "replace", ip4, "lladdr", n2.ep.MAC, "dev", vx, "nud", "noarp"}, "neighbor_replaced"},
		{"NOARP neighbour added", []string{"ip", "neigh", "replace", "203.0.113.200", "lladdr", "02:42:0a:0b:0c:0e", "dev", vx, "nud", "noarp"}, "neighbor_removed"},
		{"FDB entry deleted", []string{"bridge", "fdb", "del", n2.ep.MAC, "dev", vx, "dst", vtep, "self"}, "fdb_added"},
		{"FDB entry pointed elsewhere", []string{"bridge", "fdb", "replace", n2.ep.MAC, "dev", vx, "dst", "198.51.100.250", "self", "permanent"}, "fdb_replaced"},
		{"static FDB entry added", []string{"bridge", "fdb", "add", "02:42:0a:0b:0c:0f", "dev", vx, "dst", "198.51.100.251", "self", "static"}, "fdb_removed"},
		{"permanent FDB entry added", []string{"bridge", "fdb", "add", "02:42:0a:0b:0c:10", "dev", vx, "dst", "198.51.100.252", "self", "permanent"}, "fdb_removed"},
		{"vxlan0 deleted", []string{"ip", "link", "del", vx}, "device_rebuilt"},
		{"vxlan0 down", []string{"ip", "link", "set", vx, "down"}, "device_fixed"},
		{"bridge deleted", []string{"ip", "link", "del", br}, "device_rebuilt"},
	} {
		before := repairs(t, n1, d.kind)
		start := time.Now()
		if out, err := n1.Plugin.SandboxExec(c.nw.ID, d.cmd...); err != nil {
			t.Fatalf("%s: %v: %s", d.name, err, out)
		}
		for {
			ok, why := c.inSync(n1)
			if ok && repairs(t, n1, d.kind) > before {
				took := time.Since(start)
				// And as ip and bridge read it (outside the timing:
				// nsenter and iproute2 take a while on a loaded host).
				wantN, wantF := testbed.WantTables(c.nw, c.Remotes(n1.Node, c.nw))
				ipN, ipF, err := n1.Plugin.SandboxEntries(c.nw.ID)
				if err != nil || !slices.Equal(ipN, wantN) || !slices.Equal(ipF, wantF) {
					t.Fatalf("%s: the plugin reports a repair, but ip and bridge read %v %v (%v), want %v %v", d.name, ipN, ipF, err, wantN, wantF)
				}
				t.Logf("%s: repaired in %v", d.name, took.Round(time.Millisecond))
				break
			}
			if time.Since(start) > repairWithin {
				t.Fatalf("%s: not repaired and counted as %s within %v: %s (count %d, was %d)\n%s",
					d.name, d.kind, repairWithin, why, repairs(t, n1, d.kind), before, n1.Plugin.LogTail(20))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The rebuilt devices carry traffic, the container's veth back on the
	// new bridge.
	c.checkTraffic(t)
}
