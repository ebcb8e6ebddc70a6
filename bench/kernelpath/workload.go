package kernelpath

import (
	"fmt"
	"net/netip"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
)

// peer is one remote endpoint to program: a neighbour entry for ip and an
// FDB entry for mac at vtep.
type peer struct {
	id   string
	ip   netip.Addr
	mac  hwaddr.MAC
	vtep netip.Addr
}

// remoteHosts is how many VTEPs the peers live on.
const remoteHosts = 100

// netID and epID are Docker-like ids (64 hex digits); moby names a
// sandbox by the first 10 digits of its network's id.
func netID(k int) string   { return fmt.Sprintf("%04x%060x", 0xbe00+k, 0) }
func epID(k, i int) string { return fmt.Sprintf("%056x%08x", 0xe0+k, i) }

// localID is network k's j-th local endpoint; its first 12 digits, which
// name its veth, differ from every other's.
func localID(k, j int) string { return fmt.Sprintf("%04x%08x%052x", k, j, 1) }
func vniOf(k int) uint32      { return uint32(300 + k) } // the plugin's range, and moby takes any
func subnet(k int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(10 + k), 0, 0}), 16)
}
func gateway(k int) netip.Addr { return netip.AddrFrom4([4]byte{10, byte(10 + k), 0, 1}) }

// localAddr is the address of network k's j-th local endpoint.
func localAddr(k, j int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(10 + k), 255, byte(2 + j)})
}

// peersOf lists network k's n remote endpoints: addresses from .0.10 up,
// a MAC derived from each (as Docker does), spread over remoteHosts VTEPs.
func peersOf(k, n int) []peer {
	out := make([]peer, n)
	base := subnet(k).Addr().As4()
	for i := range out {
		v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(10+i)
		ip := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		a := ip.As4()
		out[i] = peer{
			id:   epID(k, i),
			ip:   ip,
			mac:  hwaddr.MAC{0x02, 0x42, a[0], a[1], a[2], a[3]},
			vtep: netip.AddrFrom4([4]byte{198, 18, 1, byte(1 + i%remoteHosts)}),
		}
	}
	return out
}

// programmer is one way of programming peers.
type programmer interface {
	// setup makes networks networks, each with its VXLAN device ready.
	setup(networks int) error
	// prepare turns network k's peers into the system's input, untimed.
	prepare(k int, peers []peer) error
	// program programs network k's prepared peers; timed, one goroutine
	// per network.
	program(k int) error
	// count reports the neighbour and FDB entries on network k's VXLAN
	// device.
	count(k int) (neigh, fdb int, err error)
	close()
}
