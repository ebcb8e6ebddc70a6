package driver

import (
	"fmt"
	"net/netip"
	"slices"
)

// What an endpoint may claim in a network is checked by one set of rules
// on every path that adds one: Docker's CreateEndpoint (a local endpoint)
// and AddPeer (a remote one, from gossip or the admin API). The rules that
// need no network are peerdb.CheckID and peerdb.Peer.Validate, which the
// cluster applies to every record it decodes too; checkAddrs is the
// network's share. Deletes go by id alone, under the same CheckID, so
// whatever is added can be deleted.

// checkAddrs refuses an endpoint address the network's IPAM never hands
// out: one outside every pool, a pool's network address, an IPv4 pool's
// broadcast address, or a gateway. Caller holds n.mu.
func (n *network) checkAddrs(ips []netip.Addr) error {
	if n.unrecorded {
		return nil // its subnets are unknown until Docker creates it again
	}
	for _, ip := range ips {
		ip = ip.Unmap()
		i := slices.IndexFunc(n.subnets, func(p netip.Prefix) bool { return p.Contains(ip) })
		if i < 0 {
			return fmt.Errorf("address %s is in no subnet of network %s %v", ip, n.id, n.subnets)
		}
		pool := n.subnets[i]
		switch {
		case slices.Contains(n.gateways, ip):
			return fmt.Errorf("address %s is the gateway of network %s", ip, n.id)
		case pool.Bits() < ip.BitLen()-1 && ip == pool.Masked().Addr():
			// /31, /32 (RFC 3021) and /127, /128 have no network address.
			return fmt.Errorf("address %s is the network address of subnet %s", ip, pool)
		case ip.Is4() && pool.Bits() < 31 && ip == lastAddr(pool):
			return fmt.Errorf("address %s is the broadcast address of subnet %s", ip, pool)
		}
	}
	return nil
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
