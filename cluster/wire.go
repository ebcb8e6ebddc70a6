package cluster

import (
	"errors"
	"fmt"

	"github.com/hashicorp/memberlist"
)

// Wire version negotiation (the versions: codec.go). Every node
// advertises the range it speaks in memberlist's delegate protocol fields
// (New), so each member's range is known from its alive message. This node
// picks a version per message:
//
//   - a message to one node (push, sync, restart announcement) goes out at
//     the newest version both speak; at wireMin to a node whose range is
//     not known.
//   - a broadcast goes out at wireBroadcast, whoever the members are.
//     memberlist hands queued broadcasts to the next packet it sends, to
//     any node: to dead members too (for GossipToTheDeadTime), and to a
//     node it does not know yet (the ack of a ping from a node that just
//     learned of this one, as a join's reply is still on its way). So a
//     broadcast's receivers are never known; wireBroadcast is the newest
//     version every release this one may share a cluster with decodes
//     (the compatibility promise: the previous and the next).
//   - memberlist's push/pull state (LocalState) goes out at the lowest
//     version: memberlist does not say to whom, and the other side of a
//     join is not a member yet. Its kind is the same in every version.
//
// A node whose range does not overlap ours is refused: aliveFilter keeps
// its alive messages (gossip and push/pull alike) from making it a member,
// and memberlist's verifyProtocol fails every push/pull with it, which the
// log writer counts under the same reason (mlLogWriter).

// aliveFilter is memberlist's AliveDelegate: it refuses the alive message
// of a node that speaks no wire version this node does. memberlist calls
// it with its node lock held, for every alive message (received by
// gossip, and for each alive node of a push/pull state), before the node
// is added or updated; it only counts and logs (the log limiter's leaf
// lock), never takes Cluster.mu. A MergeDelegate would not do: memberlist
// consults it only on a join's push/pull, after verifyProtocol, and
// gossip of an alive message bypasses it.
type aliveFilter struct {
	c    *Cluster
	next memberlist.AliveDelegate // Config.MemberlistConfig's, if any (tests)
}

var _ memberlist.AliveDelegate = (*aliveFilter)(nil)

func (f *aliveFilter) NotifyAlive(n *memberlist.Node) error {
	c := f.c
	if n.Name != c.name && (n.DMin == 0 || n.DMin > n.DMax || n.DMin > c.wireHi || n.DMax < c.wireLo) {
		theirs, ours := wireRangeString(n.DMin, n.DMax), wireRangeString(c.wireLo, c.wireHi)
		c.reject(RejectWireVersion, "node refused", "why", "it speaks no wire version this node does",
			"member", n.Name, "addr", nodeAddr(n), "theirs", theirs, "ours", ours)
		return fmt.Errorf("%w: %s speaks wire versions %s, this node %s", errWireVersion, n.Name, theirs, ours)
	}
	if f.next != nil {
		return f.next.NotifyAlive(n)
	}
	return nil
}

// errWireVersion is in aliveFilter's error, which memberlist logs:
// mlLogWriter recognises the line (already counted and logged).
var errWireVersion = errors.New("wire versions do not overlap")

func wireRangeString(lo, hi byte) string { return fmt.Sprintf("%d..%d", lo, hi) }

// wireString is m's advertised range, "" while unknown.
func (m *member) wireString() string {
	if m.wireHi == 0 {
		return ""
	}
	return wireRangeString(m.wireLo, m.wireHi)
}

// setWire records the range member name advertises (memberlist's DMin,
// DMax), as its alive message passed aliveFilter.
func (s *state) setWire(name string, lo, hi byte) {
	if m := s.members[name]; m != nil && hi != 0 {
		m.wireLo, m.wireHi = lo, hi
	}
}

// wireOf is the newest version member m speaks, as far as known.
func (m *member) wireOf() byte {
	if m == nil || m.wireHi == 0 {
		return wireMin
	}
	return m.wireHi
}

// versionForLocked is the version of a message to member name: the newest
// both speak. Caller holds c.mu.
func (c *Cluster) versionForLocked(name string) byte {
	return max(min(c.wireHi, c.st.members[name].wireOf()), c.wireLo)
}

// membersChangedLocked follows a change of the alive members: the queue's
// node count. Caller holds c.mu.
func (c *Cluster) membersChangedLocked() {
	l := c.st.liveAddrs()
	c.numAlive.Store(int64(l.alive))
	c.live.Store(l)
	if c.st.vtepsDirty {
		c.wake(c.deliverCh)
	}
}

// broadcast is one queued gossip message: one record, at the version
// broadcasts go out at (Cluster.bcastVer). Named by its key, so queueing a
// newer version of a record drops the queued older one (queueing happens
// under Cluster.mu in version order).
type broadcast struct {
	name string
	msg  []byte
}

var _ memberlist.NamedBroadcast = (*broadcast)(nil)

func (b *broadcast) Invalidates(o memberlist.Broadcast) bool {
	nb, ok := o.(memberlist.NamedBroadcast)
	return ok && nb.Name() == b.name
}
func (b *broadcast) Name() string    { return b.name }
func (b *broadcast) Message() []byte { return b.msg }
func (b *broadcast) Finished()       {}
