package kernelpath

import (
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// countEntries counts the permanent neighbour entries (IPv4) and the
// VXLAN FDB entries with a destination on device idx, through h.
func countEntries(h *netlink.Handle, idx int) (neigh, fdb int, err error) {
	ns, err := h.NeighList(idx, unix.AF_INET)
	if err != nil {
		return 0, 0, err
	}
	for _, n := range ns {
		if n.State&netlink.NUD_PERMANENT != 0 && n.HardwareAddr != nil {
			neigh++
		}
	}
	fs, err := h.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return 0, 0, err
	}
	for _, f := range fs {
		if f.Flags&netlink.NTF_SELF != 0 && f.IP != nil && !f.IP.IsUnspecified() {
			fdb++
		}
	}
	return neigh, fdb, nil
}
