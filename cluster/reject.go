package cluster

import (
	"net"
	"net/netip"
	"sync/atomic"
)

// Reason says why something from the network was refused.
type Reason int

const (
	RejectDecrypt     Reason = iota // not decryptable with the cluster key (or encrypted, and the cluster has none)
	RejectPlain                     // plaintext in an encrypted cluster
	RejectCompressed                // memberlist-compressed: never sent by this cluster, a decompression bomb otherwise
	RejectUnknownType               // a message type memberlist does not take there, or a memberlist label
	RejectMalformed                 // does not decode (the plugin's messages, memberlist's, compounds, checksums)
	RejectMisdirected               // a ping for another node name
	RejectQueueFull                 // dropped by memberlist: its handler queue was full
	RejectStale                     // a record no newer than the one held (duplicates are routine)
	RejectOwnership                 // a record of an endpoint another node owns
	RejectVTEP                      // a record whose VTEP is not its owner's address
	RejectOwnerGone                 // a record of a node gone past the dead grace
	RejectWireVersion               // a message, or a node, whose wire versions this node does not speak
	RejectStreamIdle                // a stream that sent no whole first message in time (screen.go)
	RejectStreamLimit               // a stream over the bound of those not yet checked (screen.go)
	numReasons
)

var reasonNames = [numReasons]string{"decrypt", "plain", "compressed", "unknown_type", "malformed", "misdirected",
	"queue_full", "stale", "ownership", "vtep_mismatch", "owner_gone", "wire_version", "stream_idle", "stream_limit"}

func (r Reason) String() string { return reasonNames[r] }

// rejections counts the refusals made outside the state (which counts its
// own under Cluster.mu): by the transport screen, the decoder, memberlist.
type rejections [numReasons]atomic.Uint64

func (r *rejections) add(reason Reason) { r[reason].Add(1) }

// reject counts one refusal and logs it with its reason, which the log
// handler rate-limits per reason (ratelog.go).
func (c *Cluster) reject(r Reason, msg string, args ...any) {
	c.rej.add(r)
	c.log.Warn(msg, append(args, reasonKey, r.String())...)
}

// refuseInput is the transport screen's report.
func (c *Cluster) refuseInput(what string, from net.Addr, r *rejection) {
	c.reject(r.reason, "gossip input refused", "input", what, "from", from, "err", r.err)
}

// liveAddrs are the alive members, counted (self included), and their
// gossip addresses: hosts (self included) and the host-and-port of every
// other member. Never changed once made.
type liveAddrs struct {
	alive int
	hosts map[netip.Addr]bool
	peers map[netip.AddrPort]string // name by gossip address
}

func (s *state) liveAddrs() *liveAddrs {
	l := &liveAddrs{hosts: map[netip.Addr]bool{}, peers: map[netip.AddrPort]string{}}
	for _, m := range s.members {
		if !m.alive {
			continue
		}
		l.alive++
		l.hosts[m.addr.Addr()] = true
		if m.name != s.self {
			l.peers[m.addr] = m.name
		}
	}
	return l
}

// isMemberAddr says whether a is a live member's gossip address: the
// transport screen admits the members' streams beyond the bound it sets
// for strangers.
func (c *Cluster) isMemberAddr(a netip.Addr) bool {
	l := c.live.Load()
	return l != nil && l.hosts[a]
}

// isMemberGossipAddr says whether a is a live member's gossip address and
// port, this node's excepted: the address a session's dialer gives
// (streampool.go).
func (c *Cluster) isMemberGossipAddr(a netip.AddrPort) bool {
	_, ok := c.memberAtGossipAddr(a)
	return ok
}

// memberAtGossipAddr returns the live member (this node excepted) whose
// gossip address and port a is: a channel's dialer (channel.go).
func (c *Cluster) memberAtGossipAddr(a netip.AddrPort) (string, bool) {
	l := c.live.Load()
	if l == nil {
		return "", false
	}
	name, ok := l.peers[a]
	return name, ok
}

// Rejections returns every reason's count, by name, zeros included.
func (s Stats) Rejections() map[string]uint64 {
	out := make(map[string]uint64, numReasons)
	for r, v := range [numReasons]uint64{s.RejectedDecrypt, s.RejectedPlain, s.RejectedCompressed, s.RejectedUnknownType,
		s.DecodeErrors, s.RejectedMisdirected, s.RejectedQueueFull, s.Stale, s.RejectedForeignOwner, s.RejectedVTEP, s.RejectedNotMember,
		s.RejectedWireVersion, s.RejectedStreamIdle, s.RejectedStreamLimit} {
		out[Reason(r).String()] = v
	}
	return out
}
