package cluster

import (
	"bytes"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"
	"unique"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// testLogger discards logs unless CLUSTER_TEST_LOG is set (memberlist's
// goroutines may log after a test ends, so t.Log cannot be used).
func testLogger() *slog.Logger {
	if os.Getenv("CLUSTER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	grace = 30 * time.Second
	ttl   = 10 * time.Minute
	netA  = "neta"
)

// newTestState is a state that has network netA, joined with the version
// (epoch, 0): the merge tests see its own sequence numbers from 1.
func newTestState(self, vtep string, epoch uint64) *state {
	s := newState(self, netip.MustParseAddr(vtep), epoch, grace, ttl, testLogger())
	s.put(&record{NetworkID: netA, EndpointID: s.selfEID, Owner: self, Member: true, Version: Version{epoch, 0}})
	return s
}

// join makes name an alive member of s with the given VTEP in its meta.
func join(s *state, name, vtep string, now time.Time) {
	s.memberUp(name, netip.MustParseAddrPort(vtep+":7946"), encodeMeta(netip.MustParseAddr(vtep), 1, nil), now)
}

func mac(b byte) hwaddr.MAC { return hwaddr.MAC{0x02, 0, 0, 0, 0, b} }

func peer(eid string, ip string, m byte) peerdb.Peer {
	return peerdb.Peer{EndpointID: eid, IPs: []netip.Addr{netip.MustParseAddr(ip)}, MAC: mac(m), Local: true}
}

func liveRec(nid, eid, owner, vtep, ip string, v Version) *record {
	return &record{NetworkID: nid, EndpointID: eid, Owner: owner, Version: v,
		IPs: []netip.Addr{netip.MustParseAddr(ip)}, MAC: mac(1), VTEP: unique.Make(netip.MustParseAddr(vtep))}
}

func tombRec(nid, eid, owner string, v Version, at time.Time) *record {
	return &record{NetworkID: nid, EndpointID: eid, Owner: owner, Version: v, Deleted: true, At: instantOf(at)}
}

// drain returns (and clears) what s wants broadcast, as the wire would
// carry it: encoded and decoded again at now.
func drain(t *testing.T, s *state, now time.Time) []*record {
	t.Helper()
	var out []*record
	for _, r := range s.out {
		m, err := decodeMessage(encodeRecords(kindRecords, []*record{r}, now), now)
		if err != nil {
			t.Fatalf("round trip of %+v: %v", r, err)
		}
		out = append(out, m.recs...)
	}
	for _, k := range s.push {
		m, err := decodeMessage(encodeRecords(kindRecords, []*record{s.get(k)}, now), now)
		if err != nil {
			t.Fatalf("round trip of %v: %v", k, err)
		}
		out = append(out, m.recs...)
	}
	s.out, s.push = nil, nil
	return out
}

func TestVersionCompare(t *testing.T) {
	cases := []struct {
		a, b Version
		want int
	}{
		{Version{1, 5}, Version{1, 5}, 0},
		{Version{1, 5}, Version{1, 6}, -1},
		{Version{2, 0}, Version{1, 99}, 1},
		{Version{1, 99}, Version{2, 1}, -1},
	}
	for _, c := range cases {
		if got := c.a.Compare(c.b); got != c.want {
			t.Errorf("%v vs %v = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestApplyOrdering(t *testing.T) {
	s := newTestState("b", "10.0.0.2", 1)
	join(s, "a", "10.0.0.1", t0)
	v1 := liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.1", Version{10, 1})
	v2 := liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.2", Version{10, 2})

	if !s.apply(v2, srcGossip, t0) {
		t.Fatal("first record not applied")
	}
	if s.apply(v1.clone(), srcGossip, t0) {
		t.Fatal("older version applied over newer")
	}
	if s.apply(v2.clone(), srcGossip, t0) {
		t.Fatal("equal version changed the table")
	}
	if s.stale != 2 {
		t.Errorf("stale = %d, want 2", s.stale)
	}
	got := s.snapshot(netA)
	if len(got) != 1 || got[0].IPs[0] != netip.MustParseAddr("192.168.0.2") {
		t.Fatalf("snapshot = %+v", got)
	}
	if got[0].VTEP != netip.MustParseAddr("10.0.0.1") || got[0].Local {
		t.Errorf("snapshot peer is not remote with the owner's VTEP: %+v", got[0])
	}
	// Endpoint records come from their owner to every member: nothing is
	// relayed.
	if len(s.out) != 0 || len(s.push) != 0 {
		t.Errorf("relay queue = %v, push queue %v, want both empty", s.out, s.push)
	}
	d := s.takeDirty()
	if len(d) != 1 || !d[0].add || d[0].peer.IPs[0] != netip.MustParseAddr("192.168.0.2") {
		t.Errorf("deliveries = %+v", d)
	}
}

func TestTombstoneBlocksOlderAndRecreateWins(t *testing.T) {
	s := newTestState("b", "10.0.0.2", 1)
	join(s, "a", "10.0.0.1", t0)
	s.apply(tombRec(netA, "e1", "a", Version{10, 2}, t0), srcGossip, t0)
	if s.apply(liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.1", Version{10, 1}), srcState, t0) {
		t.Fatal("live record older than the tombstone resurrected the endpoint")
	}
	if len(s.snapshot(netA)) != 0 {
		t.Fatal("tombstoned endpoint visible")
	}
	if !s.apply(liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.3", Version{10, 3}), srcGossip, t0) {
		t.Fatal("re-create newer than the tombstone not applied")
	}
	if got := s.snapshot(netA); len(got) != 1 || got[0].IPs[0] != netip.MustParseAddr("192.168.0.3") {
		t.Fatalf("snapshot = %+v", got)
	}
}

// TestDeleteRecreateAnyOrder is moby #49908: an endpoint deleted and
// re-created (same id, new address and MAC) ends re-created on a receiver
// whatever the order of arrival, and when only some messages arrive
// (coalesced), as long as the last one does.
func TestDeleteRecreateAnyOrder(t *testing.T) {
	owner := newTestState("a", "10.0.0.1", 100)
	// The owner's three versions: create, delete, re-create.
	var msgs []*record
	if err := owner.publish(netA, peer("e1", "192.168.0.1", 1), time.Time{}); err != nil {
		t.Fatal(err)
	}
	msgs = append(msgs, drain(t, owner, t0)...)
	owner.retract(netA, "e1", t0)
	msgs = append(msgs, drain(t, owner, t0)...)
	if err := owner.publish(netA, peer("e1", "192.168.0.9", 9), time.Time{}); err != nil {
		t.Fatal(err)
	}
	msgs = append(msgs, drain(t, owner, t0)...)
	if len(msgs) != 3 || !msgs[1].Deleted {
		t.Fatalf("owner emitted %d messages", len(msgs))
	}
	want := netip.MustParseAddr("192.168.0.9")

	perms := [][]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}, {2}, {0, 2}, {1, 2}, {2, 0}, {2, 1}}
	for _, perm := range perms {
		for _, src := range []source{srcGossip, srcState} {
			s := newTestState("b", "10.0.0.2", 1)
			join(s, "a", "10.0.0.1", t0)
			var sink []delivery
			for _, i := range perm {
				s.apply(msgs[i].clone(), src, t0)
				sink = append(sink, s.takeDirty()...) // delivered between arrivals
			}
			got := s.snapshot(netA)
			if len(got) != 1 || got[0].IPs[0] != want || got[0].MAC != mac(9) {
				t.Errorf("order %v (src %d): snapshot %+v, want re-created endpoint", perm, src, got)
				continue
			}
			last := sink[len(sink)-1]
			if !last.add || last.peer.IPs[0] != want {
				t.Errorf("order %v (src %d): last delivery %+v, want the re-created endpoint", perm, src, last)
			}
		}
	}
}

func TestForeignOwnerRejected(t *testing.T) {
	s := newTestState("b", "10.0.0.2", 1)
	join(s, "a", "10.0.0.1", t0)
	join(s, "c", "10.0.0.3", t0)
	s.apply(liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.1", Version{10, 1}), srcGossip, t0)
	if s.apply(liveRec(netA, "e1", "c", "10.0.0.3", "192.168.0.66", Version{99, 99}), srcGossip, t0) {
		t.Fatal("record for an endpoint owned by another node accepted")
	}
	// A tombstone by a foreign owner is rejected as well.
	if s.apply(tombRec(netA, "e1", "c", Version{99, 100}, t0), srcGossip, t0) {
		t.Fatal("foreign tombstone accepted")
	}
	if s.rejectedOwner != 2 {
		t.Errorf("rejectedOwner = %d, want 2", s.rejectedOwner)
	}
	// A tombstone held for a's endpoint also blocks c.
	s.apply(tombRec(netA, "e1", "a", Version{10, 2}, t0), srcGossip, t0)
	if s.apply(liveRec(netA, "e1", "c", "10.0.0.3", "192.168.0.66", Version{99, 101}), srcGossip, t0) {
		t.Fatal("record accepted over another owner's tombstone")
	}
	// Own endpoints cannot be claimed either.
	if err := s.publish(netA, peer("mine", "192.168.0.5", 5), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if s.apply(liveRec(netA, "mine", "c", "10.0.0.3", "192.168.0.66", Version{99, 102}), srcGossip, t0) {
		t.Fatal("remote record replaced a local endpoint")
	}
	// Once a is gone past the grace, c's claim is accepted.
	s.memberDown("a", t0)
	if s.apply(liveRec(netA, "e1", "c", "10.0.0.3", "192.168.0.66", Version{99, 103}), srcGossip, t0.Add(grace/2)) {
		t.Fatal("claim accepted while the previous owner is within its grace")
	}
	s.sweep(t0.Add(grace))
	if !s.apply(liveRec(netA, "e1", "c", "10.0.0.3", "192.168.0.66", Version{99, 104}), srcGossip, t0.Add(grace)) {
		t.Fatal("claim rejected after the previous owner was purged")
	}
}

func TestVTEPMismatchRejected(t *testing.T) {
	s := newTestState("b", "10.0.0.2", 1)
	join(s, "a", "10.0.0.1", t0)
	if s.apply(liveRec(netA, "e1", "a", "10.0.0.66", "192.168.0.1", Version{10, 1}), srcGossip, t0) {
		t.Fatal("record with a VTEP other than its owner's accepted")
	}
	if s.rejectedVTEP != 1 {
		t.Errorf("rejectedVTEP = %d", s.rejectedVTEP)
	}
	// Without usable meta the VTEP cannot be checked.
	s.memberUp("x", netip.MustParseAddrPort("10.0.0.9:7946"), nil, t0)
	if !s.apply(liveRec(netA, "e2", "x", "10.0.0.66", "192.168.0.2", Version{10, 1}), srcGossip, t0) {
		t.Fatal("record of a member without meta rejected")
	}
	// When x's meta becomes known, what it holds is re-validated.
	s.takeDirty()
	s.memberUp("x", netip.MustParseAddrPort("10.0.0.9:7946"), encodeMeta(netip.MustParseAddr("10.0.0.9"), 1, nil), t0)
	if len(s.snapshot(netA)) != 0 {
		t.Fatal("record with a mismatching VTEP kept after the owner's meta arrived")
	}
	if d := s.takeDirty(); len(d) != 1 || d[0].add {
		t.Errorf("deliveries = %+v, want one delete", d)
	}
}

func TestRecordsOfNonMembers(t *testing.T) {
	s := newTestState("b", "10.0.0.2", 1)
	// Unknown owner: held back until it joins.
	if s.apply(liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.1", Version{10, 1}), srcGossip, t0) {
		t.Fatal("record of an unknown owner applied")
	}
	if s.npend != 1 || len(s.snapshot(netA)) != 0 {
		t.Fatalf("pending = %d", s.npend)
	}
	join(s, "a", "10.0.0.1", t0)
	if s.npend != 0 || len(s.snapshot(netA)) != 1 {
		t.Fatalf("pending record not applied on join: pending %d, snapshot %v", s.npend, s.snapshot(netA))
	}
	// Gone within the grace (maybe a false suspicion): still accepted.
	s.memberDown("a", t0)
	if !s.apply(liveRec(netA, "e2", "a", "10.0.0.1", "192.168.0.2", Version{10, 2}), srcGossip, t0.Add(grace/2)) {
		t.Fatal("record of an owner within its grace rejected")
	}
	// Gone past the grace: a lagging node's copy is rejected.
	if s.apply(liveRec(netA, "e4", "a", "10.0.0.1", "192.168.0.4", Version{10, 4}), srcState, t0.Add(grace)) {
		t.Fatal("record of an owner gone past the grace accepted")
	}
	if s.rejectedNotMember != 1 {
		t.Errorf("rejectedNotMember = %d", s.rejectedNotMember)
	}
	// Pending records expire.
	s.apply(liveRec(netA, "e3", "z", "10.0.0.26", "192.168.0.3", Version{10, 1}), srcGossip, t0)
	s.sweep(t0.Add(s.pendingTTL))
	if s.npend != 0 || s.pendingDropped != 1 {
		t.Errorf("pending = %d, dropped = %d after the pending TTL", s.npend, s.pendingDropped)
	}
}

func TestTombstoneExpiry(t *testing.T) {
	owner := newTestState("a", "10.0.0.1", 100)
	owner.publish(netA, peer("e1", "192.168.0.1", 1), time.Time{})
	live := owner.get(key{netA, "e1"})
	owner.retract(netA, "e1", t0)
	// Sent when the tombstone is 4 minutes old; the receiver's clock is an
	// hour off: ages, not timestamps, travel.
	rt := t0.Add(time.Hour)
	sent := []*record{live, owner.get(key{netA, "e1"})}
	m, err := decodeMessage(encodeRecords(kindRecords, sent, t0.Add(4*time.Minute)), rt)
	if err != nil || len(m.recs) != 2 {
		t.Fatalf("decode: %v", err)
	}
	msgs := m.recs

	s := newTestState("b", "10.0.0.2", 1)
	join(s, "a", "10.0.0.1", rt)
	s.apply(msgs[0], srcGossip, rt)
	s.apply(msgs[1], srcGossip, rt)
	if r := s.get(key{netA, "e1"}); r == nil || !r.Deleted || !r.At.time().Equal(rt.Add(-4*time.Minute)) {
		t.Fatalf("tombstone = %+v, want deleted 4 minutes before the receiver's now", r)
	}
	s.sweep(rt.Add(ttl - 4*time.Minute - time.Millisecond))
	if s.get(key{netA, "e1"}) == nil {
		t.Fatal("tombstone purged before its TTL")
	}
	s.sweep(rt.Add(ttl - 4*time.Minute))
	if s.get(key{netA, "e1"}) != nil || s.expired != 1 {
		t.Fatal("tombstone kept past its TTL")
	}
	// Owner side: its own tombstone expires too.
	owner.sweep(t0.Add(ttl))
	if owner.get(key{netA, "e1"}) != nil {
		t.Fatal("own tombstone kept past its TTL")
	}

	// An already expired tombstone is not stored, but still deletes the
	// older live record it supersedes.
	s2 := newTestState("c", "10.0.0.3", 1)
	join(s2, "a", "10.0.0.1", t0)
	s2.apply(liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.1", Version{100, 1}), srcState, t0)
	s2.takeDirty()
	old := tombRec(netA, "e1", "a", Version{100, 2}, t0.Add(-ttl))
	if !s2.apply(old, srcState, t0) {
		t.Fatal("expired tombstone did not delete the older record")
	}
	if s2.get(key{netA, "e1"}) != nil {
		t.Fatal("expired tombstone stored")
	}
	if d := s2.takeDirty(); len(d) != 1 || d[0].add {
		t.Errorf("deliveries = %+v, want one delete", d)
	}
	if s2.apply(tombRec(netA, "e2", "a", Version{100, 3}, t0.Add(-ttl)), srcState, t0) || s2.get(key{netA, "e2"}) != nil {
		t.Fatal("expired tombstone for an unknown endpoint stored")
	}
}

// TestRestartRetraction: a restarted node (new epoch) that receives its
// previous incarnation's records retracts those it does not hold now, and
// the tombstones beat the old records everywhere.
// TestInstant: a deletion time kept in 8 bytes gives back the ages the
// time.Time gave, on a clock with a monotonic reading (time.Now) and on
// an injected one without.
func TestInstant(t *testing.T) {
	now := time.Now()
	if got := now.Sub(instantOf(now.Add(-time.Minute)).time()); got != time.Minute {
		t.Errorf("age on the monotonic clock %v, want 1m", got)
	}
	if got := instantOf(t0).time(); !got.Equal(t0) {
		t.Errorf("injected clock's time came back as %v, want %v", got, t0)
	}
	if got := t0.Add(time.Hour).Sub(instantOf(t0).time()); got != time.Hour {
		t.Errorf("age on the injected clock %v, want 1h", got)
	}
}

func TestRestartRetraction(t *testing.T) {
	old := newTestState("a", "10.0.0.1", 100)
	old.publish(netA, peer("kept", "192.168.0.1", 1), time.Time{})
	old.publish(netA, peer("lost", "192.168.0.2", 2), time.Time{})
	oldMsgs := drain(t, old, t0)

	other := newTestState("b", "10.0.0.2", 1)
	join(other, "a", "10.0.0.1", t0)
	for _, r := range oldMsgs {
		other.apply(r.clone(), srcGossip, t0)
	}
	other.out = nil

	restarted := newTestState("a", "10.0.0.1", 200)
	restarted.publish(netA, peer("kept", "192.168.0.1", 1), time.Time{}) // the driver re-announces what it has
	drain(t, restarted, t0)
	// Push/pull brings the old incarnation's records back to it.
	for _, r := range oldMsgs {
		restarted.apply(r.clone(), srcState, t0)
	}
	if restarted.retracted != 1 {
		t.Fatalf("retracted = %d, want 1 (only the lost endpoint)", restarted.retracted)
	}
	if r := restarted.get(key{netA, "kept"}); r == nil || r.Deleted || r.Version.Epoch != 200 {
		t.Fatalf("re-announced endpoint = %+v", r)
	}
	retractions := drain(t, restarted, t0)
	if len(retractions) != 1 || !retractions[0].Deleted || retractions[0].EndpointID != "lost" || retractions[0].Version.Epoch != 200 {
		t.Fatalf("retractions = %+v", retractions)
	}
	// A tombstone of the old incarnation changes nothing on the new one.
	if restarted.apply(tombRec(netA, "gone", "a", Version{100, 9}, t0), srcState, t0) {
		t.Error("old tombstone changed the restarted node's table")
	}

	other.apply(retractions[0], srcGossip, t0)
	restartedKept := liveRec(netA, "kept", "a", "10.0.0.1", "192.168.0.1", restarted.get(key{netA, "kept"}).Version)
	restartedKept.MAC = mac(1)
	other.apply(restartedKept, srcGossip, t0)
	got := other.snapshot(netA)
	if len(got) != 1 || got[0].EndpointID != "kept" {
		t.Fatalf("other node's snapshot = %+v, want only the kept endpoint", got)
	}
}

// TestEpochBump: a record under our name with a newer epoch (clock stepped
// back across a restart) moves our epoch past it and re-stamps our records.
func TestEpochBump(t *testing.T) {
	s := newTestState("a", "10.0.0.1", 100)
	s.publish(netA, peer("e1", "192.168.0.1", 1), time.Time{})
	s.out = nil
	s.apply(liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.7", Version{500, 3}), srcState, t0)
	s.apply(liveRec(netA, "e9", "a", "10.0.0.1", "192.168.0.8", Version{500, 4}), srcState, t0)
	if s.epoch <= 500 || s.epochBumps != 1 {
		t.Fatalf("epoch = %d after seeing 500 (bumps %d)", s.epoch, s.epochBumps)
	}
	r := s.get(key{netA, "e1"})
	if r.Deleted || r.IPs[0] != netip.MustParseAddr("192.168.0.1") || r.Version.Compare(Version{500, 3}) <= 0 {
		t.Fatalf("own record after bump = %+v", r)
	}
	if r := s.get(key{netA, "e9"}); r == nil || !r.Deleted || r.Version.Compare(Version{500, 4}) <= 0 {
		t.Fatalf("unknown own record not retracted above its version: %+v", r)
	}
}

func TestGoneOwnerPurgedAfterGrace(t *testing.T) {
	s := newTestState("b", "10.0.0.2", 1)
	join(s, "a", "10.0.0.1", t0)
	s.apply(liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.1", Version{10, 1}), srcGossip, t0)
	s.apply(tombRec(netA, "e2", "a", Version{10, 2}, t0), srcGossip, t0)
	s.takeDirty()

	// Comes back within the grace: loses nothing, even if it goes again.
	s.memberDown("a", t0)
	join(s, "a", "10.0.0.1", t0.Add(grace-time.Second))
	s.sweep(t0.Add(grace + time.Second))
	if len(s.snapshot(netA)) != 1 {
		t.Fatal("records of a node that came back within grace removed")
	}
	s.memberDown("a", t0.Add(grace+2*time.Second))
	s.sweep(t0.Add(2 * grace)) // 30s after the first departure, 28s after the second
	if len(s.snapshot(netA)) != 1 {
		t.Fatal("grace measured from the first departure, not the latest")
	}
	s.sweep(t0.Add(2*grace + 2*time.Second))
	if s.get(key{netA, "e1"}) != nil || s.get(key{netA, "e2"}) != nil {
		t.Fatal("records kept past the grace")
	}
	if d := s.takeDirty(); len(d) != 1 || d[0].add || d[0].eid != "e1" {
		t.Errorf("deliveries = %+v, want delete of e1", d)
	}
	// Purged: a lagging node cannot bring them back.
	if s.apply(liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.1", Version{10, 1}), srcState, t0.Add(3*grace)) {
		t.Fatal("purged record resurrected")
	}
	// Eventually the member is forgotten.
	s.sweep(t0.Add(2*grace + 2*time.Second + s.forgetAfter))
	if _, ok := s.members["a"]; ok {
		t.Error("gone member never forgotten")
	}
}

func TestOwnRecordsNotDelivered(t *testing.T) {
	s := newTestState("a", "10.0.0.1", 1)
	s.publish(netA, peer("e1", "192.168.0.1", 1), time.Time{})
	s.markNetwork(netA)
	if d := s.takeDirty(); len(d) != 0 {
		t.Fatalf("own record delivered: %+v", d)
	}
	if len(s.snapshot(netA)) != 0 {
		t.Fatal("own record in snapshot")
	}
	// Publish stamps VTEP = advertise address, Local false on the wire.
	r := drain(t, s, t0)[0]
	if r.vtep() != netip.MustParseAddr("10.0.0.1") || r.Owner != "a" {
		t.Errorf("published record = %+v", r)
	}
	// Re-publishing the same content is a no-op; new content is a new version.
	s.publish(netA, peer("e1", "192.168.0.1", 1), time.Time{})
	if len(s.push) != 0 {
		t.Error("identical re-publish pushed again")
	}
	s.publish(netA, peer("e1", "192.168.0.2", 1), time.Time{})
	if len(s.push) != 1 {
		t.Error("changed re-publish not pushed")
	}
	// Invalid peers are refused.
	if err := s.publish(netA, peerdb.Peer{EndpointID: "bad", Local: true}, time.Time{}); err == nil {
		t.Error("peer without IPs published")
	}
}

func TestCodecRoundTrip(t *testing.T) {
	hexID := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	recs := []*record{
		{NetworkID: "1kq3t6yq5w3lm0d6o9v0b9c6g", EndpointID: hexID, Owner: "node-1", Version: Version{1 << 62, 7},
			IPs: []netip.Addr{netip.MustParseAddr("10.0.1.2"), netip.MustParseAddr("fd00::2")}, MAC: mac(3), VTEP: unique.Make(netip.MustParseAddr("198.51.100.1"))},
		{NetworkID: "1kq3t6yq5w3lm0d6o9v0b9c6g", EndpointID: "NotHex", Owner: "node-2", Version: Version{5, 1}, Deleted: true, At: instantOf(t0.Add(-90 * time.Second))},
		{NetworkID: "other", EndpointID: "abc", Owner: "node-1", Version: Version{5, 2},
			IPs: []netip.Addr{netip.MustParseAddr("10.0.1.3")}, MAC: mac(4), VTEP: unique.Make(netip.MustParseAddr("2001:db8::1"))},
	}
	buf := encodeRecords(kindState, recs, t0)
	m, err := decodeMessage(buf, t0)
	if err != nil || m.kind != kindState {
		t.Fatalf("decode: %+v, err %v", m, err)
	}
	got := m.recs
	if len(got) != len(recs) {
		t.Fatalf("got %d records", len(got))
	}
	for i := range recs {
		w, g := recs[i], got[i]
		if g.NetworkID != w.NetworkID || g.EndpointID != w.EndpointID || g.Owner != w.Owner || g.Version != w.Version ||
			g.Deleted != w.Deleted || g.At != w.At || g.MAC != w.MAC || g.VTEP != w.VTEP || !slices.Equal(g.IPs, w.IPs) {
			t.Errorf("record %d: got %+v, want %+v", i, g, w)
		}
	}
	one := encodeRecords(kindRecords, recs[:1], t0)
	t.Logf("single live record message: %d bytes; 3-record state: %d bytes", len(one), len(buf))
	if len(one) > 200 {
		t.Errorf("single record message is %d bytes", len(one))
	}
}

// TestDecodeMalformed: no input makes the decoder panic, and broken
// messages are refused as a whole.
func TestDecodeMalformed(t *testing.T) {
	valid := encodeRecords(kindState, []*record{
		liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.1", Version{1, 1}),
		tombRec(netA, "e2", "a", Version{1, 2}, t0),
	}, t0)
	for i := range valid {
		if _, err := decodeMessage(valid[:i], t0); err == nil {
			t.Errorf("truncated message (%d of %d bytes) accepted", i, len(valid))
		}
	}
	if _, err := decodeMessage(append(bytes.Clone(valid), 0), t0); err == nil {
		t.Error("trailing byte accepted")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := bytes.Clone(valid)
		for range 1 + rng.IntN(4) {
			b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
		}
		decodeMessage(b, t0) // must not panic
	}
	for range 20000 {
		b := make([]byte, rng.IntN(64))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if len(b) > 2 {
			b[0], b[1] = wireMagic, wireMin
		}
		decodeMessage(b, t0)
	}
	// Forged huge counts must not allocate beyond the message.
	huge := []byte{wireMagic, wireMin, kindState, 0xff, 0xff, 0xff, 0xff, 0x0f}
	if _, err := decodeMessage(huge, t0); err == nil {
		t.Error("forged count accepted")
	}
	// Semantically invalid records (multicast MAC, no IPs) are refused.
	bad := liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.1", Version{1, 1})
	bad.MAC[0] = 1
	if _, err := decodeMessage(encodeRecords(kindRecords, []*record{bad}, t0), t0); err == nil {
		t.Error("multicast MAC accepted")
	}
	noIP := liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.1", Version{1, 1})
	noIP.IPs = nil
	if _, err := decodeMessage(encodeRecords(kindRecords, []*record{noIP}, t0), t0); err == nil {
		t.Error("record without IPs accepted")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encodeRecords(kindState, []*record{
		liveRec(netA, "e1", "a", "10.0.0.1", "192.168.0.1", Version{1, 1}),
		tombRec(netA, "e2", "a", Version{1, 2}, t0),
	}, t0))
	f.Add([]byte{wireMagic, wireMin, kindRecords})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMessage(b, t0)
		if err != nil {
			return
		}
		for _, r := range m.recs {
			if r.validate() != nil {
				t.Fatalf("decoded an invalid record %+v", r)
			}
		}
	})
}

func TestMeta(t *testing.T) {
	for _, a := range []string{"198.51.100.7", "2001:db8::7"} {
		vtep, epoch, _, err := parseMeta(encodeMeta(netip.MustParseAddr(a), 42, nil))
		if err != nil || vtep != netip.MustParseAddr(a) || epoch != 42 {
			t.Errorf("meta round trip of %s: %v %d %v", a, vtep, epoch, err)
		}
	}
	vtep, _, data, err := parseMeta(encodeMeta(netip.MustParseAddr("198.51.100.7"), 1, []byte("node data")))
	if err != nil || string(data) != "node data" || vtep != netip.MustParseAddr("198.51.100.7") {
		t.Errorf("meta with node data: %v %q %v", vtep, data, err)
	}
	for _, b := range [][]byte{nil, {1}, {2, 4, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0}, {1, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {1, 5, 1}} {
		if _, _, _, err := parseMeta(b); err == nil {
			t.Errorf("meta %v accepted", b)
		}
	}
}

// TestRetractionAwaitsTheRepublish: the old incarnation's records come
// back to a restarted node BEFORE its driver has re-announced what it
// still holds (the join happens in New). With AwaitOwn nothing is
// retracted meanwhile: the others would drop an endpoint whose container
// kept running until the re-announcement. Once settled, only what was not
// re-announced is.
func TestRetractionAwaitsTheRepublish(t *testing.T) {
	old := newTestState("a", "10.0.0.1", 100)
	old.publish(netA, peer("kept", "192.168.0.1", 1), time.Time{})
	old.publish(netA, peer("lost", "192.168.0.2", 2), time.Time{})
	oldMsgs := drain(t, old, t0)

	restarted := newTestState("a", "10.0.0.1", 200)
	restarted.heldOwn = map[key]*record{} // Config.AwaitOwn
	for _, r := range oldMsgs {
		restarted.apply(r.clone(), srcState, t0)
	}
	if restarted.retracted != 0 || len(restarted.out) != 0 {
		t.Fatalf("retracted %d before the republish, %d to broadcast", restarted.retracted, len(restarted.out))
	}
	restarted.publish(netA, peer("kept", "192.168.0.1", 1), time.Time{}) // the driver re-announces what it has
	drain(t, restarted, t0)
	restarted.settleOwn(t0)
	if restarted.retracted != 1 {
		t.Fatalf("retracted = %d once settled, want 1 (only the lost endpoint)", restarted.retracted)
	}
	if r := restarted.get(key{netA, "kept"}); r == nil || r.Deleted {
		t.Fatalf("re-announced endpoint = %+v", r)
	}
	if r := restarted.get(key{netA, "lost"}); r == nil || !r.Deleted || r.Version.Epoch != 200 {
		t.Fatalf("lost endpoint = %+v, want a tombstone of the new epoch", r)
	}
}

// TestOtherPortTakesOutWhatWasDelivered: the settings of a node on another
// VXLAN port may come after its records: what was delivered is taken out.
func TestOtherPortTakesOutWhatWasDelivered(t *testing.T) {
	s := newTestState("a", "10.0.0.1", 100)
	s.port = 4789
	join(s, "b", "10.0.0.2", t0)
	s.apply(liveRec(netA, "e1", "b", "10.0.0.2", "192.168.0.9", Version{Epoch: 1, Seq: 1}), srcPush, t0)
	if d := s.takeDirty(); len(d) != 1 || !d[0].add {
		t.Fatalf("first delivery %+v, want the add", d)
	}
	s.adverts["b"] = advert{epoch: 1, Settings: Settings{VXLANPort: 4790, UnderlayMTU: 1500}}
	s.markOwner("b")
	if d := s.takeDirty(); len(d) != 1 || d[0].add || d[0].eid != "e1" {
		t.Fatalf("after b said it is on 4790: %+v, want e1 deleted", d)
	}
	if got := s.snapshot(netA); len(got) != 0 {
		t.Fatalf("snapshot %v", got)
	}
}
