package controlplane

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/driver"
)

func member(name, vtep string, state cluster.MemberState, port uint16, mtu int) cluster.Member {
	return cluster.Member{Name: name, VTEP: netip.MustParseAddr(vtep), State: state,
		Settings: cluster.Settings{VXLANPort: port, UnderlayMTU: mtu}}
}

func TestMTUFloor(t *testing.T) {
	ms := []cluster.Member{
		{Name: "self", Self: true, Settings: cluster.Settings{VXLANPort: 4789, UnderlayMTU: 1500}},
		member("h2", "198.51.100.2", cluster.MemberAlive, 4789, 1400),
		member("h3", "198.51.100.3", cluster.MemberGone, 4789, 1300), // gone: not counted
		member("old", "198.51.100.4", cluster.MemberAlive, 0, 0),     // 0.1.0: says nothing
	}
	if mtu, name := mtuFloor(ms); mtu != 1400 || name != "h2" {
		t.Fatalf("mtuFloor = %d, %q; want 1400, h2", mtu, name)
	}
	if mtu, _ := mtuFloor(ms[3:]); mtu != 0 {
		t.Fatalf("with no settings known: %d", mtu)
	}
}

func TestMismatches(t *testing.T) {
	remotes := []driver.RemoteVTEP{
		{VTEP: netip.MustParseAddr("198.51.100.2"), MTU: 1450},
		{VTEP: netip.MustParseAddr("198.51.100.3"), MTU: 1413, ESPMTU: 1413},
		{VTEP: netip.MustParseAddr("198.51.100.4"), MTU: 1450},
	}
	ms := []cluster.Member{
		{Name: "self", Self: true, Settings: cluster.Settings{VXLANPort: 4789, UnderlayMTU: 1500}},
		member("agrees", "198.51.100.5", cluster.MemberAlive, 4789, 1500),
		member("port", "198.51.100.4", cluster.MemberAlive, 4790, 1500),
		member("small", "198.51.100.2", cluster.MemberAlive, 4789, 1400),
		member("esp", "198.51.100.3", cluster.MemberAlive, 4789, 1480),
		member("gone", "198.51.100.6", cluster.MemberGone, 4790, 1000),
		member("old", "198.51.100.7", cluster.MemberAlive, 0, 0),
	}
	got := mismatches(ms, 4789, 37, remotes)
	want := map[string]string{
		"port":  "receives VXLAN on UDP 4790, this node on UDP 4789",
		"small": "MTU 1450, but node small's underlay MTU of 1400 carries at most 1350",
		"esp":   "encrypted network here has MTU 1413, but node esp's underlay MTU of 1480 carries at most 1393 through ESP",
	}
	if len(got) != len(want) {
		t.Fatalf("%d findings, want %d: %v", len(got), len(want), got)
	}
	for _, f := range got {
		name, _, _ := strings.Cut(f.Subject, " ")
		if w, ok := want[name]; !ok || !strings.Contains(f.Problem, w) {
			t.Errorf("%s: %q, want it to say %q", f.Subject, f.Problem, w)
		}
	}
}
