package servicelb

import (
	"encoding/binary"
	"fmt"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// generation says which nf_tables ruleset a namespace holds: the kernel
// counts every commit of a batch in a namespace (NFT_MSG_GETGEN), whoever
// sends it and whatever table it changes, so an unchanged generation
// means an unchanged ruleset. The namespace is named by its cookie
// (SO_NETNS_COOKIE, Linux 5.14, never reused while the system runs) or,
// on older kernels, its inode, so that a new namespace mounted at a path
// where an old one was is not taken for it.
type generation struct {
	netns uint64 // cookie, or inode
	id    uint32 // NFTA_GEN_ID
}

// readGeneration asks the kernel for ns's generation.
func readGeneration(ns netns.NsHandle) (generation, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
	if err != nil {
		return generation{}, fmt.Errorf("netfilter socket: %w", err)
	}
	defer c.Close()
	var g generation
	if err := namespaceID(c, ns, &g.netns); err != nil {
		return generation{}, err
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return generation{}, fmt.Errorf("nf_tables generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return generation{}, fmt.Errorf("nf_tables generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				g.id = ad.Uint32()
				return g, nil
			}
		}
	}
	return generation{}, fmt.Errorf("nf_tables generation: no NFTA_GEN_ID in the answer")
}

// namespaceID stores in id the cookie of the namespace c's socket is in,
// or else the inode of ns.
func namespaceID(c *netlink.Conn, ns netns.NsHandle, id *uint64) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("netfilter socket: %w", err)
	}
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		*id, gerr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	}); err != nil {
		return fmt.Errorf("netfilter socket: %w", err)
	}
	if gerr == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(ns), &st); err != nil {
		return fmt.Errorf("stat network namespace: %w", err)
	}
	*id = st.Ino
	return nil
}
