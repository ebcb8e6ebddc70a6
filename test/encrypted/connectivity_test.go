package encrypted

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/health"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// 1. Connectivity.

func (s *suite) phaseConnectivity(t *testing.T) {
	c1, c2, c3 := s.ep("c1"), s.ep("c2"), s.ep("c3")
	start := time.Now()
	err := testbed.CheckTraffic([]*testbed.Container{c1.Ctr, c2.Ctr, c3.Ctr},
		testbed.Traffic{FirstPing: firstPing, TCPSize: tcpSize, TCPTimeout: tcpTimeout, EchoPort: echoPort})
	if err != nil {
		t.Fatalf("over the encrypted network: %v", err)
	}
	t.Logf("IPv4 and IPv6: ICMP and TCP (%d KiB each way) between c1, c2 and c3 in %v", tcpSize>>10, time.Since(start).Round(time.Millisecond))
	d1, d2 := s.ep("d1"), s.ep("d2")
	if err := d1.Ctr.PingUntil(d2.addr(testbed.IPv4), firstPing); err != nil {
		t.Fatalf("ping d1 -> d2 over the plain network: %v", err)
	}
	// The two networks are separate segments.
	if err := c1.Ctr.PingFails(d2.addr(testbed.IPv4), 1); err != nil {
		t.Errorf("encrypted c1 reaches plain d2: %v", err)
	}

	// What each host reports: only the encrypted VNI is guarded (and the
	// data-path probes' ESP endpoint's, health.VNIESP, while they probe
	// peers through ESP), both other hosts are in use with an outbound SA,
	// and the CLI says the same.
	for _, n := range s.Nodes {
		st := s.mustStatus(t, n)
		if vnis := slices.DeleteFunc(slices.Clone(st.VNIs), func(v uint32) bool { return v == health.VNIESP }); !slices.Equal(vnis, []uint32{s.enc.VNI}) {
			t.Errorf("%s: encryptedVNIs %v, want [%d] (not the plain network's %d)", n.Name, st.VNIs, s.enc.VNI, s.plain.VNI)
		}
		for _, o := range s.Others(n) {
			r := testbed.RemoteOf(st, o.Underlay)
			if r == nil || r.Refs != 1 || r.Blocked || r.PolicySPI == 0 {
				t.Errorf("%s: remote %s: %+v, want refs 1 and an outbound SA", n.Name, o.Name, r)
				continue
			}
			if !slices.ContainsFunc(st.States, func(x encryption.StateInfo) bool {
				return x.SPI == r.PolicySPI && x.Src == n.Underlay && x.Dst == o.Underlay
			}) {
				t.Errorf("%s: the policy's SPI %#x towards %s has no state %s->%s: %+v", n.Name, r.PolicySPI, o.Name, n.Underlay, o.Underlay, st.States)
			}
		}
		out, err := s.cli(n, "encryption")
		if err != nil {
			t.Fatalf("%s: overlay-plugin encryption: %v", n.Name, err)
		}
		var cst encryption.Status
		if err := json.Unmarshal([]byte(out), &cst); err != nil {
			t.Fatalf("%s: overlay-plugin encryption printed %q: %v", n.Name, out, err)
		}
		if !slices.Equal(cst.VNIs, st.VNIs) || len(cst.Own) != len(st.Own) || cst.Own[0].Gen != st.Own[0].Gen {
			t.Errorf("%s: CLI status %s differs from the admin API's %s", n.Name, testbed.DumpStatus(cst), testbed.DumpStatus(st))
		}
	}
}
