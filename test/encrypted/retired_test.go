package encrypted

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// 5. The retired generations are gone.

func (s *suite) phaseRetired(t *testing.T) {
	if s.preRotation == nil || s.postRotation == nil {
		t.Fatal("no rotation recorded")
	}
	for _, n := range s.Nodes {
		old := s.preRotation[n].Own[0].Gen
		for _, m := range s.Nodes {
			st := s.mustStatus(t, m)
			if m == n {
				if slices.ContainsFunc(st.Own, func(g encryption.PublicKeyInfo) bool { return g.Gen == old }) {
					t.Errorf("%s still lists its retired generation %d: %+v", n.Name, old, st.Own)
				}
				continue
			}
			if r := testbed.RemoteOf(st, n.Underlay); r != nil && slices.ContainsFunc(r.Generations, func(g encryption.PublicKeyInfo) bool { return g.Gen == old }) {
				t.Errorf("%s still knows %s's retired generation %d: %+v", m.Name, n.Name, old, r.Generations)
			}
		}
	}
	for _, n := range s.Nodes {
		st := s.mustStatus(t, n)
		oldSPIs := map[uint32]bool{}
		for _, x := range s.preRotation[n].States {
			oldSPIs[x.SPI] = true
		}
		apiSPIs := map[uint32]bool{}
		for _, x := range st.States {
			apiSPIs[x.SPI] = true
			if oldSPIs[x.SPI] {
				t.Errorf("%s: SA %s->%s SPI %#x predates the rotation: the retired generation is still in use", n.Name, x.Src, x.Dst, x.SPI)
			}
		}
		// Independently: the kernel's states and policies.
		ks, out, err := n.NS.XfrmStates()
		if err != nil {
			t.Fatalf("%s: %v\n%s", n.Name, err, out)
		}
		kSPIs := map[uint32]bool{}
		for _, k := range ks {
			kSPIs[k.SPI] = true
			if oldSPIs[k.SPI] {
				t.Errorf("%s: ip xfrm state still holds SPI %#x of before the rotation\n%s", n.Name, k.SPI, out)
			}
			if k.Proto != "esp" || k.ReqID != encryption.ReqID {
				t.Errorf("%s: unexpected state %+v", n.Name, k)
			}
		}
		if !maps.Equal(kSPIs, apiSPIs) {
			t.Errorf("%s: ip xfrm state SPIs %v, admin API %v\n%s", n.Name, slices.Sorted(maps.Keys(kSPIs)), slices.Sorted(maps.Keys(apiSPIs)), out)
		}
		pols, pout, err := n.NS.XfrmPolicies()
		if err != nil {
			t.Fatalf("%s: %v\n%s", n.Name, err, pout)
		}
		for _, o := range s.Others(n) {
			r := testbed.RemoteOf(st, o.Underlay)
			i := slices.IndexFunc(pols, func(p testbed.XfrmPolicy) bool {
				return p.Dir == "out" && p.HasMark && p.Mark == encryption.Mark && p.Dst == o.Underlay.String()+"/32"
			})
			if i < 0 {
				t.Errorf("%s: no outbound policy of ours to %s in\n%s", n.Name, o.Name, pout)
				continue
			}
			if pols[i].TmplSPI != r.PolicySPI || pols[i].TmplProto != "esp" {
				t.Errorf("%s: kernel policy to %s uses %s SPI %#x, admin API says %#x", n.Name, o.Name, pols[i].TmplProto, pols[i].TmplSPI, r.PolicySPI)
			}
			// The receiver holds the sender's outbound SA.
			ost := s.mustStatus(t, o)
			if !slices.ContainsFunc(ost.States, func(x encryption.StateInfo) bool {
				return x.SPI == r.PolicySPI && x.Src == n.Underlay && x.Dst == o.Underlay
			}) {
				t.Errorf("%s sends to %s with SPI %#x, which %s has no inbound SA for: %+v", n.Name, o.Name, r.PolicySPI, o.Name, ost.States)
			}
		}
		if st.LastError != "" {
			t.Errorf("%s: lastError %q", n.Name, st.LastError)
		}
	}
	// Traffic still flows on the new SAs.
	c1, c2, c3 := s.ep("c1"), s.ep("c2"), s.ep("c3")
	for _, p := range [][2]*endpoint{{c1, c2}, {c2, c3}, {c3, c1}} {
		if err := p[0].Ctr.PingUntil(p[1].addr(testbed.IPv4), 10*time.Second); err != nil {
			t.Errorf("after rotation: %v", err)
		}
	}
	t.Log("the retired private keys' bytes being wiped is checked in process by encryption.TestRetiredKeyLeavesNoCopyInMemory")
}
