package cluster

import (
	"testing"
	"time"
)

// A record from the network is held to the driver's id rule
// (peerdb.CheckID), tombstones included: what the table takes, the driver
// can delete. Before, a tombstone "0-forged" or a network "a/b" entered the
// table, and an owner name with a control character went into the logs.
func TestDecodeRefusesIdsTheDriverRefuses(t *testing.T) {
	tomb := func(nid, eid, owner string) *record {
		return &record{NetworkID: nid, EndpointID: eid, Owner: owner, Version: Version{5, 1}, Deleted: true, At: instantOf(t0)}
	}
	for name, r := range map[string]*record{
		"live record, forged endpoint id": liveRec("neta", "0-forged", "a", "192.168.0.1", "10.0.0.1", Version{5, 1}),
		"live record, network id a/b":     liveRec("a/b", "e1", "a", "192.168.0.1", "10.0.0.1", Version{5, 1}),
		"tombstone, forged endpoint id":   tomb("neta", "0-forged", "a"),
		"tombstone, network id a/b":       tomb("a/b", "e1", "a"),
		"membership, network id a/b":      {NetworkID: "a/b", EndpointID: memberEID("a"), Owner: "a", Member: true, Version: Version{5, 1}},
		"owner with a control character":  tomb("neta", "e1", "a\nb"),
	} {
		if _, err := decodeMessage(encodeRecords(kindPush, []*record{r}, t0), t0.Add(time.Second)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}
