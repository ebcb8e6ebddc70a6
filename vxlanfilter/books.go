package vxlanfilter

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/overlay-plugin/overlay-plugin/internal/countmap"
)

// books is what the filter wants in the kernel's sets, from its three
// sources, kept apart so that each can change without the others' help:
//
//   - refs: the sandboxes' references on a remote VTEP, one per network
//     with an FDB entry towards it (the driver's planner takes one before
//     the first entry is written and drops it after the last is gone);
//   - members: the VTEPs of the live gossip members, so that a member's
//     traffic is admitted before this host has learned its endpoints;
//   - inherited: what a previous run's table admitted, kept while the new
//     run cannot yet tell stale from live (a restart with live sandboxes).
//
// A VNI is filtered while a sandbox claims it or it is inherited. Pure: the
// Filter holds it under its mutex.
type books struct {
	vnis           map[uint32]bool
	refs           countmap.Map[netip.Addr]
	members        map[netip.Addr]bool
	inheritedVNIs  map[uint32]bool
	inheritedVTEPs map[netip.Addr]bool
}

func newBooks() books {
	return books{vnis: map[uint32]bool{}, refs: countmap.Map[netip.Addr]{}, members: map[netip.Addr]bool{},
		inheritedVNIs: map[uint32]bool{}, inheritedVTEPs: map[netip.Addr]bool{}}
}

// wantVNIs are the VNIs the table filters, sorted.
func (b *books) wantVNIs() []uint32 {
	set := maps.Clone(b.vnis)
	maps.Copy(set, b.inheritedVNIs)
	return slices.Sorted(maps.Keys(set))
}

// wantVTEPs are the sources the table admits, sorted.
func (b *books) wantVTEPs() []netip.Addr {
	set := maps.Clone(b.members)
	maps.Copy(set, b.inheritedVTEPs)
	for a := range b.refs {
		set[a] = true
	}
	return slices.SortedFunc(maps.Keys(set), netip.Addr.Compare)
}

// release forgets what was inherited.
func (b *books) release() {
	clear(b.inheritedVNIs)
	clear(b.inheritedVTEPs)
}

// diff returns what is in want and not in have, and what is in have and not
// in want; both inputs sorted.
func diff[T any](want, have []T, cmp func(a, b T) int) (add, remove []T) {
	i, j := 0, 0
	for i < len(want) || j < len(have) {
		switch {
		case j == len(have) || i < len(want) && cmp(want[i], have[j]) < 0:
			add = append(add, want[i])
			i++
		case i == len(want) || cmp(want[i], have[j]) > 0:
			remove = append(remove, have[j])
			j++
		default:
			i++
			j++
		}
	}
	return add, remove
}
