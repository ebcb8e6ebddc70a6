package controlplane

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/overlay-plugin/overlay-plugin/check"
	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/driver"
)

// Settings agreement: the VXLAN port and the MTU must agree across the
// nodes for the data path to work. Each node tells the others its own
// (cluster/settings.go); the leader gives a new network the MTU the
// smallest underlay allows (Driver.SetMTUFloor), and the check lists every
// disagreement left with a node alive here.

// vxlanOverhead is what VXLAN adds to a packet on an underlay of the
// VTEP's family (outer IP, UDP, VXLAN, inner Ethernet).
func vxlanOverhead(vtep netip.Addr) int {
	if vtep.Is4() {
		return 20 + 8 + 8 + 14
	}
	return 40 + 8 + 8 + 14
}

// mtuFloor is the smallest underlay MTU an alive member advertised, with
// its name (0 when none did).
func mtuFloor(members []cluster.Member) (int, string) {
	best, name := 0, ""
	for _, m := range members {
		if u := m.Settings.UnderlayMTU; u > 0 && (m.Self || m.State == cluster.MemberAlive) && (best == 0 || u < best) {
			best, name = u, m.Name
		}
	}
	return best, name
}

// mismatches are the disagreements of the alive members with this node:
// another VXLAN port, or an underlay that cannot carry the MTU of a
// network this node sends it. remotes are the driver's remote VTEPs.
func mismatches(members []cluster.Member, port uint16, esp int, remotes []driver.RemoteVTEP) []check.Finding {
	var out []check.Finding
	for _, m := range members {
		if m.Self || m.State != cluster.MemberAlive || m.Settings == (cluster.Settings{}) {
			continue
		}
		subject := fmt.Sprintf("%s (%s)", m.Name, m.VTEP)
		if p := m.Settings.VXLANPort; p != port {
			out = append(out, check.Finding{Area: "settings", Subject: subject, Problem: fmt.Sprintf(
				"node %s receives VXLAN on UDP %d, this node on UDP %d: traffic between them is lost; set the same --vxlan-port (OVERLAY_VXLAN_PORT, or Docker's --data-path-port) on every node",
				m.Name, p, port)})
		}
		i := slices.IndexFunc(remotes, func(r driver.RemoteVTEP) bool { return r.VTEP == m.VTEP })
		if i < 0 {
			continue
		}
		r, carries := remotes[i], m.Settings.UnderlayMTU-vxlanOverhead(m.VTEP)
		if r.MTU > carries {
			out = append(out, check.Finding{Area: "settings", Subject: subject, Problem: fmt.Sprintf(
				"a network here has MTU %d, but node %s's underlay MTU of %d carries at most %d: larger packets to it are lost; recreate the network (the leader then takes the smallest) or give it -o com.docker.network.driver.mtu=%d",
				r.MTU, m.Name, m.Settings.UnderlayMTU, carries, carries)})
		} else if r.ESPMTU > carries-esp {
			out = append(out, check.Finding{Area: "settings", Subject: subject, Problem: fmt.Sprintf(
				"an encrypted network here has MTU %d, but node %s's underlay MTU of %d carries at most %d through ESP: larger packets to it are lost; recreate the network or give it -o com.docker.network.driver.mtu=%d",
				r.ESPMTU, m.Name, m.Settings.UnderlayMTU, carries-esp, carries-esp)})
		}
	}
	return out
}
