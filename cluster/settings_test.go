package cluster

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestSettingsReachTheMembers: each node tells the others its VXLAN port
// and underlay MTU; a 0.1.0 node (wire version 2 only) neither gets nor
// sends them, refuses nothing, and shows none; a restarted node's new
// settings replace its old ones.
func TestSettingsReachTheMembers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t.Cleanup(func() { time.Sleep(15 * time.Second) }) // memberlist's streams end in the bubble
		h := newHarness(t)
		h.settings = Settings{VXLANPort: 4789, UnderlayMTU: 1500}
		n1 := h.start(1)
		h.settings = Settings{VXLANPort: 4790, UnderlayMTU: 1400}
		n2 := h.start(2, 1)
		h.wire, h.settings = [2]byte{2, 2}, Settings{}
		old := h.start(3, 1)
		h.wire = [2]byte{}
		waitMembers(t, []*tnode{n1, n2, old}, 3)
		time.Sleep(5 * time.Second)
		if got := memberOf(n1.c, "n2").Settings; got != (Settings{VXLANPort: 4790, UnderlayMTU: 1400}) {
			t.Errorf("n1 sees n2's settings as %+v", got)
		}
		if got := memberOf(n2.c, "n1").Settings; got != (Settings{VXLANPort: 4789, UnderlayMTU: 1500}) {
			t.Errorf("n2 sees n1's settings as %+v", got)
		}
		if got := memberOf(n1.c, "n3").Settings; got != (Settings{}) {
			t.Errorf("a 0.1.0 node shows settings %+v", got)
		}
		if got := memberOf(n1.c, "n1").Settings; got.VXLANPort != 4789 {
			t.Errorf("n1 shows its own settings as %+v", got)
		}
		if s := old.c.Stats(); s.Rejected != 0 {
			t.Errorf("the 0.1.0 node refused %d messages", s.Rejected)
		}

		n2.c.Close()
		h.settings = Settings{VXLANPort: 4791, UnderlayMTU: 1300}
		n2 = h.start(2, 1)
		waitMembers(t, []*tnode{n1, n2, old}, 3)
		time.Sleep(5 * time.Second)
		if got := memberOf(n1.c, "n2").Settings; got != (Settings{VXLANPort: 4791, UnderlayMTU: 1300}) {
			t.Errorf("after n2's restart n1 sees %+v", got)
		}
	})
}

func TestSettingsFromTheNetworkAreChecked(t *testing.T) {
	for _, c := range []struct{ port, mtu, swarm uint64 }{{0, 1500, 0}, {70000, 1500, 0}, {4789, 575, 0}, {4789, 70000, 0}, {4789, 1500, 2}} {
		msg := encodeSettings(3, "n9", 7, Settings{VXLANPort: uint16(c.port), UnderlayMTU: int(c.mtu)}, nil)
		if c.port > 65535 || c.swarm > 1 { // not encodable through Settings: build it by hand
			e := encoder{}
			e.b = append(e.b, wireMagic, 3, kindSettings)
			e.str("n9")
			e.uvarint(7)
			e.uvarint(c.port)
			e.uvarint(c.mtu)
			e.uvarint(c.swarm)
			msg = e.b
		}
		if _, err := decodeMessage(msg, time.Now()); err == nil {
			t.Errorf("port %d, MTU %d accepted", c.port, c.mtu)
		}
	}
	if _, err := decodeMessageUpTo(encodeSettings(3, "n9", 7, Settings{VXLANPort: 4789, UnderlayMTU: 1500}, nil), time.Now(), 2); err == nil {
		t.Error("a version-2 decoder (0.1.0's range) accepted a settings message")
	}
	for _, want := range []Settings{{VXLANPort: 4789, UnderlayMTU: 1500}, {VXLANPort: 5789, UnderlayMTU: 1400, Swarm: true}} {
		m, err := decodeMessage(encodeSettings(3, "n9", 7, want, nil), time.Now())
		if err != nil || m.from != "n9" || m.epoch != 7 || m.adv != want {
			t.Fatalf("round trip of %+v: %+v %v", want, m, err)
		}
	}
}

// TestSettingsKeyIDs: a node's key ids ride with its settings; ids that
// are not ids are refused with the message, and a message without any
// (a build before keyrings) still decodes.
func TestSettingsKeyIDs(t *testing.T) {
	adv := Settings{VXLANPort: 4789, UnderlayMTU: 1500}
	for _, ids := range [][]string{nil, {"0a1b2c3d"}, {"0a1b2c3d", "ffffffff", "00000000"}} {
		m, err := decodeMessage(encodeSettings(3, "n9", 7, adv, ids), time.Now())
		if err != nil || !slices.Equal(m.keyIDs, ids) || m.adv != adv {
			t.Fatalf("round trip of %v: %+v %v", ids, m, err)
		}
	}
	old := encodeSettings(3, "n9", 7, adv, nil)
	old = old[:len(old)-1] // no count at all
	if m, err := decodeMessage(old, time.Now()); err != nil || m.keyIDs != nil || m.adv != adv {
		t.Fatalf("settings without key ids: %+v %v", m, err)
	}
	nine := make([]string, 9)
	for i := range nine {
		nine[i] = fmt.Sprintf("%08x", i)
	}
	for name, ids := range map[string][]string{
		"too many": nine, "upper case": {"0A1B2C3D"}, "short": {"0a1b2c"}, "not hex": {"0a1b2c3g"}, "twice": {"0a1b2c3d", "0a1b2c3d"},
		"a secret's length": {strings.Repeat("ab", 16)},
	} {
		if m, err := decodeMessage(encodeSettings(3, "n9", 7, adv, ids), time.Now()); err == nil {
			t.Errorf("%s: key ids %v accepted as %v", name, ids, m.keyIDs)
		}
	}
	trunc := encodeSettings(3, "n9", 7, adv, []string{"0a1b2c3d"})
	if _, err := decodeMessage(trunc[:len(trunc)-2], time.Now()); err == nil {
		t.Error("a truncated key id accepted")
	}
}

// TestSettingsToAMemberDuringNew: memberlist reports members from Create
// on, before New has the Memberlist to send with: a node restarted where
// the others keep reaching for it hears of them at once. Its settings go
// out once it can send, and reach them.
func TestSettingsToAMemberDuringNew(t *testing.T) {
	h := newHarness(t)
	h.settings = Settings{VXLANPort: 4789, UnderlayMTU: 1500}
	n1 := h.start(1)
	n2 := h.start(2, 1)
	waitMembers(t, []*tnode{n1, n2}, 2)
	for i := range 15 {
		n2.crash()
		h.settings = Settings{VXLANPort: 4789, UnderlayMTU: 1400 - i}
		n2 = h.start(2, 1)
		want := h.settings
		deadline := time.Now().Add(10 * time.Second)
		for memberOf(n1.c, "n2").Settings != want {
			if time.Now().After(deadline) {
				t.Fatalf("restart %d: n1 sees n2's settings as %+v, want %+v", i, memberOf(n1.c, "n2").Settings, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestOtherPortRefused: a member that receives VXLAN on another port than
// this node's has its endpoints kept out of the Sink (and the snapshot the
// driver resyncs from); once it restarts on the same port they go in.
func TestOtherPortRefused(t *testing.T) {
	h := newHarness(t)
	h.settings = Settings{VXLANPort: 4789, UnderlayMTU: 1500}
	n1 := h.start(1)
	h.settings = Settings{VXLANPort: 4790, UnderlayMTU: 1500}
	n2 := h.start(2, 1)
	waitMembers(t, []*tnode{n1, n2}, 2)
	p := testPeer("e2", 2)
	n2.c.Publish(netA, p)
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("n1 knows n2's port", func() bool { return memberOf(n1.c, "n2").Settings.VXLANPort == 4790 })
	time.Sleep(time.Second) // deliveries of anything n1 accepted
	if _, ok := n1.sink.get(netA)["e2"]; ok {
		t.Fatal("n1 programmed an endpoint of a node on another VXLAN port")
	}
	if len(n1.c.Snapshot(netA)) != 0 {
		t.Fatalf("n1's snapshot holds %v", n1.c.Snapshot(netA))
	}
	n2.c.Close()
	h.settings = Settings{VXLANPort: 4789, UnderlayMTU: 1500}
	n2 = h.start(2, 1)
	n2.c.Publish(netA, p)
	waitFor("n2's endpoint on n1 once it agrees", func() bool { _, ok := n1.sink.get(netA)["e2"]; return ok })
}

// TestSettleFromTheSwarm: a node that joins not knowing its VXLAN port
// (a worker, whose engine does not say the swarm's) tells nothing and
// refuses nobody; it learns the port from a member following the swarm
// (ClusterPort), settles on it, and from then on the members hear its
// settings and it refuses a member on another port.
func TestSettleFromTheSwarm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t.Cleanup(func() { time.Sleep(15 * time.Second) }) // memberlist's streams end in the bubble
		h := newHarness(t)
		h.settings = Settings{VXLANPort: 5789, UnderlayMTU: 1500, Swarm: true}
		manager := h.start(1)
		h.settings = Settings{VXLANPort: 4789, UnderlayMTU: 1500}
		other := h.start(3, 1)
		h.settings = Settings{}
		worker := h.start(2, 1)
		waitMembers(t, []*tnode{manager, worker, other}, 3)
		time.Sleep(5 * time.Second)
		port, from, swarm, ok := worker.c.ClusterPort()
		if !ok || port != 5789 || from != "n1" || !swarm {
			t.Fatalf("the worker's cluster port: %d from %q (swarm %v, %v), want 5789 from n1, following the swarm", port, from, swarm, ok)
		}
		if port, from, swarm, ok := manager.c.ClusterPort(); !ok || port != 4789 || from != "n3" || swarm {
			t.Errorf("the manager's cluster port: %d from %q (swarm %v, %v), want 4789 from n3", port, from, swarm, ok)
		}
		p := testPeer("e3", 3)
		other.c.Publish(netA, p)
		time.Sleep(2 * time.Second)
		if _, ok := worker.sink.get(netA)["e3"]; !ok {
			t.Fatal("an unsettled node refused a member")
		}
		if got := memberOf(manager.c, "n2").Settings; got != (Settings{}) {
			t.Fatalf("an unsettled node told settings %+v", got)
		}

		worker.c.SettleSettings(Settings{VXLANPort: port, UnderlayMTU: 1500, Swarm: true})
		time.Sleep(5 * time.Second)
		if got := memberOf(manager.c, "n2").Settings; got != (Settings{VXLANPort: 5789, UnderlayMTU: 1500, Swarm: true}) {
			t.Errorf("the manager sees the settled worker's settings as %+v", got)
		}
		if _, ok := worker.sink.get(netA)["e3"]; ok {
			t.Error("the settled worker keeps the endpoint of a member on another port")
		}
		worker.c.SettleSettings(Settings{VXLANPort: 6789, UnderlayMTU: 1500})
		if got := memberOf(worker.c, "n2").Settings.VXLANPort; got != 5789 {
			t.Errorf("settled twice: the worker's port is %d", got)
		}
	})
}
