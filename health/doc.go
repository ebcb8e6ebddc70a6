// Package health probes the data path to every remote VTEP the way
// containers' traffic crosses it, and says what is broken and why.
//
// The control plane's gossip runs on its own port over TCP and UDP, so it
// can look healthy while the VXLAN port or ESP is filtered between two
// hosts, or a tunnel underlay drops large packets. To see that, each host
// runs a health endpoint inside two sandboxes of its own, built like a
// network's (a namespace with a bridge and a VXLAN device, created by the
// same kernel code): one on VNI VNIPlain, one on VNIESP, which the
// firewall marks for IPsec like an encrypted network's VNI. The endpoint's
// address on the bridge is the host's own VTEP address (the namespace is
// private, so it collides with nothing) and its MAC is derived from it, so
// a peer's endpoint needs no gossip to be found: one neighbour and one FDB
// entry per remote VTEP, programmed through kernel.Program like a
// network's entries.
//
// A probe is a UDP datagram from this endpoint to the peer's, carried by
// the kernel's VXLAN device to the peer's VTEP on the VXLAN port (through
// the IPsec SA on the ESP path), answered by the peer's endpoint with a
// short reply. Its size is the MTU of the largest network that reaches the
// peer, with DF set, so a path that drops packets the network's MTU allows
// is seen as such.
//
// # Cost
//
// In steady state a host sends one probe per peer and path every Interval
// (3 s, jittered by ±20% so that probes spread out), of the network's MTU,
// and answers each of its peers' probes with 32 bytes. A path in trouble
// gets a small probe per round beside the full one, and once every
// diagnoseEvery a burst of ladder probes (two of ladderSteps each) that
// finds the largest packet that crosses.
//
// # Detection
//
// A path is declared broken when the full probes of downAfter rounds in a
// row are lost (one lost datagram is not an outage): at most two intervals
// plus a timeout after it breaks, under 10 s; it is declared whole at the
// first answered full probe, under one interval after it heals. The cause
// comes from what still works: gossip with the peer, the plain path, small
// packets (cause.go).
package health
