package health

import (
	"fmt"
	"net/netip"
)

// Gossip is what the control plane says of a peer.
type Gossip uint8

const (
	// GossipUnknown: no control plane, or the peer is not a member.
	GossipUnknown Gossip = iota
	GossipAlive
	// GossipDown: a member the gossip cannot reach (suspect or dead).
	GossipDown
)

// facts are what a broken path's cause is read from.
type facts struct {
	peer  netip.Addr
	path  Path
	state State
	// port is this host's VXLAN port, peerPort the peer's as it
	// advertised it (0: not advertised).
	port, peerPort uint16
	gossip         Gossip
	// plain is the state of the peer's plain VXLAN path, for the ESP one.
	plain        State
	mtu, pathMTU int
	// reverse: only the peer's packets to this host are lost (it said so).
	reverse bool
}

// problem says, in words an operator can act on, what fails on a broken
// path and its likely cause; "" for a path that is not broken.
func problem(f facts) string {
	switch {
	case f.state == StateMTU:
		what, dir := "packets", "to"
		if f.path == PathESP {
			what = "encrypted packets"
		}
		if f.reverse {
			dir = "from"
		}
		if f.pathMTU == 0 || f.pathMTU >= f.mtu {
			return fmt.Sprintf("%s of %d bytes %s %s are lost while small ones cross: the network's MTU is %d; a link between the hosts carries less (give the network -o mtu=<smaller> or fix the link)",
				what, f.mtu, dir, f.peer, f.mtu)
		}
		return fmt.Sprintf("%s above %d bytes %s %s are lost: the network's MTU is %d; a link between the hosts carries less (give the network -o mtu=%d or fix the link)",
			what, f.pathMTU, dir, f.peer, f.mtu, f.pathMTU)
	case f.state != StateDown:
		return ""
	case f.path == PathESP && f.plain == StateUp:
		return fmt.Sprintf("ESP to %s fails while plain VXLAN works: IP protocol 50 (ESP) is filtered between the hosts, or their IPsec keys disagree", f.peer)
	case f.path == PathESP:
		return fmt.Sprintf("ESP to %s fails, and plain VXLAN to it fails too (see the vxlan path)", f.peer)
	case f.peerPort != 0 && f.peerPort != f.port:
		return fmt.Sprintf("VXLAN to %s gets no answer: it listens on UDP %d, this host sends to UDP %d; set the same --vxlan-port on every node", f.peer, f.peerPort, f.port)
	case f.gossip == GossipAlive:
		return fmt.Sprintf("VXLAN to %s on UDP %d gets no answer while gossip with it works: a firewall between the hosts drops UDP %d", f.peer, f.port, f.port)
	case f.gossip == GossipDown:
		return fmt.Sprintf("VXLAN to %s on UDP %d gets no answer and gossip with it fails too: the host is down or unreachable", f.peer, f.port)
	default:
		return fmt.Sprintf("VXLAN to %s on UDP %d gets no answer: the host is down, or a firewall between the hosts drops UDP %d", f.peer, f.port, f.port)
	}
}
