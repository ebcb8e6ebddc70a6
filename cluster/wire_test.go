package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// Every kind round-trips at every version that has it, the two
// versions' encodings differ only in the version byte, and the decoder
// refuses a kind its version lacks and versions outside its range (the
// latter as a *versionError, which the cluster counts as wire_version).
func TestCodecVersions(t *testing.T) {
	t0 := time.Unix(2e9, 0)
	recs := []*record{
		liveRec(netA, "e1", "n2", "10.0.0.2", "10.1.0.1", Version{5, 1}),
		tombRec(netA, "e2", "n2", Version{5, 2}, t0.Add(-time.Second)),
		{NetworkID: netA, EndpointID: memberEID("n2"), Owner: "n2", Member: true, Version: Version{5, 3}},
	}
	syncs := []syncEntry{{nid: netA, level: syncNetwork, sum: digest{count: 2, hash: 7}}}
	for _, v := range []byte{2, 3} {
		for _, kind := range []byte{kindRecords, kindState, kindPush} {
			b := encodeRecordsAt(v, kind, recs, t0)
			m, err := decodeMessage(b, t0)
			if err != nil {
				t.Fatalf("v%d kind %d: %v", v, kind, err)
			}
			if m.version != v || m.kind != kind || len(m.recs) != len(recs) {
				t.Fatalf("v%d kind %d: decoded version %d kind %d, %d records", v, kind, m.version, m.kind, len(m.recs))
			}
			for i, r := range m.recs {
				w := recs[i]
				if r.EndpointID != w.EndpointID || r.Owner != w.Owner || r.Version != w.Version || r.Deleted != w.Deleted ||
					r.Member != w.Member || r.endpoint() && !sameContent(r, w) || r.Deleted && !r.At.time().Equal(w.At.time()) {
					t.Errorf("v%d kind %d: record %d = %+v, want %+v", v, kind, i, r, recs[i])
				}
			}
		}
		b := encodeSync(v, "n2", syncs, recs[:1], t0)
		m, err := decodeMessage(b, t0)
		if err != nil || m.version != v || m.kind != kindSync || m.from != "n2" || len(m.syncs) != 1 || m.syncs[0].sum != syncs[0].sum || len(m.recs) != 1 {
			t.Fatalf("v%d sync: %+v, %v", v, m, err)
		}
		// Owner digests carry their mark from version 3 on.
		marked := []syncEntry{{nid: "n", level: syncCompare, groups: []ownerDigest{{owner: "o", d: digest{2, 3}, hw: Version{4, 5}}}}}
		want := Version{}
		if v >= wireSyncMarks {
			want = Version{4, 5}
		}
		if m, err := decodeMessage(encodeSync(v, "n2", marked, nil, t0), t0); err != nil || m.syncs[0].groups[0].hw != want || m.syncs[0].groups[0].d != (digest{2, 3}) {
			t.Errorf("v%d owner digest: %+v, %v; want mark %v", v, m, err, want)
		}
	}
	if v2, v3 := encodeRecordsAt(2, kindPush, recs, t0), encodeRecordsAt(3, kindPush, recs, t0); !bytes.Equal(v2[2:], v3[2:]) || v2[1] != 2 || v3[1] != 3 {
		t.Error("versions 2 and 3 of a kind both have differ beyond the version byte")
	}

	r := encodeRestart(3, "n2", 12345)
	m, err := decodeMessage(r, t0)
	if err != nil || m.version != 3 || m.kind != kindRestart || m.from != "n2" || m.epoch != 12345 {
		t.Fatalf("restart: %+v, %v", m, err)
	}
	for i := range len(r) {
		if _, err := decodeMessage(r[:i], t0); err == nil {
			t.Errorf("restart truncated to %d bytes decoded", i)
		}
	}
	if _, err := decodeMessage(append(bytes.Clone(r), 0), t0); err == nil {
		t.Error("restart with a trailing byte decoded")
	}
	if _, err := decodeMessage(encodeRestart(3, "", 1), t0); err == nil {
		t.Error("restart without a node decoded")
	}
	// The v3-only kind in a v2 message: refused, and not as a version.
	_, err = decodeMessage(encodeRestart(2, "n2", 12345), t0)
	if _, isVersion := errors.AsType[*versionError](err); err == nil || isVersion {
		t.Errorf("restart in a v2 message: %v, want a refusal of the kind", err)
	}
	// A node that speaks only 2 (0.1.0) refuses version 3 as a version.
	if _, err := decodeMessageUpTo(encodeRecordsAt(3, kindPush, recs, t0), t0, 2); !isVersionErr(err) {
		t.Errorf("v3 at a [2,2] decoder: %v, want a version error", err)
	}
	for _, v := range []byte{0, 1, 4, 255} {
		b := encodeRecordsAt(v, kindPush, recs, t0)
		if _, err := decodeMessage(b, t0); !isVersionErr(err) {
			t.Errorf("version %d: %v, want a version error", v, err)
		}
	}
}

func isVersionErr(err error) bool {
	_, ok := errors.AsType[*versionError](err)
	return ok
}

// Versions 1 and 4 reaching a node are refused and counted as
// wire_version, with one log line naming the reason; a v3-only kind in
// a v2 message is malformed.
func TestWireVersionRefusalsCounted(t *testing.T) {
	tg := newTarget(t, nil)
	t0 := time.Unix(2e9, 0)
	rec := []*record{liveRec(netA, "e1", "n2", "10.0.0.2", "10.1.0.1", Version{5, 1})}
	tg.send(t, append([]byte{mlUser}, encodeRecordsAt(1, kindPush, rec, t0)...))
	tg.send(t, append([]byte{mlUser}, encodeRecordsAt(4, kindPush, rec, t0)...))
	tg.send(t, append([]byte{mlUser}, encodeRestart(2, "n2", 5)...))
	wait.For(t, 5*time.Second, tick, "refusals counted", func() error {
		if s := tg.c.Stats(); s.RejectedWireVersion != 2 || s.DecodeErrors != 1 {
			return fmt.Errorf("wire_version %d, malformed %d; want 2, 1", s.RejectedWireVersion, s.DecodeErrors)
		}
		return nil
	})
	if got := tg.c.Stats().Rejections()[RejectWireVersion.String()]; got != 2 {
		t.Errorf("Rejections()[wire_version] = %d, want 2", got)
	}
	if lines, _ := logLines(tg.logs.tail(1000), RejectWireVersion); lines != 1 {
		t.Errorf("%d log lines for 2 wire version refusals, want 1 (rate-limited)", lines)
	}
}

// received is how many of the plugin's messages of kind at version v c got.
func received(c *Cluster, v, kind byte) uint64 { return c.recvd[v][kind].Load() }

// TestWireNegotiation: n3 speaks only version 2, as 0.1.0 does; n1 and
// n2 speak 2..3. Every broadcast is v2 (n3 would refuse a v3 one, and
// count it), before n3 goes and after; messages to one node are v3
// between n1 and n2 and v2 to n3; the endpoints of all three reach all
// three.
func TestWireNegotiation(t *testing.T) {
	h := newHarness(t)
	h.wire = [2]byte{2, 2}
	n3 := h.start(3)
	h.wire = [2]byte{}
	n1 := h.start(1, 3)
	n2 := h.start(2, 3)
	nodes := []*tnode{n1, n2, n3}
	waitMembers(t, nodes, 3)

	want := map[string]ep{}
	for i, n := range nodes {
		p := testPeer(n.name+"e", i+1)
		n.c.Publish(netA, p)
		want[p.EndpointID] = ep{n, p}
	}
	waitConverged(t, nodes, netA, want, 10*time.Second)
	// A membership broadcast while n3 is alive.
	n1.c.NetworkAdded("netb")
	waitNetworkMembers(t, nodes, "netb", 1)

	for _, n := range nodes {
		n.c.mu.Lock()
		to := map[string]byte{}
		for _, o := range nodes {
			to[o.name] = n.c.versionForLocked(o.name)
		}
		n.c.mu.Unlock()
		wantTo := map[string]byte{"n1": 3, "n2": 3, "n3": 2}
		if n == n3 {
			wantTo = map[string]byte{"n1": 2, "n2": 2, "n3": 2}
		}
		for name, v := range wantTo {
			if name != n.name && to[name] != v {
				t.Errorf("%s sends to %s at v%d, want v%d", n.name, name, to[name], v)
			}
		}
		if n.c.bcastVer != 2 {
			t.Errorf("%s broadcasts at v%d, want 2", n.name, n.c.bcastVer)
		}
	}
	if m := memberOf(n1.c, "n3"); m.Wire != "2..2" {
		t.Errorf("n1 lists n3 speaking %q, want 2..2", m.Wire)
	}
	if m := memberOf(n3.c, "n1"); m.Wire != "2..3" {
		t.Errorf("n3 lists n1 speaking %q, want 2..3", m.Wire)
	}
	for _, n := range nodes {
		if got := received(n.c, 3, kindRecords); got != 0 {
			t.Errorf("%s received %d v3 broadcasts while n3 was alive", n.name, got)
		}
	}
	if got := received(n2.c, 3, kindPush) + received(n2.c, 3, kindSync); got == 0 {
		t.Error("n2 received no v3 message from n1")
	}
	if got := received(n3.c, 2, kindPush) + received(n3.c, 2, kindSync); got == 0 {
		t.Error("n3 received no v2 message")
	}
	for _, n := range nodes {
		if s := n.c.Stats(); s.RejectedWireVersion != 0 || s.DecodeErrors != 0 {
			t.Errorf("%s refused %d messages as of another wire version, %d as malformed", n.name, s.RejectedWireVersion, s.DecodeErrors)
		}
	}

	// n3 (like 0.1.0) leaves without announcing; broadcasts stay v2.
	n3.c.Close()
	waitMembers(t, nodes[:2], 2)
	for _, n := range nodes[:2] {
		if m := memberOf(n.c, "n3"); m.State != MemberGone {
			t.Errorf("%s lists n3 %q after it left without announcing a restart, want gone", n.name, m.State)
		}
	}
	if got := n3.c.Stats().RestartsAnnounced; got != 0 {
		t.Errorf("n3 (v2 only) announced %d restarts", got)
	}
	n1.c.NetworkAdded("netc")
	waitNetworkMembers(t, nodes[:2], "netc", 1)
	if got := received(n2.c, 3, kindRecords); got != 0 {
		t.Errorf("n2 received %d v3 broadcasts", got)
	}
}

func memberOf(c *Cluster, name string) Member {
	for _, m := range c.Members() {
		if m.Name == name {
			return m
		}
	}
	return Member{}
}

// TestWireRefusedNode: a node that speaks only versions 4..5 shares none
// with this build's 2..3. Its join fails (memberlist's verifyProtocol
// fails the push/pull on both sides), its alive message by gossip is
// refused by the AliveDelegate, and it never becomes a member; both are
// counted as wire_version, and the log names it, its range and ours.
func TestWireRefusedNode(t *testing.T) {
	h := newHarness(t)
	n1 := h.start(1)
	h.wire = [2]byte{4, 5}
	n9 := h.start(9, 1)
	wait.For(t, 10*time.Second, tick, "the join refused", func() error {
		if got := n1.c.Stats().RejectedWireVersion; got == 0 {
			return errors.New("no wire version refusal at n1 yet")
		}
		if got := n9.c.Stats().RejectedWireVersion; got == 0 {
			return errors.New("no wire version refusal at n9 yet")
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // a few probe and gossip rounds
	assertNotMember(t, n1.c, "n9")
	if got := aliveMembers(n9.c); got != 1 {
		t.Errorf("n9 sees %d alive members, want only itself", got)
	}
	log := h.logs.tail(failLogLines * 4)
	if !hasLine(log, "node=n1", "reason=wire_version", "member=n9", "ours=2..3") {
		t.Errorf("no log line at n1 naming n9 and our range 2..3 with reason wire_version:\n%s", log)
	}
}

// assertNotMember fails t if c, or its memberlist, lists the node name.
func assertNotMember(t *testing.T, c *Cluster, name string) {
	t.Helper()
	for _, m := range c.Members() {
		if m.Name == name {
			t.Errorf("%s is listed: %+v", name, m)
		}
	}
	for _, m := range c.ml.Members() {
		if m.Name == name {
			t.Errorf("%s is in memberlist: %+v", name, m)
		}
	}
}

func hasLine(log string, parts ...string) bool {
	for _, l := range strings.Split(log, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}

// TestWireRefusedAlive: the alive message of a node that speaks only
// 4..5 reaches a node by gossip (as a member that accepted it would relay
// it; memberlist's alive, msgpack, in a datagram). The AliveDelegate
// refuses it: counted as wire_version, logged naming the node, its range
// and ours, and the node never becomes a member; a second one is counted
// and left out of the log (the bounded rate).
func TestWireRefusedAlive(t *testing.T) {
	tg := newTarget(t, nil)
	pkt := aliveMsg("n9", nodeIP(99), gossipPort, encodeMeta(nodeIP(99), 7, nil), [6]byte{1, 5, 2, 4, 5, 4})
	tg.send(t, pkt)
	tg.send(t, pkt)
	wait.For(t, 5*time.Second, tick, "the alive messages refused", func() error {
		if got := tg.c.Stats().RejectedWireVersion; got != 2 {
			return fmt.Errorf("%d refused, want 2", got)
		}
		return nil
	})
	assertNotMember(t, tg.c, "n9")
	log := tg.logs.tail(1000)
	if !hasLine(log, "reason=wire_version", "member=n9", "theirs=4..5", "ours=2..3") {
		t.Errorf("no log line naming n9, its range 4..5 and ours 2..3 with reason wire_version:\n%s", log)
	}
	if lines, _ := logLines(log, RejectWireVersion); lines != 1 {
		t.Errorf("%d log lines for 2 refusals, want 1", lines)
	}
	if strings.Contains(log, "level=WARN msg=\"ignoring alive message") {
		t.Errorf("memberlist's own line about the refusal is logged unthrottled:\n%s", log)
	}
	// A node of an overlapping range is taken.
	n8 := aliveMsg("n8", nodeIP(98), gossipPort, encodeMeta(nodeIP(98), 7, nil), [6]byte{1, 5, 2, 2, 4, 2})
	if _, err := tg.from.WriteToAddress(n8, memberlist.Address{Addr: tg.tr.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 5*time.Second, tick, "n8 a member", func() error {
		if m := memberOf(tg.c, "n8"); m.Wire != "2..4" {
			return fmt.Errorf("n8: %+v", m)
		}
		return nil
	})
	tg.c.mu.Lock()
	v := tg.c.versionForLocked("n8")
	tg.c.mu.Unlock()
	if v != 3 {
		t.Errorf("to a node of 2..4: v%d, want 3", v)
	}
}

// aliveMsg encodes memberlist's alive message (type 4, then msgpack of
// {Incarnation, Node, Addr, Port, Meta, Vsn}) as a datagram.
func aliveMsg(name string, addr netip.Addr, port uint16, meta []byte, vsn [6]byte) []byte {
	b := []byte{mlAlive, 0x86}
	str := func(s string) {
		b = append(b, 0xd9, byte(len(s)))
		b = append(b, s...)
	}
	bin := func(v []byte) {
		b = append(b, 0xc4, byte(len(v)))
		b = append(b, v...)
	}
	str("Incarnation")
	b = append(b, 0xce, 0, 0, 0, 1)
	str("Node")
	str(name)
	str("Addr")
	bin(addr.AsSlice())
	str("Port")
	b = append(b, 0xcd, byte(port>>8), byte(port))
	str("Meta")
	bin(meta)
	str("Vsn")
	bin(vsn[:])
	return b
}

// TestBroadcastsAtTheVersionEveryReleaseSpeaks: memberlist hands queued
// broadcasts to whatever packet it sends next, to a node it does not
// know yet included (the ack of a ping from a node that just learned of
// this one, while this one still waits for the join's reply). So a node
// alone in its cluster, as every node is at start, must not queue what a
// 0.1.0 node (version 2 only) would refuse.
func TestBroadcastsAtTheVersionEveryReleaseSpeaks(t *testing.T) {
	h := newHarness(t)
	n1 := h.start(1)
	n1.c.NetworkAdded(netA)
	msgs := n1.c.queue.GetBroadcasts(0, 64<<10)
	if len(msgs) == 0 {
		t.Fatal("no broadcast queued for the network's membership record")
	}
	for _, m := range msgs {
		if m[1] != wireBroadcast {
			t.Errorf("a node alone queues a broadcast at version %d, want %d (what 0.1.0 decodes)", m[1], wireBroadcast)
		}
	}
}

// TestNoV3GossipToTheDead: memberlist gossips to dead members too, for
// GossipToTheDeadTime. n3 speaks only version 2, as 0.1.0 does; cut off
// from n1 until n1 holds it dead, then back: n1's broadcasts meanwhile
// must be ones n3 decodes, and n3 refuses nothing.
func TestNoV3GossipToTheDead(t *testing.T) {
	h := newHarness(t)
	h.wire = [2]byte{2, 2}
	n3 := h.start(3)
	h.wire = [2]byte{}
	n1 := h.start(1, 3)
	nodes := []*tnode{n1, n3}
	waitMembers(t, nodes, 2)
	h.isolate(n3)
	waitMembersWithin(t, nodes[:1], 1, 10*time.Second)
	h.net.SetFilter(nil)
	for i := range 20 {
		n1.c.NetworkAdded(fmt.Sprintf("net%d", i))
		time.Sleep(5 * time.Millisecond)
	}
	waitMembers(t, nodes, 2)
	waitNetworkMembers(t, nodes, "net19", 1)
	if s := n3.c.Stats(); s.DecodeErrors != 0 || s.RejectedWireVersion != 0 {
		t.Errorf("n3 (v2 only) refused %d messages as malformed, %d as of another version", s.DecodeErrors, s.RejectedWireVersion)
	}
}
