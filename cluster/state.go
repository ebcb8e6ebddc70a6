package cluster

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"
	"unique"

	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// source says how a remote record reached this node.
type source int

const (
	srcGossip  source = iota // a broadcast (NotifyMsg): applied, not relayed
	srcState                 // push/pull anti-entropy: applied, not relayed
	srcPending               // held back until its owner joined; came by gossip
	srcPush                  // pushed by its owner straight to this node: applied, not relayed
	srcSync                  // anti-entropy (sync.go): applied, not relayed
	numSources
)

// Paths counts records by the path they came by: each record received is
// counted once, whatever became of it.
type Paths struct {
	Push        uint64 `json:"push"`         // pushed by their owner (push.go)
	Gossip      uint64 `json:"gossip"`       // broadcast memberships, and records held until their owner joined
	AntiEntropy uint64 `json:"anti_entropy"` // digest exchanges (sync.go)
	PushPull    uint64 `json:"push_pull"`    // memberlist's push/pull state (memberships)
}

// path is the path src counts under: a held record came by gossip.
func (src source) path() source {
	if src == srcPending {
		return srcGossip
	}
	return src
}

func pathsOf(by [numSources]uint64) Paths {
	return Paths{Push: by[srcPush], Gossip: by[srcGossip], AntiEntropy: by[srcSync], PushPull: by[srcState]}
}

// maxPending bounds the records held for owners that are not members yet.
const maxPending = 1 << 16

// member is this node's view of one memberlist node.
type member struct {
	name  string
	addr  netip.AddrPort // gossip address
	vtep  netip.Addr     // from the node's meta; invalid while unknown
	epoch uint64         // instance id from the node's meta
	alive bool
	// since is the local time of the latest alive/gone transition. The
	// purge decision is made at sweep time from the CURRENT alive flag and
	// since, so a node that came back within its grace (and maybe went
	// away again) is judged by its latest departure.
	since  time.Time
	purged bool // gone past grace: its records were removed
	// delivered: it pushed its records to this node, or exchanged digests
	// with it, since it became alive here (it pushes on every return), so
	// they are all known.
	delivered bool
	// data is the opaque node data from its meta (the encryption layer's
	// public keys); nil once the member is purged.
	data []byte
	// wireLo..wireHi are the wire versions it speaks (its memberlist
	// DelegateProtocolMin and Max); wireHi 0 while unknown, taken as wireMin.
	wireLo, wireHi byte
	// restarting is the epoch of the instance that announced it is being
	// restarted (0: none). It counts only while it is the member's current
	// epoch: then, once gone, its records are kept for restartGrace instead
	// of deadGrace. A new instance (a new epoch in its meta) clears it.
	restarting uint64
}

// restartMarked: m's current instance announced its restart.
func (m *member) restartMarked() bool { return m.restarting != 0 && m.restarting == m.epoch }

type pendingRec struct {
	r  *record
	at time.Time
}

// counters are monotonic event counts, guarded with the state.
type counters struct {
	accepted, acceptedFromState uint64
	acceptedFromSync            uint64
	stale                       uint64
	// received and staleBy split records by path (srcPending counts as
	// gossip, once: when it was held).
	received, staleBy           [numSources]uint64
	rejectedOwner, rejectedVTEP uint64
	rejectedNotMember           uint64
	retracted                   uint64 // own records of an earlier incarnation tombstoned
	purged, expired             uint64
	pendingDropped              uint64
	epochBumps                  uint64
	ignored                     uint64 // endpoint records of networks this node is not in
}

// state is the replicated table and everything its merge rules consult:
// this node's view of membership, its own version clock, the dirty set for
// delivery and the records held until their owner joins.
//
// The table holds two kinds of record under one set of rules (versions,
// tombstones, ownership): network memberships ("owner has this network"),
// which every node keeps for every network, and endpoint records, which a
// node keeps only for the networks it has itself.
//
// Not safe for concurrent use: Cluster.mu guards it. Every method is pure
// bookkeeping (no I/O, no callbacks) and takes the time as an argument, so
// the merge rules are unit-tested without memberlist or real clocks.
type state struct {
	// port is this node's VXLAN port (0: none said, nothing refused);
	// refused are the members refused for another one (settings.go).
	port    uint16
	refused map[string]bool
	// heldOwn, while not nil, are the live records under this node's name
	// from the network that it does not hold, kept until the owner has
	// republished its own (OwnSettled) and judged then; bounded by
	// maxHeldOwn.
	heldOwn map[key]*record
	// adverts are the members' settings as they told them (settings.go),
	// by node name; bounded by maxAdverts.
	adverts map[string]advert

	self    string
	selfEID string // memberEID(self)
	vtep    netip.Addr
	epoch   uint64
	seq     uint64

	deadGrace, tombTTL, pendingTTL, forgetAfter time.Duration
	// restartGrace replaces deadGrace for a member whose instance
	// announced its restart (member.restarting); at least deadGrace.
	restartGrace time.Duration
	log          *slog.Logger

	nets    map[string]map[string]*record // network id → endpoint id → endpoint record
	netm    map[string]map[string]*record // network id → memberEID(owner) → membership record
	digests map[string]map[string]*digest // network id → owner → digest of its live endpoint records
	marks   map[string]map[string]Version // network id → owner → highest version of its endpoint records held, tombstones included (sync.go)
	// settle is how long anti-entropy leaves a record alone after this
	// node took it in: its owner's push is likely still on the way to
	// the peer (sync.go).
	settle  time.Duration
	own     map[key]struct{} // this node's keys (live and tombstones); others' are found by scanning
	tombs   map[key]struct{} // the keys of tombstones, endpoints' and memberships': sweep visits only these
	members map[string]*member
	pending map[string]map[key]pendingRec // owner → newest record per key
	npend   int
	dirty   map[key]struct{}
	// dataDirty holds the VTEPs whose node data changed since delivery.
	dataDirty map[netip.Addr]struct{}
	// vtepsDirty says the live members' VTEPs changed since delivery.
	vtepsDirty bool
	// out collects membership records to broadcast, in the order their
	// versions were stamped or accepted. The caller drains it into the
	// broadcast queue under the same lock, so the queue's replace-by-name
	// never lets an older version displace a newer one.
	out []*record
	// push collects the keys of this node's endpoint records that changed,
	// for the caller to push to the members of their networks.
	push []key
	// joins collects the other nodes found newly in a network this node
	// has (or in it again with a new incarnation, hence an empty table):
	// this node's records of that network are pushed to them.
	joins []netJoin

	counters
}

func newState(self string, vtep netip.Addr, epoch uint64, deadGrace, tombTTL time.Duration, log *slog.Logger) *state {
	return &state{
		self: self, selfEID: memberEID(self), vtep: vtep, epoch: epoch,
		deadGrace: deadGrace, tombTTL: tombTTL, restartGrace: deadGrace,
		pendingTTL:  max(30*time.Second, deadGrace),
		forgetAfter: deadGrace + tombTTL,
		log:         log,
		nets:        map[string]map[string]*record{},
		netm:        map[string]map[string]*record{},
		digests:     map[string]map[string]*digest{},
		marks:       map[string]map[string]Version{},
		own:         map[key]struct{}{},
		tombs:       map[key]struct{}{},
		members:     map[string]*member{},
		adverts:     map[string]advert{},
		refused:     map[string]bool{},
		pending:     map[string]map[key]pendingRec{},
		dirty:       map[key]struct{}{},
		dataDirty:   map[netip.Addr]struct{}{},
	}
}

// table is where records of k live: memberships and endpoint records
// are kept apart, so that iterating a network's endpoints never meets
// memberships and the other way round.
func (s *state) table(k key) map[string]map[string]*record {
	if isMemberEID(k.eid) {
		return s.netm
	}
	return s.nets
}

func (s *state) get(k key) *record { return s.table(k)[k.nid][k.eid] }

func (s *state) put(r *record) {
	k := r.key()
	if old := s.get(k); old != nil {
		s.unindexDigest(old)
		if old.Owner == s.self && r.Owner != s.self {
			delete(s.own, k)
		}
	}
	s.indexDigest(r)
	s.raiseMark(r)
	tbl := s.table(k)
	recs := tbl[k.nid]
	if recs == nil {
		recs = map[string]*record{}
		tbl[k.nid] = recs
	}
	recs[k.eid] = r
	if r.Owner == s.self {
		s.own[k] = struct{}{}
	}
	if r.Deleted {
		s.tombs[k] = struct{}{}
	} else {
		delete(s.tombs, k)
	}
}

func (s *state) del(k key) {
	old := s.get(k)
	if old == nil {
		return
	}
	delete(s.own, k)
	delete(s.tombs, k)
	s.unindexDigest(old)
	tbl := s.table(k)
	recs := tbl[k.nid]
	delete(recs, k.eid)
	if len(recs) == 0 {
		delete(tbl, k.nid)
	}
}

// visible: a live endpoint record of another node, which the Sink should
// have.
func (s *state) visible(r *record) bool { return r.endpoint() && r.Owner != s.self }

// deliverable: a visible record whose owner this node's data path can
// reach: not one that said it receives VXLAN on another port than this
// node sends to (its packets would go to a port nobody listens on, and
// an encrypted network's would miss the firewall and IPsec, which select
// this node's port).
func (s *state) deliverable(r *record) bool {
	return s.visible(r) && !s.otherPort(r.Owner)
}

// otherPort: owner's current instance said it receives VXLAN on another
// port than this node's (settings.go). A node that said nothing (0.1.0)
// is taken to use this node's.
func (s *state) otherPort(owner string) bool {
	if s.port == 0 {
		return false
	}
	a, ok := s.adverts[owner]
	m := s.members[owner]
	return ok && m != nil && a.epoch == m.epoch && a.VXLANPort != s.port
}

// markOwner marks every live record of owner for delivery again.
func (s *state) markOwner(owner string) {
	for _, recs := range s.nets {
		for _, r := range recs {
			if r.Owner == owner && r.endpoint() {
				s.markDirty(r.key())
			}
		}
	}
}

// emit queues a record this node stamped for the members of its
// network; a membership is also broadcast, since every node keeps them.
func (s *state) emit(r *record) {
	if r.Member {
		s.out = append(s.out, r)
	}
	s.push = append(s.push, r.key())
}

// netJoin: node is (newly) in network nid.
type netJoin struct{ node, nid string }

// interested reports whether this node has network nid: it keeps and
// receives that network's endpoint records.
func (s *state) interested(nid string) bool {
	r := s.netm[nid][s.selfEID]
	return r != nil && !r.Deleted
}

// joinNetwork publishes this node's membership of nid, unless it has nid
// already, and marks the network's remote records for delivery.
func (s *state) joinNetwork(nid string) {
	if s.interested(nid) {
		s.markNetwork(nid)
		return
	}
	r := &record{NetworkID: nid, EndpointID: s.selfEID, Owner: s.self, Member: true, Version: s.stamp()}
	s.put(r)
	s.emit(r)
	s.markNetwork(nid)
}

// leaveNetwork withdraws this node's membership of nid: its own endpoints
// there are retracted, the other nodes' records dropped (the driver has
// no such network any more, so nothing is delivered).
func (s *state) leaveNetwork(nid string, now time.Time) {
	if !s.interested(nid) {
		return
	}
	for eid, r := range s.nets[nid] {
		switch {
		case r.Owner == s.self:
			s.retract(nid, eid, now)
		default:
			s.del(key{nid, eid})
			delete(s.dirty, key{nid, eid})
		}
	}
	delete(s.marks, nid)
	t := s.tombstone(key{nid, s.selfEID}, now)
	s.put(t)
	s.emit(t)
}

// ownerLeft: owner's membership of nid was withdrawn at version v. Its
// endpoint records there older than v are gone with it (a restarted node
// that no longer has the network never retracts them one by one). They
// become tombstones at v, so a late copy of one cannot come back.
func (s *state) ownerLeft(owner, nid string, v Version, now time.Time) {
	for eid, r := range s.nets[nid] {
		if r.Owner != owner || !r.endpoint() || r.Version.Compare(v) >= 0 {
			continue
		}
		k := key{nid, eid}
		t := &record{NetworkID: nid, EndpointID: eid, Owner: owner, Version: v, Deleted: true, At: instantOf(now)}
		if s.visible(r) {
			s.markDirty(k)
		}
		s.put(t)
	}
}

// aliveMembers returns the other alive nodes.
func (s *state) aliveMembers() []*member {
	out := make([]*member, 0, len(s.members))
	for _, m := range s.members {
		if m.alive && m.name != s.self {
			out = append(out, m)
		}
	}
	return out
}

// networkMembers returns the other nodes that have nid, alive or not.
func (s *state) networkMembers(nid string) []*member {
	var out []*member
	for _, r := range s.netm[nid] {
		if !r.Deleted && r.Owner != s.self {
			if m := s.members[r.Owner]; m != nil {
				out = append(out, m)
			}
		}
	}
	return out
}

func (s *state) markDirty(k key) { s.dirty[k] = struct{}{} }

func (s *state) stamp() Version {
	s.seq++
	return Version{s.epoch, s.seq}
}

func (s *state) tombstone(k key, now time.Time) *record {
	return &record{NetworkID: k.nid, EndpointID: k.eid, Owner: s.self, Version: s.stamp(), Deleted: true, At: instantOf(now),
		Member: k.eid == s.selfEID}
}

// publish records a local endpoint under this node's name with a fresh
// version. Re-publishing identical content is a no-op.
func (s *state) publish(nid string, p peerdb.Peer, now time.Time) error {
	ips := make([]netip.Addr, 0, len(p.IPs))
	for _, ip := range p.IPs {
		if ip = ip.Unmap(); !slices.Contains(ips, ip) {
			ips = append(ips, ip)
		}
	}
	r := &record{NetworkID: nid, EndpointID: p.EndpointID, Owner: s.self, IPs: ips, MAC: p.MAC, VTEP: unique.Make(s.vtep)}
	if err := r.validate(); err != nil {
		return err
	}
	if !s.interested(nid) {
		s.joinNetwork(nid)
	}
	k := r.key()
	cur := s.get(k)
	if cur != nil && cur.Owner == s.self && sameContent(cur, r) {
		return nil
	}
	if cur != nil && cur.Owner != s.self {
		// Endpoint ids are unique per Docker cluster, so this is a
		// collision or a forged record; the local endpoint is the truth here.
		s.log.Warn("local endpoint replaces foreign record",
			"network", nid, "endpoint", p.EndpointID, "owner", cur.Owner)
	}
	r.Version = s.stamp()
	r.At = instantOf(now)
	s.put(r)
	s.emit(r)
	return nil
}

// retract tombstones a local endpoint. Retracting what this node does not
// own (or has already retracted) is a no-op.
func (s *state) retract(nid, eid string, now time.Time) {
	k := key{nid, eid}
	cur := s.get(k)
	if cur == nil || cur.Owner != s.self || cur.Deleted || cur.Member {
		return
	}
	t := s.tombstone(k, now)
	s.put(t)
	s.emit(t)
}

// ownerGone: records of name may be replaced by another owner's.
func (s *state) ownerGone(name string, now time.Time) bool {
	if name == s.self {
		return false
	}
	m := s.members[name]
	return m == nil || !m.alive && now.Sub(m.since) >= s.grace(m)
}

// grace is how long m's records are kept once it is gone: restartGrace
// if its current instance announced its restart, else deadGrace.
func (s *state) grace(m *member) time.Duration {
	if m.restartMarked() {
		return max(s.restartGrace, s.deadGrace)
	}
	return s.deadGrace
}

// restartAnnounced marks member name's instance epoch as restarting, and
// reports whether it did: an announcement for another instance than the
// member's current one (an old epoch, or one not seen yet) is ignored,
// as is one for this node or a node not known.
func (s *state) restartAnnounced(name string, epoch uint64) bool {
	m := s.members[name]
	if m == nil || name == s.self || epoch == 0 || m.epoch != epoch || m.purged {
		return false
	}
	m.restarting = epoch
	return true
}

// apply merges a remote record (decoded and validated) into the table and
// reports whether the table changed. r is owned by the table afterwards.
func (s *state) apply(r *record, src source, now time.Time) bool {
	if src != srcPending {
		s.received[src]++
	}
	if !r.Member && !s.interested(r.NetworkID) {
		// Sent before the sender learnt that this node left the network,
		// or by a sender that is wrong about it: not ours to keep.
		s.ignored++
		return false
	}
	if r.Owner == s.self {
		return s.applyOwn(r, now)
	}
	m := s.members[r.Owner]
	if m == nil {
		// Gossip can outrun the alive message of a node that just joined:
		// hold the record until NotifyJoin. Never applied if it never joins.
		s.addPending(r, now)
		return false
	}
	if !m.alive && m.purged && src == srcPush {
		// Its owner pushes it, so it is back, and this record outran the
		// news (the push is sent as soon as the owner sees this node): held
		// like an unknown owner's, until it is alive here. Dropped, it
		// would wait for anti-entropy, which leaves recent records alone.
		s.addPending(r, now)
		return false
	}
	if !m.alive && (m.purged || now.Sub(m.since) >= s.grace(m)) {
		// Gone past the grace: its records were (or are about to be)
		// purged everywhere; this is a lagging node's copy, and accepting
		// it would resurrect them. Within the grace the owner may be a
		// false suspicion about to refute: its records are taken (they are
		// purged with the rest if it does not come back).
		s.rejectedNotMember++
		s.log.Debug("record of dead node rejected", "owner", r.Owner, "network", r.NetworkID, "endpoint", r.EndpointID)
		return false
	}
	if r.endpoint() && m.vtep.IsValid() && r.vtep() != m.vtep {
		s.rejectedVTEP++
		s.log.Warn("record VTEP mismatch rejected", "owner", r.Owner, "ownerVTEP", m.vtep,
			"vtep", r.vtep(), "network", r.NetworkID, "endpoint", r.EndpointID, reasonKey, RejectVTEP.String())
		return false
	}
	k := r.key()
	cur := s.get(k)
	if cur != nil {
		if cur.Owner != r.Owner {
			if !s.ownerGone(cur.Owner, now) {
				s.rejectedOwner++
				s.log.Warn("foreign endpoint record rejected", "network", r.NetworkID,
					"endpoint", r.EndpointID, "owner", cur.Owner, "claimant", r.Owner, reasonKey, RejectOwnership.String())
				return false
			}
			// The previous owner is gone for good: versions of two owners
			// are not comparable, the live owner's record replaces it.
		} else if r.Version.Compare(cur.Version) <= 0 {
			s.stale++
			s.staleBy[src.path()]++
			return false
		}
	}
	if r.Deleted && now.Sub(r.At.time()) >= s.tombTTL {
		// An expired tombstone still supersedes what it deletes, but is
		// not kept (otherwise tombstones would circulate forever).
		if cur == nil {
			return false
		}
		s.del(k)
		if s.visible(cur) {
			s.markDirty(k)
		}
		s.accepted++
		return true
	}
	s.intern(r, m)
	if !r.Deleted {
		r.At = instantOf(now)
	}
	s.put(r)
	if s.visible(cur) || s.visible(r) {
		s.markDirty(k)
	}
	if r.Member {
		s.memberChanged(cur, r, now)
	}
	// Nothing is relayed: an owner pushes its records to every member of
	// their network and its memberships to every node, and anti-entropy
	// repairs the rest (relaying every record on every host is what
	// saturated the broadcast queues). Memberships were relayed once by the
	// members of their network until the push reached every node: then
	// nine in ten gossiped copies were duplicates (81,688 received, 73,498
	// stale, in a 100-host rollout).
	switch src {
	case srcState:
		s.acceptedFromState++
	case srcSync:
		s.acceptedFromSync++
	default:
		s.accepted++
	}
	return true
}

// intern makes a record about to enter the table share this node's copy
// of its owner's name and, in a network this node has, of the network id:
// each decoded message has its own, which its records would keep alive.
func (s *state) intern(r *record, owner *member) {
	r.Owner = owner.name
	if self := s.netm[r.NetworkID][s.selfEID]; self != nil {
		r.NetworkID = self.NetworkID
	}
}

// memberChanged follows an accepted membership record of another node:
// a node new in one of this node's networks (or back with a new
// incarnation, so with an empty table) gets this node's records of it; a
// node that left a network takes its endpoint records there with it.
func (s *state) memberChanged(cur, r *record, now time.Time) {
	if r.Deleted {
		s.ownerLeft(r.Owner, r.NetworkID, r.Version, now)
		return
	}
	if s.interested(r.NetworkID) && (cur == nil || cur.Deleted || cur.Version.Epoch != r.Version.Epoch) {
		s.joins = append(s.joins, netJoin{r.Owner, r.NetworkID})
	}
}

// applyOwn handles a record under this node's own name that came from the
// network. This node is the only authority for its records: whatever it
// does not hold now is from an earlier incarnation (or was retracted and
// its tombstone expired) and gets retracted with a newer version.
func (s *state) applyOwn(r *record, now time.Time) bool {
	k := r.key()
	cur := s.get(k)
	if cur != nil && cur.Owner != s.self {
		s.rejectedOwner++
		return false
	}
	if r.Version.Epoch >= maxSaneEpoch && r.Version.Epoch > s.epoch {
		// No incarnation of ours wrote this (an epoch bump may have taken
		// ours to maxSaneEpoch, not past it). Kill it for good without
		// adopting its epoch (a local endpoint with this id, if any, is
		// lost: only a forged or corrupt record gets here).
		if r.Deleted || cur != nil && cur.Deleted && cur.Version == finalVersion {
			return false
		}
		s.log.Error("own record impossible version", "why", "retracting it for good",
			"network", r.NetworkID, "endpoint", r.EndpointID, "version", r.Version)
		t := s.tombstone(k, now)
		t.Version = finalVersion
		s.put(t)
		s.emit(t)
		s.retracted++
		return true
	}
	if r.Version.Epoch > s.epoch || r.Version.Epoch == s.epoch && r.Version.Seq > s.seq {
		// Written by "us" with a version we never stamped: the clock
		// stepped back across a restart, or another node uses our name.
		s.log.Warn("own record newer", "why", "advancing epoch",
			"network", r.NetworkID, "endpoint", r.EndpointID, "version", r.Version, "epoch", s.epoch)
		s.bumpEpoch(r.Version.Epoch)
		cur = s.get(k)
	}
	if cur != nil {
		if cur.Version.Compare(r.Version) >= 0 {
			return false
		}
		// Ours is older than a version we supposedly wrote: re-stamp ours
		// so it wins.
		n := cur.clone()
		n.Version = s.stamp()
		s.put(n)
		s.emit(n)
		return true
	}
	if r.Deleted {
		return false // nothing live to undo
	}
	if s.heldOwn != nil {
		// The owner has not republished what it still holds yet: this may
		// be one of those, and retracting it would cut its traffic until
		// the republish. Judged once OwnSettled.
		if h := s.heldOwn[k]; (h == nil || h.Version.Compare(r.Version) < 0) && len(s.heldOwn) < maxHeldOwn {
			s.heldOwn[k] = r
		}
		return false
	}
	t := s.tombstone(k, now)
	s.put(t)
	s.emit(t)
	s.retracted++
	s.log.Info("retract stale own endpoint",
		"network", r.NetworkID, "endpoint", r.EndpointID, "version", r.Version, "tombstone", t.Version)
	return true
}

// maxHeldOwn bounds heldOwn: whoever reaches the gossip port can send
// records under this node's name.
const maxHeldOwn = 1 << 16

// settleOwn judges the records held until this node's own were
// republished: those it does not hold now are retracted.
func (s *state) settleOwn(now time.Time) {
	held := s.heldOwn
	s.heldOwn = nil
	for _, r := range held {
		s.applyOwn(r, now)
	}
}

// bumpEpoch moves this node's epoch past seen and re-stamps every own record.
func (s *state) bumpEpoch(seen uint64) {
	s.epoch = max(s.epoch, seen) + 1
	s.epochBumps++
	for k := range s.own {
		n := s.get(k).clone()
		n.Version = s.stamp()
		s.put(n)
		s.emit(n)
	}
}

func (s *state) addPending(r *record, now time.Time) {
	p := s.pending[r.Owner]
	k := r.key()
	if old, ok := p[k]; ok {
		if r.Version.Compare(old.r.Version) > 0 {
			p[k] = pendingRec{r, now}
		}
		return
	}
	if s.npend >= maxPending {
		s.pendingDropped++
		return
	}
	if p == nil {
		p = map[key]pendingRec{}
		s.pending[r.Owner] = p
	}
	p[k] = pendingRec{r, now}
	s.npend++
}

// memberUp: name is alive (joined, came back, or updated its meta). It
// reports whether name came back: known, and not alive until now.
func (s *state) memberUp(name string, addr netip.AddrPort, meta []byte, now time.Time) (back bool) {
	m := s.members[name]
	if m == nil {
		m = &member{name: name}
		s.members[name] = m
	} else {
		back = !m.alive && name != s.self
	}
	wasAlive := m.alive
	if !m.alive {
		m.since, m.delivered = now, false
		s.vtepsDirty = true
	}
	m.alive, m.purged, m.addr = true, false, addr
	if !wasAlive && name != s.self {
		// Pushes skip members that are not alive: one that becomes alive
		// is due this node's records of every network both have.
		for nid, recs := range s.netm {
			if r := recs[memberEID(name)]; r != nil && !r.Deleted && s.interested(nid) {
				s.joins = append(s.joins, netJoin{name, nid})
			}
		}
	}
	if name == s.self {
		m.vtep, m.epoch = s.vtep, s.epoch
		return false
	}
	if vtep, epoch, data, err := parseMeta(meta); err != nil {
		s.log.Warn("member meta unusable", "why", "its records' VTEPs are not checked", "member", name, "err", err)
	} else {
		if m.vtep.IsValid() && m.vtep != vtep {
			s.log.Info("member's VTEP changed", "member", name, "old", m.vtep, "new", vtep)
			s.setData(m, nil) // the old VTEP's data goes with it
		}
		if m.vtep != vtep {
			m.vtep = vtep
			s.vtepsDirty = true
			s.revalidate(name, vtep)
		}
		if m.epoch != epoch {
			m.restarting = 0 // a new instance: the mark was its predecessor's
		}
		m.epoch = epoch
		s.setData(m, data)
	}
	if p := s.pending[name]; p != nil {
		delete(s.pending, name)
		s.npend -= len(p)
		recs := make([]*record, 0, len(p))
		for _, pr := range p {
			recs = append(recs, pr.r)
		}
		slices.SortFunc(recs, func(a, b *record) int { return a.Version.Compare(b.Version) })
		for _, r := range recs {
			s.apply(r, srcPending, now)
		}
	}
	return back
}

// memberDown: name left or failed. Its records stay for deadGrace.
func (s *state) memberDown(name string, now time.Time) {
	if name == s.self {
		return
	}
	m := s.members[name]
	if m == nil {
		m = &member{name: name}
		s.members[name] = m
	}
	if m.alive || m.since.IsZero() {
		m.since = now
	}
	s.vtepsDirty = s.vtepsDirty || m.alive
	m.alive = false
}

// sweep does the time-driven work: purges records of owners gone past
// their grace (deadGrace, or restartGrace for an instance that announced
// its restart), forgets long-gone members, expires tombstones and pending
// records. The node data (the peer's public keys) goes with the records.
func (s *state) sweep(now time.Time) {
	for name, m := range s.members {
		if m.alive || name == s.self {
			continue
		}
		gone, grace := now.Sub(m.since), s.grace(m)
		if !m.purged && gone >= grace {
			n := s.purgeOwner(name)
			m.purged = true
			s.setData(m, nil)
			s.log.Info("gone member purged", "why", "its records are removed past the grace period", "member", name, "records", n,
				"gone", gone.Round(time.Millisecond), "grace", grace, "restarting", m.restartMarked())
		}
		if m.purged && gone >= s.forgetAfter+grace-s.deadGrace {
			delete(s.members, name)
		}
	}
	for k := range s.tombs {
		if now.Sub(s.get(k).At.time()) >= s.tombTTL {
			s.del(k)
			s.expired++
		}
	}
	for owner, p := range s.pending {
		for k, pr := range p {
			if now.Sub(pr.at) >= s.pendingTTL {
				delete(p, k)
				s.npend--
				s.pendingDropped++
			}
		}
		if len(p) == 0 {
			delete(s.pending, owner)
		}
	}
}

// revalidate drops the records held from owner whose VTEP is not vtep,
// its address now known or changed.
func (s *state) revalidate(owner string, vtep netip.Addr) {
	for _, k := range s.ownedBy(owner) {
		if r := s.get(k); r.endpoint() && r.vtep() != vtep {
			s.del(k)
			s.markDirty(k)
			s.rejectedVTEP++
		}
	}
}

// ownedBy returns the keys of owner's records, memberships included.
func (s *state) ownedBy(owner string) []key {
	var out []key
	for _, tbl := range [...]map[string]map[string]*record{s.nets, s.netm} {
		for nid, recs := range tbl {
			for eid, r := range recs {
				if r.Owner == owner {
					out = append(out, key{nid, eid})
				}
			}
		}
	}
	return out
}

func (s *state) purgeOwner(name string) int {
	for _, owners := range s.marks {
		delete(owners, name)
	}
	n := 0
	for _, k := range s.ownedBy(name) {
		r := s.get(k)
		if s.visible(r) {
			s.markDirty(k)
		}
		s.del(k)
		if !r.Member {
			s.purged++
			n++
		}
	}
	return n
}

// snapshot returns copies of the live remote records of a network.
func (s *state) snapshot(nid string) []peerdb.Peer {
	var out []peerdb.Peer
	for _, r := range s.nets[nid] {
		if s.deliverable(r) {
			out = append(out, r.peer())
		}
	}
	slices.SortFunc(out, func(a, b peerdb.Peer) int { return cmp.Compare(a.EndpointID, b.EndpointID) })
	return out
}

// markNetwork marks every live remote record of nid for delivery.
func (s *state) markNetwork(nid string) {
	for _, r := range s.nets[nid] {
		if s.visible(r) {
			s.markDirty(r.key())
		}
	}
}

// delivery is one Sink call, computed from the table's current value.
type delivery struct {
	nid, eid string
	add      bool
	peer     peerdb.Peer // a copy; set when add
}

// takeDirty empties the dirty set into deliveries of the CURRENT values.
func (s *state) takeDirty() []delivery {
	if len(s.dirty) == 0 {
		return nil
	}
	out := make([]delivery, 0, len(s.dirty))
	for k := range s.dirty {
		r := s.get(k)
		switch {
		case s.deliverable(r):
			out = append(out, delivery{nid: k.nid, eid: k.eid, add: true, peer: r.peer()})
		case r != nil && r.Owner == s.self:
			// Our own endpoint: the driver has it as local.
		default:
			out = append(out, delivery{nid: k.nid, eid: k.eid})
		}
	}
	clear(s.dirty)
	return out
}

// memberships returns every membership record (tombstones included),
// grouped by network, for push/pull: memberlist's full state exchange
// carries who has which network; endpoint records go by push and digest.
func (s *state) memberships() []*record {
	var out []*record
	for _, recs := range s.netm {
		for _, r := range recs {
			out = append(out, r)
		}
	}
	return out
}

// setData records a member's node data and queues its delivery if it
// changed.
func (s *state) setData(m *member, data []byte) {
	if bytes.Equal(m.data, data) && (m.data == nil) == (data == nil) {
		return
	}
	m.data = bytes.Clone(data)
	if m.vtep.IsValid() {
		s.dataDirty[m.vtep] = struct{}{}
	}
}

// hasDirty reports whether the delivery goroutine has work: endpoint
// changes or node data changes.
func (s *state) hasDirty() bool { return len(s.dirty) > 0 || len(s.dataDirty) > 0 || s.vtepsDirty }

// takeVTEPs returns the live members' VTEPs, sorted, if they changed since
// the last call; this node's own is not among them.
func (s *state) takeVTEPs() ([]netip.Addr, bool) {
	if !s.vtepsDirty {
		return nil, false
	}
	s.vtepsDirty = false
	out := []netip.Addr{}
	for _, m := range s.members {
		if m.alive && m.name != s.self && m.vtep.IsValid() {
			out = append(out, m.vtep)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), true
}

// nodeData is a member's node data on its way to the NodeData callback.
type nodeData struct {
	vtep netip.Addr
	data []byte // a copy; nil when the member is gone
}

// takeDataDirty empties the node-data dirty set into the CURRENT values.
func (s *state) takeDataDirty() []nodeData {
	if len(s.dataDirty) == 0 {
		return nil
	}
	current := map[netip.Addr][]byte{}
	for _, m := range s.members {
		if m.vtep.IsValid() && m.data != nil && m.name != s.self {
			current[m.vtep] = m.data
		}
	}
	out := make([]nodeData, 0, len(s.dataDirty))
	for vtep := range s.dataDirty {
		out = append(out, nodeData{vtep: vtep, data: bytes.Clone(current[vtep])})
	}
	clear(s.dataDirty)
	return out
}

// Node meta: version(1) addrLen(1) addr epoch(8, big endian), then the
// node data, opaque to the cluster.
const metaVersion = 1

func encodeMeta(vtep netip.Addr, epoch uint64, data []byte) []byte {
	b := []byte{metaVersion, byte(vtep.BitLen() / 8)}
	b = append(b, vtep.AsSlice()...)
	b = binary.BigEndian.AppendUint64(b, epoch)
	return append(b, data...)
}

func parseMeta(b []byte) (netip.Addr, uint64, []byte, error) {
	if len(b) < 2 || b[0] != metaVersion {
		return netip.Addr{}, 0, nil, fmt.Errorf("meta: unknown format (%d bytes)", len(b))
	}
	n := int(b[1])
	if (n != 4 && n != 16) || len(b) < 2+n+8 {
		return netip.Addr{}, 0, nil, fmt.Errorf("meta: bad length")
	}
	a, _ := netip.AddrFromSlice(b[2 : 2+n])
	a = a.Unmap()
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() {
		return netip.Addr{}, 0, nil, fmt.Errorf("meta: unusable VTEP %v", a)
	}
	var data []byte
	if rest := b[2+n+8:]; len(rest) > 0 {
		data = rest
	}
	return a, binary.BigEndian.Uint64(b[2+n : 2+n+8]), data, nil
}
