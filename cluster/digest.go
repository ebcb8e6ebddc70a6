package cluster

import "encoding/binary"

// digest summarises a set of live records: how many, and the XOR of a
// hash of each one's (endpoint id, version). Two nodes whose digests of a
// network (or of one owner's records in it) are equal hold the same live
// records there; anti-entropy compares digests and ships records only
// where they differ. A network's memberships form one more group,
// memberGroup, so that its members also agree on who its members are. Tombstones are left out: a node that never saw
// a record needs no tombstone for it, and one that holds the record live
// differs from one that holds its tombstone, so the tombstone is shipped.
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

// group is the digest group r counts in.
func (r *record) group() string {
	if r.Member {
		return memberGroup
	}
	return r.Owner
}

// indexDigest accounts r (live records only) in its network's digest of
// its group; unindexDigest takes it out again.
func (s *state) indexDigest(r *record) {
	if r.Deleted {
		return
	}
	groups := s.digests[r.NetworkID]
	if groups == nil {
		groups = map[string]*digest{}
		s.digests[r.NetworkID] = groups
	}
	d := groups[r.group()]
	if d == nil {
		d = &digest{}
		groups[r.group()] = d
	}
	d.add(r)
}

func (s *state) unindexDigest(r *record) {
	if r.Deleted {
		return
	}
	groups := s.digests[r.NetworkID]
	d := groups[r.group()]
	if d == nil {
		return
	}
	d.remove(r)
	if d.zero() {
		delete(groups, r.group())
		if len(groups) == 0 {
			delete(s.digests, r.NetworkID)
		}
	}
}

// networkDigest is the digest of every live endpoint record of nid.
func (s *state) networkDigest(nid string) digest {
	var sum digest
	for _, d := range s.digests[nid] {
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

// groupRecords returns the records of nid in any of groups, tombstones
// included, for a peer whose digests of them differ.
func (s *state) groupRecords(nid string, groups []string) []*record {
	want := make(map[string]bool, len(groups))
	for _, g := range groups {
		want[g] = true
	}
	var out []*record
	if want[memberGroup] {
		for _, r := range s.netm[nid] {
			out = append(out, r)
		}
	}
	for _, r := range s.nets[nid] {
		if want[r.Owner] {
			out = append(out, r)
		}
	}
	return out
}
