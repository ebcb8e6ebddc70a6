package fakekernel

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
)

// TestFDBSemantics pins the bridge's rules the fake keeps with its MAC
// index: a unicast MAC has one destination (adding it again moves it),
// flood entries accumulate, and deletion needs the exact entry.
func TestFDBSemantics(t *testing.T) {
	k := New()
	spec := kernel.SandboxSpec{Name: "sb", VNI: 256, Port: 4789, Local: netip.MustParseAddr("198.51.100.1")}
	if err := k.CreateSandbox(spec); err != nil {
		t.Fatal(err)
	}
	a, b := netip.MustParseAddr("198.51.100.2"), netip.MustParseAddr("198.51.100.3")
	mac := hwaddr.MAC{0x02, 0x42, 0, 0, 0, 1}
	for _, e := range []kernel.FDBEntry{{MAC: mac, VTEP: a}, {MAC: mac, VTEP: b}, {VTEP: a}, {VTEP: b}} {
		if err := k.AddFDB("sb", e); err != nil {
			t.Fatal(err)
		}
	}
	want := []kernel.FDBEntry{{MAC: mac, VTEP: b}, {VTEP: a}, {VTEP: b}}
	if got := entries(t, k); !slices.Equal(got, want) {
		t.Fatalf("after moving the MAC: %v, want %v", got, want)
	}
	if err := k.DeleteFDB("sb", kernel.FDBEntry{MAC: mac, VTEP: a}); !errors.Is(err, kernel.ErrNotFound) {
		t.Fatalf("deleting the MAC's old destination: %v, want ErrNotFound", err)
	}
	if err := k.DeleteFDB("sb", kernel.FDBEntry{MAC: mac, VTEP: b}); err != nil {
		t.Fatal(err)
	}
	if err := k.AddFDB("sb", kernel.FDBEntry{MAC: mac, VTEP: a}); err != nil {
		t.Fatal(err)
	}
	want = []kernel.FDBEntry{{MAC: mac, VTEP: a}, {VTEP: a}, {VTEP: b}}
	if got := entries(t, k); !slices.Equal(got, want) {
		t.Fatalf("after delete and re-add: %v, want %v", got, want)
	}
}

func entries(t *testing.T, k *Kernel) []kernel.FDBEntry {
	t.Helper()
	got, err := k.FDB("sb")
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(x, y kernel.FDBEntry) int {
		if c := slices.Compare(y.MAC[:], x.MAC[:]); c != 0 {
			return c // unicast first
		}
		return x.VTEP.Compare(y.VTEP)
	})
	return got
}

func TestReleaseEntries(t *testing.T) {
	k := New()
	spec := kernel.SandboxSpec{Name: "sb", VNI: 256, Port: 4789, Local: netip.MustParseAddr("198.51.100.1")}
	if err := k.CreateSandbox(spec); err != nil {
		t.Fatal(err)
	}
	ip, vtep := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("198.51.100.2")
	mac := hwaddr.MAC{0x02, 0x42, 10, 0, 0, 2}
	if err := k.SetNeighbor("sb", kernel.Neighbor{IP: ip, MAC: mac}); err != nil {
		t.Fatal(err)
	}
	if err := k.AddFDB("sb", kernel.FDBEntry{MAC: mac, VTEP: vtep}); err != nil {
		t.Fatal(err)
	}
	if n := k.ReleaseEntries(); n != 2 {
		t.Fatalf("released %d entries, want 2", n)
	}
	if ns, _ := k.Neighbors("sb"); len(ns) != 0 {
		t.Errorf("neighbours left: %v", ns)
	}
	if fdb, _ := k.FDB("sb"); len(fdb) != 0 {
		t.Errorf("FDB entries left: %v", fdb)
	}
	if names, _ := k.Sandboxes(); !slices.Equal(names, []string{"sb"}) {
		t.Errorf("sandboxes %v, want [sb]", names)
	}
	// The MAC index went too: the entry can be added again, alone.
	if err := k.AddFDB("sb", kernel.FDBEntry{MAC: mac, VTEP: vtep}); err != nil {
		t.Fatal(err)
	}
	if fdb, _ := k.FDB("sb"); len(fdb) != 1 {
		t.Errorf("FDB %v, want one entry", fdb)
	}
}
