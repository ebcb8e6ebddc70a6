package cluster

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/hashicorp/memberlist"
)

// Wire version negotiation (the versions: codec.go). Every node
// advertises the range it speaks in memberlist's delegate protocol fields
// (New), so each member's range is known from its alive message. This node
// picks a version per message:
//
//   - a broadcast (memberlist's queue, which hands it to random members,
//     members that joined since included) goes out at the newest version
//     every alive member speaks, capped by ours. It is chosen when
//     memberlist takes the message from the queue, not when it is queued:
//     a message queued while every member spoke 3 and sent after a 0.1.0
//     node joined goes out at 2 (broadcast.Message).
//   - a message to one node goes out at the newest version both speak.
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
		c.reject(RejectWireVersion, "node refused: it speaks no wire version this node does",
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

// broadcastVersion is the newest version every alive member speaks,
// capped by hi.
func (s *state) broadcastVersion(hi byte) byte {
	v := hi
	for _, m := range s.members {
		if m.alive && m.name != s.self {
			v = min(v, m.wireOf())
		}
	}
	return v
}

// membersChangedLocked follows a change of the alive members: the queue's
// node count and the broadcast version. Caller holds c.mu.
func (c *Cluster) membersChangedLocked() {
	c.numAlive.Store(int64(c.st.aliveCount()))
	c.bcastVer.Store(uint32(max(c.st.broadcastVersion(c.wireHi), c.wireLo)))
}

// broadcast is one queued gossip message: one record. Named by its key, so
// queueing a newer version of a record drops the queued older one (queueing
// happens under Cluster.mu in version order).
//
// msg is encoded at the lowest version; Message gives it at the version
// broadcasts go out at when memberlist takes it (ver): the bodies are the
// same in every version, so only the version byte differs. memberlist
// calls Message under its queue lock: nothing here takes a lock.
type broadcast struct {
	name string
	msg  []byte
	ver  *atomic.Uint32
	// at is msg at another version, made on first use.
	at atomic.Pointer[[]byte]
}

var _ memberlist.NamedBroadcast = (*broadcast)(nil)

func (b *broadcast) Invalidates(o memberlist.Broadcast) bool {
	nb, ok := o.(memberlist.NamedBroadcast)
	return ok && nb.Name() == b.name
}
func (b *broadcast) Name() string { return b.name }
func (b *broadcast) Finished()    {}

func (b *broadcast) Message() []byte {
	if b.ver == nil || len(b.msg) < 2 {
		return b.msg
	}
	v := byte(b.ver.Load())
	if v == b.msg[1] {
		return b.msg
	}
	if p := b.at.Load(); p != nil && (*p)[1] == v {
		return *p
	}
	m := append([]byte(nil), b.msg...)
	m[1] = v
	b.at.Store(&m)
	return m
}
