package encrypted

import (
	"net/netip"
	"testing"
	"time"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// phaseContainerBack: c1, h1's only container on the encrypted network,
// leaves and joins again while h1 is cut off from gossip, so h2 never sees
// it go and keeps its inbound SA, with the anti-replay window that has seen
// h1's sequence numbers so far. h1's sandbox and its references on h2 go
// and come back: the outbound SA must be the same instance, numbering on.
// Installed again, it would count from 1, and h2 would drop it all as
// replays until the next key generation.
func (s *suite) phaseContainerBack(t *testing.T) {
	h1 := s.Nodes[0]
	c1, c2 := s.ep("c1"), s.ep("c2")
	// A generation activating meanwhile would bring fresh SAs and hide a
	// reinstalled one. (Before the restart phase, which puts h1's
	// schedule out of step with the others', leaving no such window.)
	s.quietSchedule(t, 30*time.Second)
	// h2's replay window must have seen more of the SA's numbers than the
	// pings below send.
	if err := sendUDP(c1.Ctr.Netns, netip.AddrPortFrom(c2.addr(testbed.IPv4), sinkPort), 500); err != nil {
		t.Fatal(err)
	}
	for _, st := range s.mustStatus(t, s.Nodes[1]).States {
		if st.Src == h1.Underlay {
			t.Logf("h2's inbound SA %#x from h1 has counted %d packets", st.SPI, st.Packets)
		}
	}
	uncut, err := cutGossip(h1.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer uncut()
	if err := c1.Ctr.Detach(); err != nil {
		t.Fatal(err)
	}
	if err := h1.Plugin.API.Leave(&api.LeaveRequest{NetworkID: c1.net.ID, EndpointID: c1.ID}); err != nil {
		t.Fatalf("Leave c1: %v", err)
	}
	st := s.mustStatus(t, h1)
	if r := testbed.RemoteOf(st, s.Nodes[1].Underlay); r == nil || r.Refs != 0 || r.PolicySPI != 0 || r.Blocked || r.SAs == 0 {
		t.Errorf("h1 after c1 left: towards h2 %+v; want no reference and no policy, the SAs kept", r)
	}
	join, err := h1.Plugin.API.Join(&api.JoinRequest{NetworkID: c1.net.ID, EndpointID: c1.ID, SandboxKey: c1.Ctr.SandboxKey()})
	if err != nil {
		t.Fatalf("Join c1 again: %v", err)
	}
	c1.Join = join
	if err := c1.Ctr.Attach(join, c1.MAC, c1.Addrs...); err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]*endpoint{{c1, c2}, {c2, c1}} {
		// Seconds, not firstPing: an SA counting from 1 would fail for
		// as long as h2 has seen packets from h1 on it.
		if err := pair[0].Ctr.PingUntil(pair[1].addr(testbed.IPv4), 10*time.Second); err != nil {
			stat, _ := s.Nodes[1].NS.Exec("cat", "/proc/net/xfrm_stat")
			t.Fatalf("ping %s -> %s after c1 came back, h2 unaware it ever left: %v; h2's xfrm_stat:\n%s", pair[0].name, pair[1].name, err, stat)
		}
	}
	if err := uncut(); err != nil {
		t.Fatal(err)
	}
}
