package encrypted

import (
	"errors"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// 2. ESP is really used.

func (s *suite) phaseESP(t *testing.T) {
	c1, c2 := s.ep("c1"), s.ep("c2")
	h1, h2 := s.Nodes[0], s.Nodes[1]

	// The MTU: underlay minus VXLAN minus ESP, on the interfaces and in the
	// plugins' view; the plain network keeps the VXLAN-only MTU.
	for _, ep := range s.eps {
		want := plainMTU
		if ep.net.Encrypted() {
			want = wantMTU
		}
		links, err := ep.Ctr.Links()
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(links, func(l testbed.Link) bool { return l.Name == ep.Ctr.Iface })
		if i < 0 {
			t.Fatalf("%s: no interface %s in %v", ep.name, ep.Ctr.Iface, links)
		}
		if links[i].MTU != want {
			t.Errorf("%s (%s network): MTU %d, want %d = %d - %d (VXLAN) - %d (ESP)", ep.name, ep.net.Name, links[i].MTU, want, underlayMTU, vxlanOverhead, underlayMTU-vxlanOverhead-want)
		}
		ns, err := ep.node.Plugin.Network(ep.net.ID)
		if err != nil {
			t.Fatal(err)
		}
		if ns.MTU != want {
			t.Errorf("%s: network %s MTU %d, want %d", ep.node.Name, ep.net.Name, ns.MTU, want)
		}
	}

	// A rotation switching SAs during the measurement would take the old
	// SAs' counts with them: measure between rotations.
	s.quietSchedule(t, 10*time.Second)
	before1, before2 := s.mustStatus(t, h1), s.mustStatus(t, h2)
	kb1, out, err := h1.NS.XfrmStates()
	if err != nil {
		t.Fatalf("%s: ip xfrm state: %v\n%s", h1.Name, err, out)
	}
	capt, err := testbed.StartCapture(h2.NS, testbed.HostLink, vxlanPort)
	if err != nil {
		t.Fatal(err)
	}
	const pings = 20
	for i := range pings {
		if err := c1.Ctr.Ping(c2.addr(testbed.IPv4), 5*time.Second); err != nil {
			capt.Stop()
			t.Fatalf("ping %d of %d c1 -> c2: %v", i+1, pings, err)
		}
	}
	// The largest packet the container may send, DF set: its ESP packet
	// must fill the underlay's 1500 bytes without fragments.
	bigErr := pingDF(c1.Ctr.Netns, c2.addr(testbed.IPv4), wantMTU, 10*time.Second)
	overErr := pingDF(c1.Ctr.Netns, c2.addr(testbed.IPv4), wantMTU+1, 2*time.Second)
	cs, cerr := capt.Stop()
	if cerr != nil {
		t.Fatalf("capture on %s: %v", h2.Name, cerr)
	}
	if bigErr != nil {
		t.Errorf("DF ping of %d bytes (the MTU) c1 -> c2: %v", wantMTU, bigErr)
	}
	if !errors.Is(overErr, syscall.EMSGSIZE) {
		t.Errorf("DF ping of %d bytes (MTU+1) c1 -> c2: %v, want EMSGSIZE (message too long) at the sender", wantMTU+1, overErr)
	}
	after1, after2 := s.mustStatus(t, h1), s.mustStatus(t, h2)
	ka1, out, err := h1.NS.XfrmStates()
	if err != nil {
		t.Fatalf("%s: ip xfrm state: %v\n%s", h1.Name, err, out)
	}

	a, b := h1.Underlay, h2.Underlay
	atLeast := uint64(pings + 1)
	for _, c := range []struct {
		who           string
		before, after []encryption.StateInfo
		src, dst      netip.Addr
	}{
		{"h1 admin API, outbound", before1.States, after1.States, a, b},
		{"h1 admin API, inbound", before1.States, after1.States, b, a},
		{"h2 admin API, inbound", before2.States, after2.States, a, b},
		{"h2 admin API, outbound", before2.States, after2.States, b, a},
	} {
		p, by := testbed.SAGrowth(c.before, c.after, c.src, c.dst)
		t.Logf("%s SA %s->%s: +%d packets, +%d bytes", c.who, c.src, c.dst, p, by)
		if p < atLeast || by < atLeast*(84+vxlanOverhead) {
			t.Errorf("%s SA %s->%s grew by %d packets, %d bytes; want at least %d packets for %d pings", c.who, c.src, c.dst, p, by, atLeast, atLeast)
		}
	}
	for _, dir := range [][2]netip.Addr{{a, b}, {b, a}} {
		p, by := testbed.XfrmGrowth(kb1, ka1, dir[0], dir[1])
		t.Logf("h1 ip -s xfrm state %s->%s: +%d packets, +%d bytes", dir[0], dir[1], p, by)
		if p < atLeast {
			t.Errorf("h1 ip -s xfrm state: SAs %s->%s grew by %d packets, want at least %d\nbefore: %+v\nafter: %+v", dir[0], dir[1], p, atLeast, kb1, ka1)
		}
	}

	t.Logf("capture on h2 %s: %d IPv4 packets, ESP %v (largest %d bytes), plaintext VXLAN by VNI %v, %d fragments",
		testbed.HostLink, cs.Total, cs.ESP, cs.ESPMaxLen, cs.VXLAN, cs.Fragments)
	for _, dir := range []testbed.AddrPair{{Src: a, Dst: b}, {Src: b, Dst: a}} {
		if cs.ESP[dir] < pings+1 {
			t.Errorf("capture on h2: %d ESP packets %v, want at least %d", cs.ESP[dir], dir, pings+1)
		}
	}
	if n := cs.VXLAN[s.enc.VNI]; n != 0 {
		t.Errorf("capture on h2: %d plaintext VXLAN packets of the encrypted VNI %d crossed the underlay", n, s.enc.VNI)
	}
	if cs.Fragments != 0 {
		t.Errorf("capture on h2: %d IPv4 fragments on the underlay; the overlay MTU leaves no room for ESP", cs.Fragments)
	}
	if cs.ESPMaxLen != underlayMTU {
		t.Errorf("capture on h2: largest ESP packet %d bytes, want exactly %d for a %d-byte inner packet (MTU %d leaves the underlay MTU unused or exceeds it)",
			cs.ESPMaxLen, underlayMTU, wantMTU, wantMTU)
	}
}
