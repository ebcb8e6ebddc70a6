package kernel_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
)

// TestProgram: more ops than one window, IPv4 and IPv6, with failing ops
// among them; each failure is reported on its own op and the rest are
// applied, in order.
func TestProgram(t *testing.T) {
	hst := newHost(t)
	k := hst.k
	const sb = "prog"
	if err := k.CreateSandbox(spec(sb, 300, "198.51.100.1")); err != nil {
		t.Fatal(err)
	}
	v1 := netip.MustParseAddr("198.51.100.2")
	const peers = 700
	var ops []kernel.EntryOp
	wantN := map[netip.Addr]hwaddr.MAC{}
	for i := range peers {
		mac := hwaddr.MAC{0x02, 0x42, 10, 1, byte(i >> 8), byte(i)}
		ip := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		ops = append(ops, kernel.EntryOp{Kind: kernel.OpSetNeighbor, Neighbor: kernel.Neighbor{IP: ip, MAC: mac}},
			kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{MAC: mac, VTEP: v1}})
		wantN[ip] = mac
	}
	ip6 := netip.MustParseAddr("2001:db8:1::7")
	missing := netip.MustParseAddr("10.9.9.9")
	bad := []int{len(ops), len(ops) + 1, len(ops) + 2}
	ops = append(ops,
		kernel.EntryOp{Kind: kernel.OpDeleteNeighbor, Neighbor: kernel.Neighbor{IP: missing}},
		kernel.EntryOp{Kind: kernel.OpSetNeighbor, Neighbor: kernel.Neighbor{}}, // invalid IP
		kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{MAC: hwaddr.MAC{2}}},
		kernel.EntryOp{Kind: kernel.OpSetNeighbor, Neighbor: kernel.Neighbor{IP: ip6, MAC: hwaddr.MAC{2, 1}}},
		kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{MAC: hwaddr.MAC{2, 1}, VTEP: v1}},
		kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{VTEP: v1}},
		kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{VTEP: v1}}, // append again: no-op
		// Replaced in the same batch: order holds.
		kernel.EntryOp{Kind: kernel.OpDeleteNeighbor, Neighbor: kernel.Neighbor{IP: netip.MustParseAddr("10.1.0.5")}},
		kernel.EntryOp{Kind: kernel.OpSetNeighbor, Neighbor: kernel.Neighbor{IP: netip.MustParseAddr("10.1.0.5"), MAC: hwaddr.MAC{2, 9}}},
	)
	wantN[ip6] = hwaddr.MAC{2, 1}
	wantN[netip.MustParseAddr("10.1.0.5")] = hwaddr.MAC{2, 9}

	errs := k.Program(sb, ops)
	if len(errs) != len(ops) {
		t.Fatalf("Program returned %d errors for %d ops, want one per op", len(errs), len(ops))
	}
	for i, err := range errs {
		switch {
		case i == bad[0]:
			if !errors.Is(err, kernel.ErrNotFound) {
				t.Errorf("op %d (delete of a missing neighbour): %v, want ErrNotFound", i, err)
			}
		case i == bad[1] || i == bad[2]:
			if err == nil {
				t.Errorf("op %d (%v) succeeded, want an error", i, ops[i])
			}
		case err != nil:
			t.Errorf("op %d: %v", i, err)
		}
	}
	neighs, err := k.Neighbors(sb)
	if err != nil {
		t.Fatal(err)
	}
	if len(neighs) != len(wantN) {
		t.Errorf("%d neighbours, want %d", len(neighs), len(wantN))
	}
	for _, nb := range neighs {
		if wantN[nb.IP] != nb.MAC || nb.NotPermanent {
			t.Errorf("neighbour %v, want %s permanent", nb, wantN[nb.IP])
		}
	}
	fdb, err := k.FDB(sb)
	if err != nil {
		t.Fatal(err)
	}
	if want := peers + 2; len(fdb) != want {
		t.Errorf("%d FDB entries, want %d", len(fdb), want)
	}

	// Everything out again in one batch.
	var del []kernel.EntryOp
	for ip := range wantN {
		del = append(del, kernel.EntryOp{Kind: kernel.OpDeleteNeighbor, Neighbor: kernel.Neighbor{IP: ip}})
	}
	for _, e := range fdb {
		del = append(del, kernel.EntryOp{Kind: kernel.OpDeleteFDB, FDB: e})
	}
	if errs := k.Program(sb, del); errs != nil {
		t.Fatalf("delete all: %v", errors.Join(errs...))
	}
	if n, _ := k.Neighbors(sb); len(n) != 0 {
		t.Errorf("%d neighbours left", len(n))
	}
	if f, _ := k.FDB(sb); len(f) != 0 {
		t.Errorf("%d FDB entries left", len(f))
	}
	if errs := k.Program("nosuch", del[:1]); len(errs) != 1 || !errors.Is(errs[0], kernel.ErrNotFound) {
		t.Errorf("Program in a missing sandbox: %v, want ErrNotFound", errs)
	}
	if err := k.DeleteSandbox(sb); err != nil {
		t.Fatal(err)
	}
}
