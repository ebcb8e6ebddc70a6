package cluster

import "encoding/binary"

// digest summarises a set of live records: how many, and the XOR of a
// hash of each one's (endpoint id, version). Two nodes whose digests of a
// network (or of one owner's records in it) are equal hold the same live
// records there; anti-entropy compares digests and ships records only
// where they differ. A network's memberships form one more group,
// memberGroup, so that its members also agree on who its members are.
// Tombstones are left out: a node that never saw a record needs no
// tombstone for it, and one that holds the record live differs from one
// that holds its tombstone, so the tombstone is shipped.
//
// Only owners alive in this node's view count (syncOwners). Two nodes
// that disagree about an owner's liveness (a suspicion, a purge after the
// grace on one of them) would otherwise ship its records back and forth
// every round, to be refused: that fed a storm on a CPU-starved 100-host
// benchmark, where suspicions are many.
type digest struct {
	count uint64
	hash  uint64
}

func (d *digest) add(r *record) {
	d.count++
	d.hash ^= recordHash(r)
}

func (d *digest) remove(r *record) {
	d.count--
	d.hash ^= recordHash(r)
}

func (d digest) zero() bool { return d.count == 0 }

// recordHash is FNV-1a over the endpoint id and the version: every node
// computes the same value for the same record.
func recordHash(r *record) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for i := 0; i < len(r.EndpointID); i++ {
		h = (h ^ uint64(r.EndpointID[i])) * prime
	}
	var v [16]byte
	binary.BigEndian.PutUint64(v[:8], r.Version.Epoch)
	binary.BigEndian.PutUint64(v[8:], r.Version.Seq)
	for _, b := range v {
		h = (h ^ uint64(b)) * prime
	}
	return h
}

// memberGroup is the digest group of a network's memberships. No node is
// named so: memberlist node names are printable.
const memberGroup = "\x00members"

// indexDigest accounts r (live endpoint records only) in its network's
// digest of its owner; unindexDigest takes it out again. Memberships are
// few: their digest is computed when asked for (memberDigest).
func (s *state) indexDigest(r *record) {
	if !r.endpoint() {
		return
	}
	owners := s.digests[r.NetworkID]
	if owners == nil {
		owners = map[string]*digest{}
		s.digests[r.NetworkID] = owners
	}
	d := owners[r.Owner]
	if d == nil {
		d = &digest{}
		owners[r.Owner] = d
	}
	d.add(r)
}

func (s *state) unindexDigest(r *record) {
	if !r.endpoint() {
		return
	}
	owners := s.digests[r.NetworkID]
	d := owners[r.Owner]
	if d == nil {
		return
	}
	d.remove(r)
	if d.zero() {
		delete(owners, r.Owner)
		if len(owners) == 0 {
			delete(s.digests, r.NetworkID)
		}
	}
}

// counts reports whether owner's records of nid take part in
// anti-entropy here (see counted).
func (s *state) counts(nid, owner string) bool {
	return s.counted(s.netm[nid][memberEID(owner)])
}

// counted reports whether the owner of membership r counts: this node or
// an alive node, with r live.
func (s *state) counted(r *record) bool {
	if r == nil || r.Deleted {
		return false
	}
	if r.Owner == s.self {
		return true
	}
	m := s.members[r.Owner]
	return m != nil && m.alive
}

// syncOwners lists the owners whose records of nid count.
func (s *state) syncOwners(nid string) []string {
	var out []string
	for _, r := range s.netm[nid] {
		if s.counted(r) {
			out = append(out, r.Owner)
		}
	}
	return out
}

// memberDigest is the digest of the memberships of nid of the owners that
// count.
func (s *state) memberDigest(nid string) digest {
	var d digest
	for _, r := range s.netm[nid] {
		if s.counted(r) {
			d.add(r)
		}
	}
	return d
}

// groupDigest is the digest of one group of nid: its memberships, or an
// owner's endpoint records.
func (s *state) groupDigest(nid, group string) digest {
	if group == memberGroup {
		return s.memberDigest(nid)
	}
	return s.ownerDigest(nid, group)
}

// networkDigest is the digest of nid's memberships and of the endpoint
// records of every owner that counts.
func (s *state) networkDigest(nid string) digest {
	sum := s.memberDigest(nid)
	for _, owner := range s.syncOwners(nid) {
		d := s.ownerDigest(nid, owner)
		sum.count += d.count
		sum.hash ^= d.hash
	}
	return sum
}

// ownerDigest is the digest of owner's live endpoint records in nid.
func (s *state) ownerDigest(nid, owner string) digest {
	if d := s.digests[nid][owner]; d != nil {
		return *d
	}
	return digest{}
}

// raiseMark accounts endpoint record r (live or a tombstone) in its
// owner's high-water mark of its network.
func (s *state) raiseMark(r *record) {
	if r.Member {
		return
	}
	owners := s.marks[r.NetworkID]
	if owners == nil {
		owners = map[string]Version{}
		s.marks[r.NetworkID] = owners
	}
	if r.Version.Compare(owners[r.Owner]) > 0 {
		owners[r.Owner] = r.Version
	}
}

// mark is the highest version of owner's endpoint records of nid this
// node took in, tombstones included (zero: none). It never goes down
// while the owner and the network are known here, even when records
// expire: a peer that takes it for too high ships more, never less
// (sync.go).
func (s *state) mark(nid, owner string) Version {
	if owner == memberGroup {
		return Version{}
	}
	return s.marks[nid][owner]
}
