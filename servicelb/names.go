package servicelb

import (
	"net/netip"
	"strings"
)

// Names inside the table. The per-service and per-backend names embed
// addresses, IPv6 ones with '_' for ':' so that nft can parse what it
// lists (its identifiers allow letters, digits, '/', '\', '_', '.', '-').
const (
	TableName   = "overlay_plugin_lb"
	DNATChain   = "dnat"   // type nat hook output priority dstnat
	RejectChain = "reject" // type filter hook output priority filter
	VIPs4Map    = "vips4"  // ipv4_addr : verdict, VIP -> goto svc-VIP
	VIPs6Map    = "vips6"
	Empty4Set   = "empty4" // ipv4_addr, VIPs without backends
	Empty6Set   = "empty6"

	servicePrefix = "svc-" // chain and map per VIP with backends
	backendPrefix = "be-"  // chain per (VIP, backend)
)

func addrName(a netip.Addr) string { return strings.ReplaceAll(a.String(), ":", "_") }

func parseAddrName(s string) (netip.Addr, error) {
	return netip.ParseAddr(strings.ReplaceAll(s, "_", ":"))
}

// serviceName names the chain that picks a backend for vip, and the
// numgen-indexed verdict map it looks up.
func serviceName(vip netip.Addr) string { return servicePrefix + addrName(vip) }

// backendName names the chain that counts and DNATs b's connections.
func backendName(b Backend) string {
	return backendPrefix + addrName(b.VIP) + "-" + addrName(b.Addr)
}

// parseBackendName inverts backendName.
func parseBackendName(name string) (Backend, bool) {
	rest, ok := strings.CutPrefix(name, backendPrefix)
	if !ok {
		return Backend{}, false
	}
	v, a, ok := strings.Cut(rest, "-")
	if !ok {
		return Backend{}, false
	}
	vip, err1 := parseAddrName(v)
	addr, err2 := parseAddrName(a)
	if err1 != nil || err2 != nil {
		return Backend{}, false
	}
	return Backend{VIP: vip, Addr: addr}, true
}
