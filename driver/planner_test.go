package driver

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/internal/countmap"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

var (
	vtepA = netip.MustParseAddr("192.0.2.1")
	vtepB = netip.MustParseAddr("192.0.2.2")
	macA  = hwaddr.MAC{2, 0, 0, 0, 0, 0xa}
	ipA   = netip.MustParseAddr("10.1.0.10")
)

// addTo adds p to db and returns the changes.
func addTo(t *testing.T, db *peerdb.DB, p peerdb.Peer) []peerdb.Change {
	t.Helper()
	c, err := db.Add(p)
	must(t, err)
	return c
}

func TestPlannerTakesBeforeFirstEntryAndReleasesAfterLast(t *testing.T) {
	var db peerdb.DB
	pl := newPlanner()
	w := pl.Apply(addTo(t, &db, remotePeer("e1", ipA.String(), macA.String(), vtepA.String())), true)
	if !slices.Equal(w.take, []netip.Addr{vtepA}) || len(w.release) != 0 {
		t.Errorf("add: take %v release %v, want take [%v]", w.take, w.release, vtepA)
	}
	wantOps := []kernel.EntryOp{
		{Kind: kernel.OpSetNeighbor, Neighbor: kernel.Neighbor{IP: ipA, MAC: macA}},
		{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{VTEP: vtepA}},
		{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{MAC: macA, VTEP: vtepA}},
	}
	if !slices.Equal(w.ops, wantOps) {
		t.Errorf("add: ops %v, want %v", w.ops, wantOps)
	}

	w = pl.Apply(db.Delete("e1"), true)
	if len(w.take) != 0 || !slices.Equal(w.release, []netip.Addr{vtepA}) {
		t.Errorf("delete: take %v release %v, want release [%v]", w.take, w.release, vtepA)
	}
	wantOps = []kernel.EntryOp{
		{Kind: kernel.OpDeleteNeighbor, Neighbor: kernel.Neighbor{IP: ipA}},
		{Kind: kernel.OpDeleteFDB, FDB: kernel.FDBEntry{MAC: macA, VTEP: vtepA}},
		{Kind: kernel.OpDeleteFDB, FDB: kernel.FDBEntry{VTEP: vtepA}},
	}
	if !slices.Equal(w.ops, wantOps) {
		t.Errorf("delete: ops %v, want %v", w.ops, wantOps)
	}
	if len(pl.fdb) != 0 {
		t.Errorf("books %v after the last delete, want none", pl.fdb)
	}
}

func TestPlannerSharedEntryCountsBindings(t *testing.T) {
	var db peerdb.DB
	pl := newPlanner()
	p := remotePeer("e1", ipA.String(), macA.String(), vtepA.String())
	p.IPs = append(p.IPs, netip.MustParseAddr("fd00:1::a"))
	pl.Apply(addTo(t, &db, p), false)
	if got := pl.fdb[vtepA][macA]; got != 2 {
		t.Fatalf("count of (%v, %v) = %d, want 2: one per IP", vtepA, macA, got)
	}
	// Moving the endpoint to another host moves its entry and reference.
	p.VTEP = vtepB
	w := pl.Apply(addTo(t, &db, p), false)
	if !slices.Equal(w.take, []netip.Addr{vtepB}) || !slices.Equal(w.release, []netip.Addr{vtepA}) {
		t.Errorf("move: take %v release %v, want [%v] [%v]", w.take, w.release, vtepB, vtepA)
	}
}

func TestPlannerLocalPeersNeedNoEntry(t *testing.T) {
	var db peerdb.DB
	pl := newPlanner()
	w := pl.Apply(addTo(t, &db, peerdb.Peer{EndpointID: "e1", IPs: []netip.Addr{ipA}, MAC: macA, Local: true}), true)
	if len(w.ops)+len(w.take)+len(w.release) != 0 || len(pl.fdb) != 0 {
		t.Errorf("local peer planned %+v, books %v; want nothing", w, pl.fdb)
	}
}

func TestPlannerResyncUnreadKernelSettlesBooksOnly(t *testing.T) {
	var db peerdb.DB
	addTo(t, &db, remotePeer("e1", ipA.String(), macA.String(), vtepA.String()))
	pl := newPlanner()
	pl.fdb[vtepB] = countmap.Map[hwaddr.MAC]{macA: 1}
	w := pl.Resync(db.Bindings(), nil, true, func(netip.Addr) bool { return true }, &pass{})
	if len(w.ops) != 0 || !slices.Equal(w.take, []netip.Addr{vtepA}) || !slices.Equal(w.release, []netip.Addr{vtepB}) {
		t.Errorf("resync with no kernel read: %+v, want no ops, take [%v], release [%v]", w, vtepA, vtepB)
	}
}

func TestPlannerResyncRepairs(t *testing.T) {
	var db peerdb.DB
	addTo(t, &db, remotePeer("e1", ipA.String(), macA.String(), vtepA.String()))
	stray := netip.MustParseAddr("10.1.0.99")
	strayMAC := hwaddr.MAC{2, 0, 0, 0, 0, 0x99}
	actual := &sandboxEntries{
		neighbors: []kernel.Neighbor{{IP: ipA, MAC: strayMAC}, {IP: stray, MAC: strayMAC}},
		fdb:       []kernel.FDBEntry{{MAC: strayMAC, VTEP: vtepB}},
	}
	for _, removable := range []bool{false, true} {
		t.Run(fmt.Sprint("removable=", removable), func(t *testing.T) {
			pl := newPlanner()
			var p pass
			w := pl.Resync(db.Bindings(), actual, false, func(netip.Addr) bool { return removable }, &p)
			want := map[string]int{RepairNeighborReplaced: 1, RepairFDBAdded: 1}
			if removable {
				want[RepairNeighborRemoved], want[RepairFDBRemoved] = 1, 1
			}
			if !maps.Equal(p.counts, want) {
				t.Errorf("repairs %v, want %v", p.counts, want)
			}
			if len(w.ops) != p.total() {
				t.Errorf("%d ops for %d repairs: %v", len(w.ops), p.total(), w.ops)
			}
		})
	}
}

func TestPlannerResetReleasesEveryRemote(t *testing.T) {
	var db peerdb.DB
	pl := newPlanner()
	pl.Apply(addTo(t, &db, remotePeer("e1", ipA.String(), macA.String(), vtepA.String())), false)
	pl.Apply(addTo(t, &db, remotePeer("e2", "10.1.0.11", "02:00:00:00:00:0b", vtepB.String())), false)
	got := pl.Reset()
	slices.SortFunc(got, netip.Addr.Compare)
	if !slices.Equal(got, []netip.Addr{vtepA, vtepB}) || len(pl.fdb) != 0 {
		t.Errorf("Reset released %v and kept %v, want [%v %v] and nothing", got, pl.fdb, vtepA, vtepB)
	}
}

// TestPlannerApplyAgreesWithResync is the property that makes the fast
// path safe: after any run of changes applied to the fake kernel, a fresh
// planner's Resync against that kernel finds the same books, the same
// IPsec references and nothing to repair.
func TestPlannerApplyAgreesWithResync(t *testing.T) {
	vteps := []netip.Addr{vtepA, vtepB, netip.MustParseAddr("192.0.2.3")}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 21))
		flood := seed%2 == 0
		k := fakekernel.New()
		must(t, k.CreateSandbox(kernel.SandboxSpec{Name: "n1", VNI: 1, Port: 4789, Local: localVTEP, MTU: 1450}))
		var db peerdb.DB
		pl := newPlanner()
		refs := countmap.Map[netip.Addr]{}
		for range 1 + rng.IntN(40) {
			id := rng.IntN(8)
			var changes []peerdb.Change
			if rng.IntN(4) == 0 {
				changes = db.Delete(fmt.Sprint("e", id))
			} else {
				// Few IPs for many endpoints: owners change hands.
				p := peerdb.Peer{EndpointID: fmt.Sprint("e", id), IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 1, 0, byte(rng.IntN(6))})},
					MAC: hwaddr.MAC{2, 0, 0, 0, 0, byte(id)}, VTEP: vteps[rng.IntN(len(vteps))]}
				if rng.IntN(3) == 0 {
					p.IPs = append(p.IPs, netip.AddrFrom4([4]byte{10, 1, 0, byte(rng.IntN(6))}))
				}
				p.Local = rng.IntN(8) == 0
				changes = addTo(t, &db, p)
			}
			w := pl.Apply(changes, flood)
			for _, v := range w.take {
				refs.Add(v, 1)
			}
			for i, err := range k.Program("n1", w.ops) {
				if err != nil && !(isDelete(w.ops[i].Kind) && errors.Is(err, kernel.ErrNotFound)) {
					t.Fatalf("seed %d: %v: %v", seed, w.ops[i], err)
				}
			}
			for _, v := range w.release {
				refs.Add(v, -1)
			}
		}
		neighs, err := k.Neighbors("n1")
		must(t, err)
		fdb, err := k.FDB("n1")
		must(t, err)
		actual := &sandboxEntries{neighbors: neighs, fdb: fdb}
		all := func(netip.Addr) bool { return true }

		fresh := newPlanner()
		var p pass
		w := fresh.Resync(db.Bindings(), actual, flood, all, &p)
		if !maps.EqualFunc(pl.fdb, fresh.fdb, maps.Equal) {
			t.Fatalf("seed %d: applied books %v, fresh resync's %v", seed, pl.fdb, fresh.fdb)
		}
		if len(w.ops) != 0 {
			t.Fatalf("seed %d: the kernel after Apply needs repairs %v: %v", seed, p.counts, w.ops)
		}
		taken := countmap.Map[netip.Addr]{}
		for _, v := range w.take {
			taken.Add(v, 1)
		}
		if !maps.Equal(refs, taken) {
			t.Fatalf("seed %d: Apply holds IPsec references %v, a fresh resync takes %v", seed, refs, taken)
		}
		if w := pl.Resync(db.Bindings(), actual, flood, all, &pass{}); len(w.ops)+len(w.take)+len(w.release) != 0 {
			t.Fatalf("seed %d: resync after Apply plans %+v, want nothing", seed, w)
		}
	}
}

// Two remote VTEPs bind one MAC (a task's address, and with it its derived
// MAC, given out again on another host before the old holder's retraction
// arrived; or a duplicate). The kernel keeps one entry per MAC, the last
// written: when the VTEP it points at loses the MAC, the other's entry is
// written again, not left out until the next resync.
func TestPlannerRewritesTheOtherHolderOfAMAC(t *testing.T) {
	var db peerdb.DB
	pl := newPlanner()
	pl.Apply(addTo(t, &db, remotePeer("old", ipA.String(), macA.String(), vtepA.String())), false)
	pl.Apply(addTo(t, &db, remotePeer("new", "10.1.0.11", macA.String(), vtepB.String())), false)
	w := pl.Apply(db.Delete("new"), false)
	want := kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{MAC: macA, VTEP: vtepA}}
	if len(w.ops) == 0 || w.ops[len(w.ops)-1] != want {
		t.Fatalf("ops %v, want the last to rewrite %v", w.ops, want)
	}
	w = pl.Apply(db.Delete("old"), false)
	for _, op := range w.ops {
		if op.Kind == kernel.OpAddFDB {
			t.Fatalf("the last holder's delete wrote %v", op)
		}
	}
}
