package cluster

import (
	"math/rand/v2"
	"time"
)

// Anti-entropy repairs what a push missed (a member that was unreachable,
// a message lost with a crashed sender, a node that restarted with an
// empty table). It is a digest exchange per network, in the spirit of
// Scuttlebutt reconciliation: every SyncInterval a node sends, for each
// of its networks, its digest of the network to one random member of it.
// Equal digests end the exchange there, so a converged cluster sends a
// few dozen bytes per network and interval. Where they differ, the two
// narrow it down to the owners whose records differ and ship those
// owners' records that the other likely lacks (shipment.go: above its
// high-water mark of the owner, and settled), both ways:
//
//	A → B  level 0: A's digest of the network
//	B → A  level 1: B's digest of each owner's records (if they differed)
//	A → B  level 2: A's shipment for the owners that differ, and A's digests of them
//	B → A           B's shipment for the owners that still differ
//
// Records are applied like any other (newer wins), so the exchange
// converges whatever the order of the messages.

// Levels of a sync entry.
const (
	syncNetwork = 0 // the sender's digest of the whole network
	syncCompare = 1 // the sender's per-owner digests: answer with records and syncFinal
	syncFinal   = 2 // per-owner digests after a compare: answer with records only
)

// syncEntry is one network's part of a sync message.
type syncEntry struct {
	nid    string
	level  byte
	sum    digest        // syncNetwork
	groups []ownerDigest // syncCompare, syncFinal
}

type ownerDigest struct {
	owner string
	d     digest
	// hw is the sender's mark of the owner (state.mark); zero for the
	// memberships, and from a node of wire version 2, which sends none.
	hw Version
}

// ownerDigests lists the digest of the memberships of nid and of every
// owner that counts (see counts), empty ones included: a peer that does
// not find an owner listed knows that it does not count here.
func (s *state) ownerDigests(nid string) []ownerDigest {
	owners := s.syncOwners(nid)
	out := make([]ownerDigest, 0, len(owners)+1)
	out = append(out, ownerDigest{owner: memberGroup, d: s.memberDigest(nid)})
	for _, owner := range owners {
		out = append(out, ownerDigest{owner: owner, d: s.ownerDigest(nid, owner), hw: s.mark(nid, owner)})
	}
	return out
}

// differing returns the groups of nid whose records differ between this
// node and a peer with the digests theirs, with the peer's digests. Only
// groups both count are compared: an owner the peer does not list, or
// that is not alive here, is left to the failure detector and the dead
// grace.
func (s *state) differing(nid string, theirs []ownerDigest) []ownerDigest {
	seen := make(map[string]bool, len(theirs))
	var out []ownerDigest
	for _, g := range theirs {
		if seen[g.owner] || g.owner != memberGroup && !s.counts(nid, g.owner) {
			continue
		}
		seen[g.owner] = true
		if s.groupDigest(nid, g.owner) != g.d {
			out = append(out, g)
		}
	}
	return out
}

// answerSync works out the reply to peer's sync entries (after their
// records were applied): the entries and records to send back. queued
// is as shipment's.
func (s *state) answerSync(peer string, in []syncEntry, queued func(key) bool, now time.Time) (out []syncEntry, recs []*record) {
	for _, e := range in {
		if !s.interested(e.nid) {
			continue
		}
		switch e.level {
		case syncNetwork:
			if s.networkDigest(e.nid) != e.sum {
				out = append(out, syncEntry{nid: e.nid, level: syncCompare, groups: s.ownerDigests(e.nid)})
			}
		case syncCompare, syncFinal:
			theirs := s.differing(e.nid, e.groups)
			if len(theirs) == 0 {
				continue
			}
			recs = append(recs, s.shipment(e.nid, peer, theirs, queued, now)...)
			mine := make([]ownerDigest, 0, len(theirs))
			for _, g := range theirs {
				mine = append(mine, ownerDigest{owner: g.owner, d: s.groupDigest(e.nid, g.owner), hw: s.mark(e.nid, g.owner)})
			}
			if e.level == syncCompare {
				out = append(out, syncEntry{nid: e.nid, level: syncFinal, groups: mine})
			}
		}
	}
	return out, recs
}

// syncTargets picks, for every network this node has, one random alive
// member of it, and returns the level-0 entries to send to each.
func (s *state) syncTargets(nids []string) map[string][]syncEntry {
	out := map[string][]syncEntry{}
	for _, nid := range nids {
		if !s.interested(nid) {
			continue
		}
		var alive []*member
		for _, m := range s.networkMembers(nid) {
			if m.alive {
				alive = append(alive, m)
			}
		}
		if len(alive) == 0 {
			continue
		}
		m := alive[rand.IntN(len(alive))]
		out[m.name] = append(out[m.name], syncEntry{nid: nid, level: syncNetwork, sum: s.networkDigest(nid)})
	}
	return out
}

// syncsWith returns the level-0 entries of the networks this node shares
// with member name.
func (s *state) syncsWith(name string) []syncEntry {
	var out []syncEntry
	for nid, recs := range s.netm {
		if r := recs[memberEID(name)]; r != nil && !r.Deleted && s.interested(nid) {
			out = append(out, syncEntry{nid: nid, level: syncNetwork, sum: s.networkDigest(nid)})
		}
	}
	return out
}

// ownNetworks lists the networks this node has.
func (s *state) ownNetworks() []string {
	var out []string
	for nid := range s.netm {
		if s.interested(nid) {
			out = append(out, nid)
		}
	}
	return out
}

// syncLoop starts a digest exchange for every network each SyncInterval,
// and at once for a network this node just joined (c.syncCh).
func (c *Cluster) syncLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.syncInt)
	defer t.Stop()
	for {
		var nids []string
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.mu.Lock()
			nids = c.st.ownNetworks()
			c.mu.Unlock()
		case <-c.syncCh:
			c.mu.Lock()
			nids = c.syncNow
			c.syncNow = nil
			c.mu.Unlock()
		}
		c.syncRound(nids)
	}
}

func (c *Cluster) syncRound(nids []string) {
	now := c.clock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, entries := range c.st.syncTargets(nids) {
		c.syncsOut++
		c.sendLocked(name, encodeSync(c.versionForLocked(name), c.name, entries, nil, now))
	}
}

// syncAt starts a digest exchange with each alive member at one of addrs
// for every network both have, instead of leaving it to the random pick
// of later rounds.
func (c *Cluster) syncAt(addrs []string) {
	at := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		at[a] = true
	}
	now := c.clock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.st.members {
		if !m.alive || m.name == c.name || !at[m.addr.String()] {
			continue
		}
		if entries := c.st.syncsWith(m.name); len(entries) > 0 {
			c.syncsOut++
			c.sendLocked(m.name, encodeSync(c.versionForLocked(m.name), c.name, entries, nil, now))
		}
	}
}

// handleSync applies a sync message's records and answers its digests.
// The answer is encoded with mu released: it can carry a network's
// whole table, and records are immutable.
func (c *Cluster) handleSync(m *message, now time.Time) {
	c.mu.Lock()
	for _, r := range m.recs {
		c.st.apply(r, srcSync, now)
	}
	c.syncsIn++
	// The sender's own records arrive in this exchange (or are equal
	// already), as with its push.
	if o := c.st.members[m.from]; o != nil && o.alive {
		o.delivered = true
	}
	entries, recs := c.st.answerSync(m.from, m.syncs, c.queuedFor(m.from), now)
	v := c.versionForLocked(m.from)
	c.flushLocked()
	c.mu.Unlock()
	if len(entries) == 0 && len(recs) == 0 {
		return
	}
	msg := encodeSync(v, c.name, entries, recs, now)
	c.mu.Lock()
	c.sendLocked(m.from, msg)
	c.mu.Unlock()
}
