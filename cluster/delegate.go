package cluster

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// delegate implements memberlist.Delegate. memberlist calls it from several
// goroutines at once (packet handler, stream handlers, gossip timers).
type delegate struct{ c *Cluster }

var _ memberlist.Delegate = (*delegate)(nil)

// mergeChunk bounds how many records of a push/pull state are applied per
// hold of Cluster.mu, so a large state does not stall Publish.
const mergeChunk = 512

func (d *delegate) NodeMeta(limit int) []byte {
	meta := *d.c.meta.Load()
	if len(meta) > limit {
		return nil
	}
	return meta
}

// NotifyMsg takes gossip (a membership broadcast, by UDP), pushes and
// anti-entropy (by TCP stream: memberlist calls this on the stream's own
// goroutine).
func (d *delegate) NotifyMsg(buf []byte) {
	c := d.c
	c.bytesIn.Add(uint64(len(buf)))
	c.msgsIn.Add(1)
	now := c.clock()
	m, err := decodeMessageUpTo(buf, now, c.wireHi) // copies out of buf
	if err != nil {
		c.decodeError("gossip message", err)
		return
	}
	if int(m.version) < len(c.recvd) && int(m.kind) < len(c.recvd[0]) {
		c.recvd[m.version][m.kind].Add(1)
	}
	switch m.kind {
	case kindSync:
		c.handleSync(m, now)
		return
	case kindRestart:
		c.handleRestart(m)
		return
	case kindSettings:
		c.handleSettings(m)
		return
	}
	src := srcGossip
	if m.kind == kindPush {
		src = srcPush
	}
	c.mu.Lock()
	for _, r := range m.recs {
		c.st.apply(r, src, now)
	}
	if src == srcPush {
		// An owner pushes its own records (nothing is relayed).
		for _, r := range m.recs {
			if o := c.st.members[r.Owner]; o != nil && o.alive {
				o.delivered = true
			}
		}
	}
	c.flushLocked()
	c.mu.Unlock()
}

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	msgs := d.c.queue.GetBroadcasts(overhead, limit)
	n := 0
	for _, m := range msgs {
		n += len(m)
	}
	d.c.bytesOut.Add(uint64(n))
	return msgs
}

func (d *delegate) LocalState(join bool) []byte {
	c := d.c
	c.mu.Lock()
	recs := c.st.memberships() // records are immutable: encode outside the lock
	c.mu.Unlock()
	// To whom is not said (and the other side of a join is no member
	// yet): the lowest version, which has kindState like every other.
	b := encodeRecordsAt(c.wireLo, kindState, recs, c.clock())
	c.bytesOut.Add(uint64(len(b)))
	c.statesOut.Add(1)
	return b
}

func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	c := d.c
	c.bytesIn.Add(uint64(len(buf)))
	c.statesIn.Add(1)
	now := c.clock()
	m, err := decodeMessageUpTo(buf, now, c.wireHi)
	if err == nil && m.kind != kindState {
		err = fmt.Errorf("message kind %d in a push/pull state", m.kind)
	}
	if err != nil {
		c.decodeError("push/pull state", err)
		return
	}
	recs := m.recs
	for len(recs) > 0 {
		n := min(len(recs), mergeChunk)
		c.mu.Lock()
		for _, r := range recs[:n] {
			c.st.apply(r, srcState, now)
		}
		c.flushLocked() // own retractions, pushes to nodes new in a network
		c.mu.Unlock()
		recs = recs[n:]
	}
}

// events implements memberlist.EventDelegate. memberlist calls it with its
// node lock held, one call at a time: it only updates the state under
// Cluster.mu (which sits below that lock) and never calls memberlist.
type events struct{ c *Cluster }

var _ memberlist.EventDelegate = (*events)(nil)

func nodeAddr(n *memberlist.Node) netip.AddrPort {
	a, ok := netip.AddrFromSlice(n.Addr)
	if !ok {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a.Unmap(), n.Port)
}

func (e *events) NotifyJoin(n *memberlist.Node) { e.up(n, "member joined") }

func (e *events) NotifyUpdate(n *memberlist.Node) { e.up(n, "member updated") }

func (e *events) up(n *memberlist.Node, msg string) {
	c := e.c
	addr := nodeAddr(n)
	meta := bytes.Clone(n.Meta)
	now := c.clock()
	c.mu.Lock()
	if n.Name == c.name {
		c.ownMeta = meta
	}
	var wasEpoch uint64
	var wasAddr netip.AddrPort
	wasAlive := false
	if m := c.st.members[n.Name]; m != nil {
		wasAlive, wasEpoch, wasAddr = m.alive, m.epoch, m.addr
	}
	back := c.st.memberUp(n.Name, addr, meta, now)
	c.st.setWire(n.Name, n.DMin, n.DMax)
	if m := c.st.members[n.Name]; m != nil && (!wasAlive || m.epoch != wasEpoch || wasAddr != addr) {
		c.sessionsChanged(n.Name, m.wireOf(), wasAddr)
	}
	c.flushLocked()
	if back && addr.IsValid() {
		c.comebacks[addr.String()] = true
		c.detachLocked(n.Name)
		c.wake(c.backCh)
	}
	if n.Name != c.name && addr.IsValid() {
		a := addr.String()
		cand := c.cands[a]
		if cand == nil {
			cand = &candidate{}
			c.cands[a] = cand
		}
		cand.kinds |= candSeen
		cand.lastAlive = now
	}
	c.membersChangedLocked()
	if !wasAlive || c.st.members[n.Name].epoch != wasEpoch {
		c.settingsDueLocked(n.Name)
		c.keyIDsDueLocked(n.Name)
	}
	refused, port := c.refuseLocked(n.Name), c.settings.VXLANPort
	c.mu.Unlock()
	c.logRefusal(n.Name, port, refused)
	if n.Name != c.name {
		c.connectOnce.Do(func() { close(c.connected) })
		c.log.Info(msg, "member", n.Name, "addr", addr)
	}
}

func (e *events) NotifyLeave(n *memberlist.Node) {
	c := e.c
	now := c.clock()
	c.mu.Lock()
	c.st.memberDown(n.Name, now)
	c.sessionsChanged(n.Name, 0, nodeAddr(n))
	if cand := c.cands[nodeAddr(n).String()]; cand != nil {
		cand.lastAlive = now
	}
	c.membersChangedLocked()
	restarting := false
	var grace time.Duration
	if m := c.st.members[n.Name]; m != nil {
		restarting, grace = m.restartMarked(), c.st.grace(m)
	}
	c.mu.Unlock()
	if n.Name != c.name {
		c.log.Info("member gone", "why", "its records are kept for the grace period", "member", n.Name, "addr", nodeAddr(n),
			"restarting", restarting, "grace", grace)
	}
}

// decodeError counts a malformed message, or one of a wire version this
// node does not speak, and logs it, rate-limited: a peer with the wrong
// software version could otherwise flood the log.
func (c *Cluster) decodeError(what string, err error) {
	if _, ok := errors.AsType[*versionError](err); ok {
		c.reject(RejectWireVersion, "gossip input of unknown wire version ignored", "input", what, "err", err)
		return
	}
	c.reject(RejectMalformed, "malformed gossip input ignored", "input", what, "err", err)
}

// mlLogWriter turns memberlist's "[LEVEL] memberlist: ..." lines into slog
// records at that level. memberlist mostly writes [ERR] for errors, but
// [ERROR] and "Err:" in a few places. A line that reports refused input
// (mlRefusals) is a refusal like the transport screen's: counted and logged
// by reject, at a bounded rate.
type mlLogWriter struct {
	log    *slog.Logger
	reject func(r Reason, msg string, args ...any)
	// stopping reports that the cluster is shutting down. memberlist's
	// goroutines then fail on the closed transport or on a dial the stop
	// cancelled, and say so at ERR (stopErrors): no error during a stop,
	// and an ERROR line on every plugin disable would teach operators to
	// ignore ERROR lines.
	stopping func() bool
	// wire is this node's range of wire versions, for the log line of a
	// push/pull that verifyProtocol failed.
	wire string
}

// incompatibleNode finds the node a failed verifyProtocol names: "Node
// 'x' delegate protocol version (4) is incompatible: [4, 3]" (the version
// is the node's current one, the range the one every node would share).
var incompatibleNode = regexp.MustCompile(`Node '([^']*)' delegate protocol version \(`)

// stopErrors are what memberlist's sends and dials fail with once the
// cluster stops: the transport closed, or the stream context cancelled
// (a dial says "operation was canceled", other waits "context canceled").
var stopErrors = [...]string{net.ErrClosed.Error(), "operation was canceled", context.Canceled.Error()}

// sessionEnds are what yamux's send and receive loops fail with when a
// session's connection ends: this node closed it (the member left, the
// session idled out, its reader failed) or the other end did. Streams on
// it fail and their callers retry or fall back; whether the member is
// alive is memberlist's to judge. Not an error an operator can act on.
var sessionEnds = [...]string{net.ErrClosed.Error(), "broken pipe", "connection reset by peer"}

// mlRefusals are the lines of memberlist v0.7.0 (net.go) about input that
// passed the transport screen, which checks only memberlist's framing: a
// message whose body does not decode, a ping for another node, a message
// its full handler queue dropped. By what follows "memberlist: ".
var mlRefusals = [...]struct {
	prefix string
	reason Reason
}{
	{"Failed to decode ", RejectMalformed}, // ping, indirect ping, ack, nack, suspect, alive, dead
	{"Failed to receive user message", RejectMalformed},
	{"Failed to read remote state", RejectMalformed},
	{"Got ping for unexpected node", RejectMisdirected},
	{"handler queue full", RejectQueueFull},
}

func (w *mlLogWriter) Write(p []byte) (int, error) {
	s := string(bytes.TrimSpace(p))
	level := slog.LevelInfo
	for _, l := range [...]struct {
		prefix string
		level  slog.Level
	}{{"[DEBUG]", slog.LevelDebug}, {"[INFO]", slog.LevelInfo}, {"[WARN]", slog.LevelWarn},
		{"[ERR]", slog.LevelError}, {"[ERROR]", slog.LevelError}, {"Err:", slog.LevelError}} {
		if rest, ok := cutPrefix(s, l.prefix); ok {
			s, level = rest, l.level
			break
		}
	}
	if rest, ok := cutPrefix(s, "memberlist:"); ok {
		s = rest
	}
	for _, r := range mlRefusals {
		if strings.HasPrefix(s, r.prefix) {
			w.reject(r.reason, "gossip input refused by memberlist", "err", s)
			return len(p), nil
		}
	}
	switch {
	case strings.Contains(s, errWireVersion.Error()):
		// aliveFilter's refusal, which it counted and logged.
		level = slog.LevelDebug
	case strings.Contains(s, "delegate protocol version ("):
		// verifyProtocol failed a push/pull (either side, a join's or a
		// periodic one): a node in it speaks none of the versions that
		// every node does.
		member := ""
		if m := incompatibleNode.FindStringSubmatch(s); m != nil {
			member = m[1]
		}
		w.reject(RejectWireVersion, "push/pull refused", "why", "a node in it speaks no wire version every node does",
			"member", member, "ours", w.wire, "err", s)
		return len(p), nil
	}
	if level > slog.LevelDebug && strings.HasPrefix(s, "yamux:") &&
		slices.ContainsFunc(sessionEnds[:], func(e string) bool { return strings.Contains(s, e) }) {
		level = slog.LevelDebug
	}
	if level > slog.LevelDebug && w.stopping != nil && w.stopping() &&
		slices.ContainsFunc(stopErrors[:], func(e string) bool { return strings.Contains(s, e) }) {
		level = slog.LevelDebug
	}
	w.log.Log(context.Background(), level, s)
	return len(p), nil
}

func cutPrefix(s, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(s, prefix)
	return strings.TrimSpace(rest), ok
}

func sortMembers(ms []Member) {
	slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.Name, b.Name) })
}
