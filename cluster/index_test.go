package cluster

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestIndexesMatchTheTable: after any mix of publishes, retractions,
// remote records and tombstones, members leaving and sweeps, the
// tombstone set and the digests (which Stats, Members and sweep read
// instead of scanning) hold exactly what a scan of the table finds.
func TestIndexesMatchTheTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := newTestState("a", "10.0.0.1", 100)
	now := t0
	owners := []string{"b", "c", "d"}
	for i, o := range owners {
		join(s, o, fmt.Sprintf("10.0.0.%d", i+2), now)
		s.apply(&record{NetworkID: netA, EndpointID: memberEID(o), Owner: o, Member: true, Version: Version{1, 0}}, srcGossip, now)
	}
	seq := uint64(1)
	for step := range 3000 {
		now = now.Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
		eid := fmt.Sprintf("e%d", rng.IntN(40))
		switch op := rng.IntN(10); {
		case op < 3:
			s.publish(netA, peer(eid, "192.168.0.1", 1), now)
		case op < 4:
			s.retract(netA, eid, now)
		case op < 7:
			i := rng.IntN(len(owners))
			seq++
			r := liveRec(netA, eid, owners[i], fmt.Sprintf("10.0.0.%d", i+2), "192.168.0.2", Version{1, seq})
			s.apply(r, srcGossip, now)
		case op < 9:
			seq++
			s.apply(tombRec(netA, eid, owners[rng.IntN(len(owners))], Version{1, seq}, now), srcGossip, now)
		case rng.IntN(4) == 0:
			// A member goes, is purged past the grace, and comes back.
			i := rng.IntN(len(owners))
			s.memberDown(owners[i], now)
			now = now.Add(grace)
			s.sweep(now)
			join(s, owners[i], fmt.Sprintf("10.0.0.%d", i+2), now)
		default:
			s.sweep(now.Add(time.Duration(rng.Int64N(int64(ttl)))))
		}
		s.takeDirty()
		s.out, s.push = nil, nil
		if err := checkIndexes(s); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
	}
	if len(s.tombs) == 0 || len(s.digests[netA]) == 0 {
		t.Fatalf("the run left %d tombstones and %d owner digests: it proved nothing", len(s.tombs), len(s.digests[netA]))
	}
}

// checkIndexes compares the indexes with a scan of the table.
func checkIndexes(s *state) error {
	tombs := map[key]bool{}
	digests := map[string]map[string]digest{}
	for _, tbl := range [...]map[string]map[string]*record{s.nets, s.netm} {
		for nid, recs := range tbl {
			for eid, r := range recs {
				if r.Deleted {
					tombs[key{nid, eid}] = true
				}
				if r.endpoint() {
					if digests[nid] == nil {
						digests[nid] = map[string]digest{}
					}
					d := digests[nid][r.Owner]
					d.add(r)
					digests[nid][r.Owner] = d
				}
			}
		}
	}
	if len(tombs) != len(s.tombs) {
		return fmt.Errorf("%d tombstones in the table, %d in the set", len(tombs), len(s.tombs))
	}
	for k := range s.tombs {
		if !tombs[k] {
			return fmt.Errorf("%v in the tombstone set is not a tombstone", k)
		}
	}
	for nid, owners := range s.digests {
		for owner, d := range owners {
			if digests[nid][owner] != *d {
				return fmt.Errorf("digest of %s/%s is %+v, the table's %+v", nid, owner, *d, digests[nid][owner])
			}
			delete(digests[nid], owner)
		}
	}
	for nid, owners := range digests {
		if len(owners) > 0 {
			return fmt.Errorf("network %s: owners %v have records and no digest", nid, owners)
		}
	}
	return nil
}
