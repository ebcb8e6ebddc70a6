package cluster

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/overlay-plugin/overlay-plugin/cluster/memnet"

	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// target is one node on a memnet network and an attacker beside it that
// sends it datagrams and streams.
type target struct {
	c        *Cluster
	tr, from *memnet.Transport
	clock    *fakeClock
	logs     *logBuf
}

func newTarget(t *testing.T, key []byte) *target {
	t.Helper()
	net := memnet.New()
	tr, err := net.NewTransport(netip.AddrPortFrom(nodeIP(1), gossipPort))
	if err != nil {
		t.Fatal(err)
	}
	from, err := net.NewTransport(netip.AddrPortFrom(nodeIP(99), gossipPort))
	if err != nil {
		t.Fatal(err)
	}
	tg := &target{tr: tr, from: from, clock: &fakeClock{now: time.Unix(2e9, 0)}, logs: &logBuf{}}
	tg.c, err = New(Config{NodeName: "n1", BindPort: gossipPort, AdvertiseAddr: nodeIP(1), SecretKey: key, Transport: tr,
		MemberlistConfig: fastTimers, Sink: newRecSink(), Clock: tg.clock.Now,
		Logger: slog.New(slog.NewTextHandler(tg.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.c.Close() })
	return tg
}

// send delivers a datagram and waits until memberlist is done with it.
func (tg *target) send(t *testing.T, b []byte) {
	t.Helper()
	before := tg.handled()
	if _, err := tg.from.WriteToAddress(b, memberlist.Address{Addr: tg.tr.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 5*time.Second, tick, "datagram handled", func() error {
		if tg.handled() == before {
			return fmt.Errorf("not yet")
		}
		return nil
	})
}

// handled counts what the node refused or took.
func (tg *target) handled() uint64 {
	s := tg.c.Stats()
	return s.Rejected + s.MessagesReceived
}

// stream dials the node and writes b.
func (tg *target) stream(t *testing.T, b []byte) {
	t.Helper()
	before := tg.handled()
	conn, err := tg.from.DialAddressTimeout(memberlist.Address{Addr: tg.tr.Addr().String()}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	go func() { conn.Write(b); conn.Close() }()
	wait.For(t, 5*time.Second, tick, "stream handled", func() error {
		if tg.handled() == before {
			return fmt.Errorf("not yet")
		}
		return nil
	})
}

func (tg *target) want(t *testing.T, want map[Reason]uint64) {
	t.Helper()
	got := tg.c.Stats().Rejections()
	for r := range numReasons {
		if got[r.String()] != want[r] {
			t.Errorf("%v: %d refusals counted, want %d", r, got[r.String()], want[r])
		}
	}
}

// misdirectedPing is a ping (msgpack {SeqNo: 1, Node: "other"}) for a node
// that is not the one it reaches.
var misdirectedPing = append([]byte{mlPing, 0x82, 0xa5, 'S', 'e', 'q', 'N', 'o', 1, 0xa4, 'N', 'o', 'd', 'e', 0xa5},
	"other"...)

// Every refusal of a node without a secret is counted by its reason:
// those of the transport screen, of memberlist (read from its log), of
// the plugin's decoder; and memberlist's log lines about them are
// rate-limited like the rest.
func TestRejectionsCountedPlaintext(t *testing.T) {
	tg := newTarget(t, nil)
	bomb := lzwBomb(t)
	tg.send(t, bomb)
	tg.stream(t, bomb)
	tg.send(t, []byte{99, 0})
	tg.send(t, misdirectedPing)
	tg.send(t, []byte{mlUser, wireMagic, 9, 9}) // the plugin's decoder: unknown version
	tg.send(t, []byte{mlUser, wireMagic, 2, 9}) // the plugin's decoder: unknown kind
	const pings = 100
	for range pings {
		tg.send(t, []byte{mlPing, 0xc1}) // memberlist: "Failed to decode ping request"
	}
	tg.want(t, map[Reason]uint64{RejectCompressed: 2, RejectUnknownType: 1, RejectMisdirected: 1, RejectMalformed: pings + 1,
		RejectWireVersion: 1})
	if lines, _ := logLines(tg.logs.tail(1000), RejectMalformed); lines != 1 {
		t.Errorf("%d log lines for %d malformed messages, want 1", lines, pings+1)
	}
	tg.clock.advance(rejectLogEvery)
	wait.For(t, 5*time.Second, tick, "the count of the lines left out", func() error {
		if lines, n := logLines(tg.logs.tail(1000), RejectMalformed); lines != 2 || n != pings {
			return fmt.Errorf("%d lines counting %d left out, want 2 counting %d", lines, n, pings)
		}
		return nil
	})
}

// With a secret: undecryptable input, plaintext, and compression inside
// the encryption.
func TestRejectionsCountedEncrypted(t *testing.T) {
	tg := newTarget(t, testKey)
	tg.send(t, bytes.Repeat([]byte{0xee}, 60))
	tg.send(t, withCRC(ping))
	tg.send(t, seal(t, testKey, withCRC(lzwBomb(t)), nil))
	tg.stream(t, []byte{mlPushPull, 0x80})
	tg.stream(t, sealStream(t, testKey, []byte{mlCompress, 0x80}))
	tg.want(t, map[Reason]uint64{RejectDecrypt: 1, RejectPlain: 2, RejectCompressed: 2})
}

// Records refused by the merge rules are counted too: a record no newer
// than the one held, and one of an endpoint another node owns.
func TestRejectionsCountedRecords(t *testing.T) {
	h := newHarness(t)
	n1, n2 := h.start(1), h.start(2, 1)
	waitMembers(t, []*tnode{n1, n2}, 2)
	p := peer("e1", "10.1.0.5", 5)
	n2.c.Publish(netA, p)
	waitConverged(t, []*tnode{n1, n2}, netA, map[string]ep{"e1": {n2, p}}, 5*time.Second)

	n1.c.mu.Lock()
	held := n1.c.st.get(key{netA, "e1"}).clone()
	n1.c.mu.Unlock()
	(&delegate{n1.c}).NotifyMsg(encodeRecords(kindPush, []*record{held}, time.Now()))
	forged := liveRec(netA, "e1", n1.name, n1.ip.String(), "10.1.0.9", Version{1 << 61, 1})
	(&delegate{n2.c}).NotifyMsg(encodeRecords(kindPush, []*record{forged}, time.Now()))
	if s := n1.c.Stats(); s.Stale == 0 || s.Rejections()[RejectStale.String()] != s.Stale {
		t.Errorf("n1: stale %d, by reason %v", s.Stale, s.Rejections())
	}
	if got := n2.c.Stats().Rejections()[RejectOwnership.String()]; got != 1 {
		t.Errorf("n2: %d ownership refusals, want 1", got)
	}
}

// TestLiveAddrsFollowMembership: the screen's view of the members' gossip
// addresses (a copy, read without the lock) follows joins and failures.
func TestLiveAddrsFollowMembership(t *testing.T) {
	h := newHarness(t)
	a, b, c := h.start(1), h.start(2, 1), h.start(3, 1)
	waitMembers(t, []*tnode{a, b, c}, 3)
	for _, n := range []*tnode{b, c} {
		if !a.c.isMemberAddr(n.ip) || !a.c.isMemberGossipAddr(netip.AddrPortFrom(n.ip, gossipPort)) {
			t.Fatalf("%s is alive but not a member's address", n.name)
		}
	}
	if !a.c.isMemberAddr(a.ip) || a.c.isMemberGossipAddr(netip.AddrPortFrom(a.ip, gossipPort)) {
		t.Fatal("this node's own address: a member's host, but no peer's session")
	}
	if a.c.isMemberGossipAddr(netip.AddrPortFrom(b.ip, gossipPort+1)) || a.c.isMemberAddr(nodeIP(9)) {
		t.Fatal("a stranger's address passes for a member's")
	}
	c.crash()
	waitMembers(t, []*tnode{a, b}, 2)
	if a.c.isMemberAddr(c.ip) || a.c.isMemberGossipAddr(netip.AddrPortFrom(c.ip, gossipPort)) {
		t.Fatal("a failed member's address still passes")
	}
}
