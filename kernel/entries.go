package kernel

// Neighbour and FDB entries on the sandbox VXLAN device.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
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

func family(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func ipOf(a netip.Addr) net.IP { return net.IP(a.AsSlice()) }

// SetNeighbor implements Kernel:
// ip neigh replace IP lladdr MAC dev vxlan0 nud permanent.
func (n *Netlink) SetNeighbor(sandboxName string, nb Neighbor) error {
	ip := nb.IP.Unmap()
	if !ip.IsValid() {
		return fmt.Errorf("set neighbour in sandbox %q: invalid IP", sandboxName)
	}
	sb, idx, err := n.vxlan(sandboxName, false)
	if err != nil {
		return fmt.Errorf("set neighbour %s: %w", ip, err)
	}
	defer n.release(sb)
	err = sb.h.NeighSet(&netlink.Neigh{
		LinkIndex:    idx,
		Family:       family(ip),
		State:        netlink.NUD_PERMANENT,
		IP:           ipOf(ip),
		HardwareAddr: nb.MAC.HardwareAddr(),
	})
	if err != nil {
		sb.forget(idx, err)
		return fmt.Errorf("set neighbour %s lladdr %s in sandbox %q: %w", ip, nb.MAC, sandboxName, err)
	}
	return nil
}

// DeleteNeighbor implements Kernel.
func (n *Netlink) DeleteNeighbor(sandboxName string, ip netip.Addr) error {
	ip = ip.Unmap()
	if !ip.IsValid() {
		return fmt.Errorf("delete neighbour in sandbox %q: invalid IP", sandboxName)
	}
	sb, idx, err := n.vxlan(sandboxName, false)
	if err != nil {
		return fmt.Errorf("delete neighbour %s: %w", ip, err)
	}
	defer n.release(sb)
	err = sb.h.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: family(ip), IP: ipOf(ip)})
	if err != nil {
		sb.forget(idx, err)
		return fmt.Errorf("delete neighbour %s in sandbox %q: %w", ip, sandboxName, classify(err))
	}
	return nil
}

func fdbNeigh(idx int, e FDBEntry, vtep netip.Addr) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex:    idx,
		Family:       unix.AF_BRIDGE,
		Flags:        netlink.NTF_SELF,
		State:        netlink.NUD_PERMANENT,
		IP:           ipOf(vtep),
		HardwareAddr: e.MAC.HardwareAddr(),
	}
}

// AddFDB implements Kernel:
// bridge fdb replace MAC dev vxlan0 dst VTEP self permanent, or
// bridge fdb append ... for the all-zero (flood) MAC.
func (n *Netlink) AddFDB(sandboxName string, e FDBEntry) error {
	vtep := e.VTEP.Unmap()
	if !vtep.IsValid() || vtep.IsUnspecified() {
		return fmt.Errorf("add fdb %s in sandbox %q: invalid VTEP %v", e.MAC, sandboxName, e.VTEP)
	}
	sb, idx, err := n.vxlan(sandboxName, false)
	if err != nil {
		return fmt.Errorf("add fdb %s dst %s: %w", e.MAC, vtep, err)
	}
	defer n.release(sb)
	nb := fdbNeigh(idx, e, vtep)
	if e.MAC.IsZero() {
		// Appending a destination that is there already is a no-op.
		err = sb.h.NeighAppend(nb)
	} else {
		err = sb.h.NeighSet(nb)
	}
	if err != nil {
		sb.forget(idx, err)
		return fmt.Errorf("add fdb %s dst %s in sandbox %q: %w", e.MAC, vtep, sandboxName, err)
	}
	return nil
}

// DeleteFDB implements Kernel: deletes exactly the (MAC, VTEP) entry.
func (n *Netlink) DeleteFDB(sandboxName string, e FDBEntry) error {
	vtep := e.VTEP.Unmap()
	if !vtep.IsValid() || vtep.IsUnspecified() {
		return fmt.Errorf("delete fdb %s in sandbox %q: invalid VTEP %v", e.MAC, sandboxName, e.VTEP)
	}
	sb, idx, err := n.vxlan(sandboxName, false)
	if err != nil {
		return fmt.Errorf("delete fdb %s dst %s: %w", e.MAC, vtep, err)
	}
	defer n.release(sb)
	// The kernel answers a delete of (MAC, dst) with success, deleting
	// nothing, when MAC exists with other destinations only; look first.
	found, err := sb.hasFDB(idx, e.MAC, vtep)
	if err != nil {
		sb.forget(idx, err)
		return fmt.Errorf("delete fdb %s dst %s in sandbox %q: %w", e.MAC, vtep, sandboxName, err)
	}
	if !found {
		return fmt.Errorf("delete fdb %s dst %s in sandbox %q: %w", e.MAC, vtep, sandboxName, ErrNotFound)
	}
	if err := sb.h.NeighDel(fdbNeigh(idx, e, vtep)); err != nil {
		sb.forget(idx, err)
		return fmt.Errorf("delete fdb %s dst %s in sandbox %q: %w", e.MAC, vtep, sandboxName, classify(err))
	}
	return nil
}

// fdbFirst fetches the VXLAN FDB entry of mac (RTM_GETNEIGH on the device,
// Linux 5.0+) and returns its first destination; ok is false if there is no
// entry for mac.
func (sb *sandbox) fdbFirst(idx int, mac hwaddr.MAC) (dst netip.Addr, ok bool, err error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, 0)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: sb.raw}
	req.AddData(&netlink.Ndmsg{Family: unix.AF_BRIDGE, Index: uint32(idx), Flags: netlink.NTF_SELF})
	req.AddData(nl.NewRtAttr(netlink.NDA_LLADDR, mac[:]))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEIGH)
	if errors.Is(err, unix.ENOENT) {
		return netip.Addr{}, false, nil
	}
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("get fdb entry: %w", err)
	}
	for _, m := range msgs {
		nb, err := netlink.NeighDeserialize(m)
		if err != nil {
			return netip.Addr{}, false, fmt.Errorf("get fdb entry: %w", err)
		}
		if a, ok := netip.AddrFromSlice(nb.IP); ok {
			return a.Unmap(), true, nil
		}
	}
	return netip.Addr{}, false, nil
}

// hasFDB reports whether the entry (mac, vtep) exists. A single-entry get
// answers for unicast MACs, which have one destination; a flood MAC with
// several destinations needs a dump when the first one is not vtep.
func (sb *sandbox) hasFDB(idx int, mac hwaddr.MAC, vtep netip.Addr) (bool, error) {
	first, ok, err := sb.fdbFirst(idx, mac)
	if err != nil || !ok {
		return false, err
	}
	if first == vtep {
		return true, nil
	}
	if !mac.IsZero() && mac[0]&1 == 0 {
		return false, nil
	}
	entries, err := sb.listFDB(idx)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(entries, func(e FDBEntry) bool { return e.MAC == mac && e.VTEP == vtep }), nil
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
