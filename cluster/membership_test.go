package cluster

import (
	"time"

	"fmt"
	"net/netip"
	"slices"
	"testing"
)

// TestMembershipScopesRecords: endpoint records of a network this node
// does not have are ignored; a node new in one of its networks is due its
// records; an owner that leaves a network takes its older records there
// with it, not newer ones.
func TestMembershipScopesRecords(t *testing.T) {
	s := newTestState("b", "10.0.0.2", 1)
	join(s, "a", "10.0.0.1", t0)
	if s.apply(liveRec("netx", "e1", "a", "10.0.0.1", "192.168.0.1", Version{10, 1}), srcPush, t0) || s.ignored != 1 {
		t.Fatalf("record of a network this node lacks applied (ignored %d)", s.ignored)
	}

	memb := &record{NetworkID: netA, EndpointID: memberEID("a"), Owner: "a", Member: true, Version: Version{10, 1}}
	if !s.apply(memb, srcGossip, t0) {
		t.Fatal("membership not applied")
	}
	if !slices.Equal(s.joins, []netJoin{{"a", netA}}) || len(s.out) != 0 {
		t.Fatalf("joins %v, relayed %d: want a due this node's records, the membership not relayed", s.joins, len(s.out))
	}
	s.joins, s.out = nil, nil
	// The same incarnation again (a newer version) is no news; a new
	// incarnation is: its table is empty.
	s.apply(&record{NetworkID: netA, EndpointID: memberEID("a"), Owner: "a", Member: true, Version: Version{10, 5}}, srcGossip, t0)
	if len(s.joins) != 0 {
		t.Fatalf("joins %v after a newer version of the same incarnation", s.joins)
	}
	s.apply(&record{NetworkID: netA, EndpointID: memberEID("a"), Owner: "a", Member: true, Version: Version{20, 1}}, srcGossip, t0)
	if len(s.joins) != 1 {
		t.Fatalf("joins %v after a restart of a", s.joins)
	}

	s.apply(liveRec(netA, "old", "a", "10.0.0.1", "192.168.0.1", Version{20, 2}), srcPush, t0)
	s.apply(liveRec(netA, "new", "a", "10.0.0.1", "192.168.0.2", Version{20, 9}), srcPush, t0)
	s.takeDirty()
	left := &record{NetworkID: netA, EndpointID: memberEID("a"), Owner: "a", Member: true, Version: Version{20, 5}, Deleted: true, At: instantOf(t0)}
	if !s.apply(left, srcGossip, t0) {
		t.Fatal("membership tombstone not applied")
	}
	if got := s.snapshot(netA); len(got) != 1 || got[0].EndpointID != "new" {
		t.Fatalf("after a left at 20.5: %+v, want only the record newer than that", got)
	}
	if d := s.takeDirty(); len(d) != 1 || d[0].add || d[0].eid != "old" {
		t.Fatalf("deliveries %+v, want the old record deleted", d)
	}
	// A late copy of the old record stays dead.
	if s.apply(liveRec(netA, "old", "a", "10.0.0.1", "192.168.0.1", Version{20, 2}), srcPush, t0) {
		t.Fatal("late copy of a record of a node that left came back")
	}
}

// TestJoinLeaveNetwork: this node's own membership and what leaving does.
func TestJoinLeaveNetwork(t *testing.T) {
	s := newState("a", netip.MustParseAddr("10.0.0.1"), 100, grace, ttl, testLogger())
	join(s, "b", "10.0.0.2", t0)
	if err := s.publish(netA, peer("e1", "192.168.0.1", 1), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if !s.interested(netA) || len(s.out) != 1 || !s.out[0].Member {
		t.Fatalf("publish did not join the network: out %v", s.out)
	}
	s.out, s.push = nil, nil
	s.apply(liveRec(netA, "e2", "b", "10.0.0.2", "192.168.0.2", Version{5, 1}), srcPush, t0)
	s.leaveNetwork(netA, t0)
	if s.interested(netA) || s.get(key{netA, "e2"}) != nil {
		t.Fatal("left network still kept, or the other node's record")
	}
	if r := s.get(key{netA, "e1"}); r == nil || !r.Deleted {
		t.Fatalf("own endpoint not retracted: %+v", r)
	}
	if len(s.out) != 1 || !s.out[0].Member || !s.out[0].Deleted {
		t.Fatalf("membership tombstone not broadcast: %v", s.out)
	}
}

// TestEpochBumpToLimitKeepsOwnRecords: a forged record just below the
// epoch limit takes this node's epoch to the limit; its own records,
// stamped there, are still its own when they come back (they used to be
// retracted for good as "impossible").
func TestEpochBumpToLimitKeepsOwnRecords(t *testing.T) {
	s := newTestState("a", "10.0.0.1", 100)
	s.apply(liveRec(netA, "forged", "a", "10.0.0.1", "192.168.0.9", Version{maxSaneEpoch - 1, 1}), srcSync, t0)
	if s.epoch != maxSaneEpoch {
		t.Fatalf("epoch %d, want %d", s.epoch, uint64(maxSaneEpoch))
	}
	if err := s.publish(netA, peer("e1", "192.168.0.1", 1), time.Time{}); err != nil {
		t.Fatal(err)
	}
	mine := s.get(key{netA, "e1"}).clone()
	s.apply(mine, srcSync, t0)
	if r := s.get(key{netA, "e1"}); r == nil || r.Deleted {
		t.Fatalf("own record at the epoch limit retracted: %+v", r)
	}
}

// syncPair returns the states of nodes a and b, which both see a, b and
// c alive and in netA: only the records of such owners are reconciled.
func syncPair() (a, b *state) {
	a, b = newTestState("a", "10.0.0.1", 1), newTestState("b", "10.0.0.2", 1)
	for _, s := range []*state{a, b} {
		for i, o := range []string{"a", "b", "c"} {
			join(s, o, fmt.Sprintf("10.0.0.%d", i+1), t0)
			s.apply(&record{NetworkID: netA, EndpointID: memberEID(o), Owner: o, Member: true, Version: Version{1, 0}}, srcState, t0)
		}
	}
	return a, b
}

// TestAnswerSyncConverges runs the digest exchange between two states by
// hand: whatever each one lacks or holds older, both end equal, and two
// equal states exchange one message each way and nothing more.
func TestAnswerSyncConverges(t *testing.T) {
	a, b := syncPair()
	a.publish(netA, peer("a1", "192.168.0.1", 1), time.Time{})
	b.publish(netA, peer("b1", "192.168.0.2", 2), time.Time{})
	c1 := liveRec(netA, "c1", "c", "10.0.0.3", "192.168.0.3", Version{7, 1})
	c2 := liveRec(netA, "c2", "c", "10.0.0.3", "192.168.0.4", Version{7, 2})
	a.apply(c1.clone(), srcPush, t0)
	a.apply(c2.clone(), srcPush, t0)
	b.apply(c1.clone(), srcPush, t0)
	b.apply(tombRec(netA, "c2", "c", Version{7, 3}, t0), srcPush, t0) // a missed this delete

	// a → b level 0; then each answers the other until nothing is left.
	msgs := []struct {
		to      *state
		entries []syncEntry
		recs    []*record
	}{{b, []syncEntry{{nid: netA, level: syncNetwork, sum: a.networkDigest(netA)}}, nil}}
	rounds := 0
	for len(msgs) > 0 && rounds < 10 {
		m := msgs[0]
		msgs = msgs[1:]
		rounds++
		for _, r := range m.recs {
			m.to.apply(r.clone(), srcSync, t0)
		}
		other := a
		if m.to == a {
			other = b
		}
		entries, recs := m.to.answerSync(other.self, m.entries, nil, time.Time{})
		if len(entries) > 0 || len(recs) > 0 {
			msgs = append(msgs, struct {
				to      *state
				entries []syncEntry
				recs    []*record
			}{other, entries, recs})
		}
	}
	if rounds != 4 {
		t.Errorf("%d messages, want 4 (digest, owner digests, records both ways)", rounds)
	}
	if a.networkDigest(netA) != b.networkDigest(netA) {
		t.Fatalf("digests differ after the exchange")
	}
	for _, s := range []*state{a, b} {
		if r := s.get(key{netA, "c2"}); r == nil || !r.Deleted {
			t.Errorf("%s: c2 = %+v, want the tombstone", s.self, r)
		}
		if s.get(key{netA, "a1"}) == nil || s.get(key{netA, "b1"}) == nil {
			t.Errorf("%s lacks a1 or b1", s.self)
		}
	}
	if entries, recs := b.answerSync("a", []syncEntry{{nid: netA, level: syncNetwork, sum: a.networkDigest(netA)}}, nil, time.Time{}); len(entries)+len(recs) != 0 {
		t.Errorf("equal digests answered with %d entries, %d records", len(entries), len(recs))
	}
}

// TestAnswerSyncSkipsOwnersNotAlive: an owner alive for one node and gone
// for the other is not reconciled between them (its records would be
// refused, and sent again every round); memberships are reconciled.
func TestAnswerSyncSkipsOwnersNotAlive(t *testing.T) {
	a, b := syncPair()
	a.apply(liveRec(netA, "c1", "c", "10.0.0.3", "192.168.0.3", Version{7, 1}), srcPush, t0)
	b.memberDown("c", t0) // b takes c for gone; a does not
	in := []syncEntry{{nid: netA, level: syncCompare, groups: a.ownerDigests(netA)}}
	_, recs := b.answerSync("a", in, nil, time.Time{})
	for _, r := range recs {
		if r.Owner == "c" {
			t.Errorf("b answered with c's record %s, c being gone for b", r.EndpointID)
		}
	}
	_, recs = a.answerSync("b", []syncEntry{{nid: netA, level: syncCompare, groups: b.ownerDigests(netA)}}, nil, time.Time{})
	for _, r := range recs {
		if r.Owner == "c" && !r.Member {
			t.Errorf("a shipped c's record %s to a node that does not list c", r.EndpointID)
		}
	}
}
