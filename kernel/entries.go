package kernel

// Reading the neighbour and FDB entries of the sandbox VXLAN device;
// Program (pipeline.go) writes them.

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/netlinkutil"
)

// vxlan returns the sandbox (which the caller must release) and the
// ifindex of its VXLAN device: the cached one, unless fresh. Dumps ask for
// a fresh one: with a stale index (the device deleted from outside) they
// would list nothing and no error. Calls that fail forget the cached
// index (forget), so the next one looks again.
func (n *Netlink) vxlan(sandboxName string, fresh bool) (*sandbox, int, error) {
	sb, err := n.sandbox(sandboxName)
	if err != nil {
		return nil, 0, err
	}
	if idx := sb.vxlanIndex.Load(); idx != 0 && !fresh {
		return sb, int(idx), nil
	}
	l, err := sb.h.LinkByName(VXLANName)
	if err != nil {
		n.release(sb)
		return nil, 0, fmt.Errorf("sandbox %q: find %s: %w", sandboxName, VXLANName, classify(err))
	}
	sb.vxlanIndex.Store(int32(l.Attrs().Index))
	return sb, l.Attrs().Index, nil
}

// forget drops the cached VXLAN ifindex idx after a call with it failed
// with err, unless only the entry was missing (ENOENT; a missing device
// is ENODEV).
func (sb *sandbox) forget(idx int, err error) {
	if !errors.Is(err, unix.ENOENT) {
		sb.vxlanIndex.CompareAndSwap(int32(idx), 0)
	}
}

// Neighbors implements Kernel.
func (n *Netlink) Neighbors(sandboxName string) ([]Neighbor, error) {
	sb, idx, err := n.vxlan(sandboxName, true)
	if err != nil {
		return nil, fmt.Errorf("list neighbours: %w", err)
	}
	defer n.release(sb)
	var out []Neighbor
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		list, err := netlinkutil.Dump(func() ([]netlink.Neigh, error) { return sb.h.NeighList(idx, fam) })
		if err != nil {
			return nil, fmt.Errorf("list neighbours in sandbox %q: %w", sandboxName, err)
		}
		for i := range list {
			m := neighMsgOf(&list[i])
			if nb, ok := m.neighbor(idx, false); ok {
				out = append(out, nb)
			}
		}
	}
	return out, nil
}

// FDB implements Kernel.
func (n *Netlink) FDB(sandboxName string) ([]FDBEntry, error) {
	sb, idx, err := n.vxlan(sandboxName, true)
	if err != nil {
		return nil, fmt.Errorf("list fdb: %w", err)
	}
	defer n.release(sb)
	out, err := sb.listFDB(idx)
	if err != nil {
		return nil, fmt.Errorf("list fdb in sandbox %q: %w", sandboxName, err)
	}
	return out, nil
}

// listFDB dumps the entries of the VXLAN device with ifindex idx.
func (sb *sandbox) listFDB(idx int) ([]FDBEntry, error) {
	list, err := netlinkutil.Dump(func() ([]netlink.Neigh, error) { return sb.h.NeighList(idx, unix.AF_BRIDGE) })
	if err != nil {
		return nil, err
	}
	var out []FDBEntry
	for i := range list {
		m := neighMsgOf(&list[i])
		if e, ok := m.fdb(idx); ok {
			out = append(out, e)
		}
	}
	return out, nil
}
