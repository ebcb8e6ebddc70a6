package cluster

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// ownerOf returns the owner digest of s's records of owner in netA, as s
// would send it.
func ownerOf(s *state, owner string) ownerDigest {
	return ownerDigest{owner: owner, d: s.ownerDigest(netA, owner), hw: s.mark(netA, owner)}
}

func eids(recs []*record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.EndpointID)
	}
	slices.Sort(out)
	return out
}

// TestShipmentByMarks: the side with the higher mark ships what lies
// above the other's; a hole below it ships everything; the side with the
// lower mark ships nothing; equal marks ship everything; a peer that
// sends no mark (wire version 2) gets everything.
func TestShipmentByMarks(t *testing.T) {
	c := func(i int) *record {
		return liveRec(netA, fmt.Sprintf("c%d", i), "c", "10.0.0.3", fmt.Sprintf("192.168.0.%d", i), Version{7, uint64(i)})
	}
	ahead, behind := syncPair()
	for i := 1; i <= 5; i++ {
		ahead.apply(c(i), srcPush, t0)
		if i <= 3 {
			behind.apply(c(i), srcPush, t0)
		}
	}
	if got := eids(ahead.shipment(netA, "b", []ownerDigest{ownerOf(behind, "c")}, nil, t0)); !slices.Equal(got, []string{"c4", "c5"}) {
		t.Errorf("ahead ships %v, want [c4 c5]", got)
	}
	if got := behind.shipment(netA, "a", []ownerDigest{ownerOf(ahead, "c")}, nil, t0); len(got) != 0 {
		t.Errorf("behind ships %v, want nothing", eids(got))
	}
	v2 := ownerOf(behind, "c")
	v2.hw = Version{}
	if got := eids(ahead.shipment(netA, "b", []ownerDigest{v2}, nil, t0)); len(got) != 5 {
		t.Errorf("ahead ships %v to a peer without marks, want all five", got)
	}

	// A hole below the peer's mark: c2 lost, c3 there.
	holed, _ := syncPair()
	for _, i := range []int{1, 3} {
		holed.apply(c(i), srcPush, t0)
	}
	if got := eids(ahead.shipment(netA, "b", []ownerDigest{ownerOf(holed, "c")}, nil, t0)); len(got) != 5 {
		t.Errorf("ahead ships %v to a peer with a hole, want all five", got)
	}
	// Equal marks, different records: everything.
	other, _ := syncPair()
	for _, i := range []int{2, 5} {
		other.apply(c(i), srcPush, t0)
	}
	if got := eids(ahead.shipment(netA, "b", []ownerDigest{ownerOf(other, "c")}, nil, t0)); len(got) != 5 {
		t.Errorf("ahead ships %v at equal marks, want all five", got)
	}
	// A delete of an older record the peer holds: while it settles, the
	// peer gets the settled records above its mark (the delete is on its
	// way); settled, the peer missed it, and gets everything.
	ahead.settle = 2 * time.Second
	at := t0.Add(time.Minute)
	ahead.apply(tombRec(netA, "c1", "c", Version{7, 6}, at), srcPush, at)
	if got := eids(ahead.shipment(netA, "b", []ownerDigest{ownerOf(behind, "c")}, nil, at)); !slices.Equal(got, []string{"c4", "c5"}) {
		t.Errorf("ahead ships %v while deleting c1, want [c4 c5]", got)
	}
	if got := eids(ahead.shipment(netA, "b", []ownerDigest{ownerOf(behind, "c")}, nil, at.Add(2*time.Second))); len(got) != 5 {
		t.Errorf("ahead ships %v once the delete settled, want all five (c1's tombstone)", got)
	}
}

// TestShipmentLeavesRecentRecords: what this node took in less than
// settle ago is on its way to the peer from its owner and stays out,
// unless the peer is its owner; once settled it ships. This node's own
// records stay out while queued for the peer.
func TestShipmentLeavesRecentRecords(t *testing.T) {
	a, b := syncPair()
	a.settle = 2 * time.Second
	a.apply(liveRec(netA, "c1", "c", "10.0.0.3", "192.168.0.1", Version{7, 1}), srcPush, t0)
	a.apply(liveRec(netA, "b1", "b", "10.0.0.2", "192.168.0.2", Version{1, 9}), srcPush, t0)
	theirs := []ownerDigest{ownerOf(b, "c"), ownerOf(b, "b")}
	if got := eids(a.shipment(netA, "b", theirs, nil, t0.Add(time.Second))); !slices.Equal(got, []string{"b1"}) {
		t.Errorf("a second after: ships %v, want only b's own [b1]", got)
	}
	if got := eids(a.shipment(netA, "b", theirs, nil, t0.Add(2*time.Second))); !slices.Equal(got, []string{"b1", "c1"}) {
		t.Errorf("settled: ships %v, want [b1 c1]", got)
	}
	// Its own records stay out while queued for the peer, however old.
	if err := a.publish(netA, peer("a1", "192.168.0.9", 9), t0); err != nil {
		t.Fatal(err)
	}
	queued := func(k key) bool { return k.eid == "a1" }
	if got := a.shipment(netA, "b", []ownerDigest{ownerOf(b, "a")}, queued, t0.Add(time.Hour)); len(got) != 0 {
		t.Errorf("own record queued for the peer shipped: %v", eids(got))
	}
	if got := eids(a.shipment(netA, "b", []ownerDigest{ownerOf(b, "a")}, nil, t0)); !slices.Equal(got, []string{"a1"}) {
		t.Errorf("own record not queued: ships %v, want [a1]", got)
	}
}

// TestRecordOfAPurgedOwnerPushedIsHeld: a member purged past the grace
// that pushes a record is back, its alive message not yet here: the
// record waits for it instead of being refused.
func TestRecordOfAPurgedOwnerPushedIsHeld(t *testing.T) {
	s := newTestState("a", "10.0.0.1", 1)
	join(s, "c", "10.0.0.3", t0)
	s.memberDown("c", t0)
	s.sweep(t0.Add(2 * grace))
	if m := s.members["c"]; m == nil || !m.purged {
		t.Fatalf("c not purged: %+v", m)
	}
	r := liveRec(netA, "c1", "c", "10.0.0.3", "192.168.0.1", Version{7, 1})
	if s.apply(r.clone(), srcSync, t0.Add(2*grace)) || s.npend != 0 {
		t.Fatal("a purged owner's record by anti-entropy taken or held")
	}
	if s.apply(r.clone(), srcPush, t0.Add(2*grace)) || s.npend != 1 {
		t.Fatalf("pushed: %d held, want 1", s.npend)
	}
	join(s, "c", "10.0.0.3", t0.Add(2*grace))
	if s.get(key{netA, "c1"}) == nil {
		t.Error("held record not applied when its owner came back")
	}
}
