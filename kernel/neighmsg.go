package kernel

// Neighbour messages (RTM_NEWNEIGH, RTM_DELNEIGH; AF_BRIDGE ones are the
// VXLAN FDB) read without allocating: a burst of peer programming echoes
// one per entry to every watch (watch.go).

import (
	"encoding/binary"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
)

// neighMsg is what the driver needs of a neighbour message.
type neighMsg struct {
	family  uint8
	flags   uint8
	state   uint16
	ifindex int
	dst     netip.Addr // invalid: none
	mac     hwaddr.MAC
	hasMAC  bool
}

// parseNeighMsg reads an ndmsg and its NDA_DST and NDA_LLADDR.
func parseNeighMsg(data []byte) (m neighMsg, ok bool) {
	if len(data) < unix.SizeofNdMsg {
		return m, false
	}
	ne := binary.NativeEndian
	m.family = data[0]
	m.ifindex = int(int32(ne.Uint32(data[4:8])))
	m.state = ne.Uint16(data[8:10])
	m.flags = data[10]
	b := data[unix.SizeofNdMsg:]
	for len(b) >= unix.SizeofRtAttr {
		l := int(ne.Uint16(b[0:2]))
		if l < unix.SizeofRtAttr || l > len(b) {
			return m, false
		}
		v := b[unix.SizeofRtAttr:l]
		switch ne.Uint16(b[2:4]) {
		case unix.NDA_DST:
			if a, okA := netip.AddrFromSlice(v); okA {
				m.dst = a.Unmap()
			}
		case unix.NDA_LLADDR:
			if len(v) == len(m.mac) {
				m.mac, m.hasMAC = hwaddr.MAC(v), true
			}
		}
		b = b[min(nlmAlign(l), len(b)):]
	}
	return m, true
}

// neighMsgOf is a dumped entry as a neighMsg.
func neighMsgOf(nb *netlink.Neigh) neighMsg {
	m := neighMsg{family: uint8(nb.Family), flags: uint8(nb.Flags), state: uint16(nb.State), ifindex: nb.LinkIndex}
	if a, ok := netip.AddrFromSlice(nb.IP); ok {
		m.dst = a.Unmap()
	}
	m.mac, m.hasMAC = hwaddr.FromHardwareAddr(nb.HardwareAddr)
	return m
}

// neighbor converts a message about the device idx into a Neighbor; ok is
// false for other devices, proxy entries and, unless deleted, entries
// without a MAC (incomplete or failed ones: never ours). The kernel may
// announce a deletion without the MAC.
func (m *neighMsg) neighbor(idx int, deleted bool) (_ Neighbor, ok bool) {
	if m.ifindex != idx || m.flags&unix.NTF_PROXY != 0 || !m.dst.IsValid() || !m.hasMAC && !deleted {
		return Neighbor{}, false
	}
	return Neighbor{IP: m.dst, MAC: m.mac, NotPermanent: m.state&unix.NUD_PERMANENT == 0}, true
}

// fdb converts an AF_BRIDGE message about the device idx into an
// FDBEntry. The VXLAN driver's own entries carry NTF_SELF; the bridge's
// view of the port (NTF_MASTER) and entries without a remote are not
// ours. NOARP ("static") entries are, as `bridge fdb add ... self static`
// makes them: they steer traffic as well as ours.
func (m *neighMsg) fdb(idx int) (_ FDBEntry, ok bool) {
	if m.ifindex != idx || m.flags&unix.NTF_SELF == 0 || m.flags&unix.NTF_MASTER != 0 || !m.dst.IsValid() || !m.hasMAC {
		return FDBEntry{}, false
	}
	return FDBEntry{MAC: m.mac, VTEP: m.dst, NotPermanent: m.state&unix.NUD_PERMANENT == 0}, true
}
