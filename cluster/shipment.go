package cluster

import "time"

// What anti-entropy ships for the groups whose digests differ. A digest
// says THAT two nodes differ, not in what; shipping every record of every
// differing owner, as the first version did, sent each record about 17
// times in a 100-host rollout: while a burst is on its way, nearly every
// owner differs somewhere, and both sides ship all of it. Two rules keep
// a shipment to what the peer is likely to lack:
//
//   - High-water marks. Each owner digest carries the sender's mark of the
//     owner (the highest version of its records it took in, tombstones
//     included). Versions are the owner's own counter, so what the peer
//     lacks is mostly above its mark. The side with the higher mark ships
//     the records above the peer's mark; and if, below that mark, its
//     digest is not the peer's (a hole: a push lost, or an update or a
//     delete of an older record that the peer missed), everything of the
//     owner, as before, unless something above the mark is still settling
//     (the difference may be on its way). Equal marks with
//     differing digests ship everything both ways; the side with the lower
//     mark ships nothing and leaves it to the other side's turn (the next
//     message of the exchange, sync.go).
//   - What is on its way is left out. This node's own records queued for
//     the peer, or in a push to it under way, are (push.go knows which).
//     Another owner's record this node took in less than settle ago is
//     too: its owner pushes to every member and retries a failed push
//     while the member is alive (push.go), so the peer most likely has
//     it, or soon will; settle is long enough for a CPU-starved owner's
//     pushes, since a third party's copy is needed only where the owner
//     cannot reach the peer and the others can. Records under the peer's
//     own name are never held back: nothing of its own is on its way to
//     it, and it must learn at once of those it does not hold (from an
//     earlier incarnation, or forged), to retract them.
//
// Memberships (memberGroup) are few and carry no mark: their group is
// shipped whole, as before. A peer of wire version 2 sends no marks: its
// groups are shipped whole too, settled records only.

// settleIntervals is settle in anti-entropy rounds (SyncInterval): a push
// normally lands in milliseconds, but a CPU-starved owner's may take many
// seconds (20 at 100 hosts on two cores, before the duplicates it caused
// were gone).
const settleIntervals = 10

// shipment returns this node's records of nid for peer, whose differing
// group digests are theirs; queued says which of this node's own records
// are on their way to peer (nil: none).
func (s *state) shipment(nid, peer string, theirs []ownerDigest, queued func(key) bool, now time.Time) []*record {
	type plan struct {
		peer  ownerDigest
		delta bool   // ship only the records above peer.hw, unless below
		below digest // this node's live records at or below peer.hw
		above []*record
		all   []*record
		// moving: a record above peer.hw is not settled, so the peer's
		// digest may differ below its mark by what is on its way (an
		// update or a delete of an older record): no hole is assumed.
		moving bool
	}
	plans := make(map[string]*plan, len(theirs))
	var out []*record
	for _, g := range theirs {
		if g.owner == memberGroup {
			for _, r := range s.netm[nid] {
				if s.counted(r) {
					out = append(out, r)
				}
			}
			continue
		}
		hw := s.mark(nid, g.owner)
		switch {
		case g.hw == (Version{}) || hw.Compare(g.hw) == 0:
			plans[g.owner] = &plan{peer: g}
		case hw.Compare(g.hw) > 0:
			// below starts as the owner's whole digest and loses the live
			// records above the peer's mark, which are few: hashing every
			// record at or below the mark cost more.
			plans[g.owner] = &plan{peer: g, delta: true, below: s.ownerDigest(nid, g.owner)}
		}
	}
	if len(plans) == 0 {
		return out
	}
	settled := instantOf(now.Add(-s.settle))
	for _, r := range s.nets[nid] {
		p := plans[r.Owner]
		if p == nil {
			continue
		}
		above := r.Version.Compare(p.peer.hw) > 0
		if p.delta && above && !r.Deleted {
			p.below.remove(r)
		}
		if s.onItsWay(r, peer, queued, settled) {
			p.moving = p.moving || above
			continue
		}
		p.all = append(p.all, r)
		if p.delta && above {
			p.above = append(p.above, r)
		}
	}
	for _, p := range plans {
		if p.delta && (p.below == p.peer.d || p.moving) {
			out = append(out, p.above...)
		} else {
			out = append(out, p.all...)
		}
	}
	return out
}

// onItsWay reports whether r is likely on its way to peer already: see
// shipment.
func (s *state) onItsWay(r *record, peer string, queued func(key) bool, settled instant) bool {
	switch r.Owner {
	case peer:
		return false
	case s.self:
		return queued != nil && queued(r.key())
	}
	return s.settle > 0 && r.At > settled
}
