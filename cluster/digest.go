package cluster

import "encoding/binary"

// digest summarises a set of live endpoint records: how many, and the XOR
// of a hash of each one's (endpoint id, version). Two nodes whose digests
// of a network (or of one owner's records in it) are equal hold the same
// live records there; anti-entropy compares digests and ships records
// only where they differ. Tombstones are left out: a node that never saw
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

// indexDigest accounts r (live endpoint records only) in its network's
// per-owner digest; unindexDigest takes it out again.
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

// groupRecords returns owner's records of nid, tombstones included, for
// a peer whose digest differs.
func (s *state) groupRecords(nid, owner string) []*record {
	var out []*record
	for k := range s.byOwner[owner] {
		if k.nid == nid {
			if r := s.get(k); r != nil && !r.Member {
				out = append(out, r)
			}
		}
	}
	return out
}
