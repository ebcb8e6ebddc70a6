package health

import (
	"net/netip"
	"strings"
	"testing"
)

// TestProblemNamesTheCause: every combination of what still works maps to
// the sentence an operator can act on.
func TestProblemNamesTheCause(t *testing.T) {
	peer := netip.MustParseAddr("198.51.100.2")
	for _, c := range []struct {
		name string
		f    facts
		want string
	}{
		{"up", facts{state: StateUp}, ""},
		{"unknown", facts{state: StateUnknown}, ""},
		{"vxlan blocked, gossip works", facts{path: PathVXLAN, state: StateDown, gossip: GossipAlive},
			"on UDP 4789 gets no answer while gossip with it works: a firewall between the hosts drops UDP 4789"},
		{"vxlan and gossip down", facts{path: PathVXLAN, state: StateDown, gossip: GossipDown}, "the host is down or unreachable"},
		{"no gossip", facts{path: PathVXLAN, state: StateDown}, "the host is down, or a firewall between the hosts drops UDP 4789"},
		{"other port", facts{path: PathVXLAN, state: StateDown, gossip: GossipAlive, peerPort: 4790},
			"it listens on UDP 4790, this host sends to UDP 4789; set the same --vxlan-port"},
		{"esp filtered", facts{path: PathESP, state: StateDown, plain: StateUp, gossip: GossipAlive},
			"ESP to 198.51.100.2 fails while plain VXLAN works: IP protocol 50 (ESP) is filtered"},
		{"esp and vxlan", facts{path: PathESP, state: StateDown, plain: StateDown}, "plain VXLAN to it fails too"},
		{"mtu", facts{path: PathVXLAN, state: StateMTU, mtu: 1450, pathMTU: 1350},
			"packets above 1350 bytes to 198.51.100.2 are lost: the network's MTU is 1450"},
		{"mtu on esp", facts{path: PathESP, state: StateMTU, mtu: 1424, pathMTU: 1300}, "encrypted packets above 1300 bytes"},
		{"mtu unsearched", facts{path: PathVXLAN, state: StateMTU, mtu: 1450}, "packets of 1450 bytes to 198.51.100.2 are lost while small ones cross"},
	} {
		c.f.peer, c.f.port = peer, 4789
		got := problem(c.f)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want it to say %q", c.name, got, c.want)
		}
	}
}
