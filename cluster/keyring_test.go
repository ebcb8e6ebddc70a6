package cluster

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// TestKeyRotation is the README's three-step roll on three nodes: add the
// new key everywhere, make it primary node by node, remove the old one.
// After every change an endpoint published on each node reaches every
// other (gossip never broke) and nothing was refused; at the end a node
// left holding only the old key is refused, and counted.
func TestKeyRotation(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	const oldID, newID = "11111111", "22222222"
	h := newHarness(t)
	h.key, h.keyIDs = oldKey, []string{oldID}
	h.settings = Settings{VXLANPort: 4789, UnderlayMTU: 1500}
	nodes := []*tnode{h.start(1), h.start(2, 1), h.start(3, 1)}
	waitMembers(t, nodes, 3)

	want := map[string]ep{}
	round := 0
	converge := func(step string, among []*tnode) {
		t.Helper()
		round++
		for i, n := range among {
			eid := fmt.Sprintf("%064x", round*10+i)
			p := testPeer(eid, round*10+i)
			n.c.Publish(netA, p)
			want[eid] = ep{n, p}
		}
		waitConverged(t, among, netA, want, 5*time.Second)
		if len(among) < len(nodes) {
			return // refusals of the node left behind are due
		}
		for _, n := range among {
			if r := n.c.Stats().RejectedDecrypt; r != 0 {
				t.Fatalf("%s: %s refused %d messages it could not decrypt", step, n.name, r)
			}
		}
	}
	ids := func(n *tnode, of string) []string {
		for _, m := range n.c.Members() {
			if m.Name == of {
				return m.KeyIDs
			}
		}
		return nil
	}
	set := func(n *tnode, primary []byte, accept [][]byte, keyIDs ...string) {
		t.Helper()
		if err := n.c.SetKeys(primary, accept, keyIDs); err != nil {
			t.Fatal(err)
		}
	}

	converge("start", nodes)
	for _, n := range nodes {
		set(n, oldKey, [][]byte{newKey}, oldID, newID)
	}
	converge("new key added", nodes)
	wait.For(t, 5*time.Second, 20*time.Millisecond, "every node sees that every node holds both keys", func() error {
		for _, n := range nodes {
			for _, o := range nodes {
				if got := ids(n, o.name); !slices.Equal(got, []string{oldID, newID}) {
					return fmt.Errorf("%s sees %s hold %v", n.name, o.name, got)
				}
			}
		}
		return nil
	})
	for _, n := range nodes { // one by one: the primaries differ meanwhile
		set(n, newKey, [][]byte{oldKey}, newID, oldID)
		converge("new key primary on "+n.name, nodes)
	}
	for _, n := range nodes[:2] {
		set(n, newKey, nil, newID)
		converge("old key removed on "+n.name, nodes)
	}

	// n3 is left behind with the old key alone: refused both ways, and
	// counted; n1 and n2 carry on.
	behind := nodes[2]
	set(behind, oldKey, nil, oldID)
	wait.For(t, 10*time.Second, 20*time.Millisecond, "n1 refuses n3's gossip", wait.Bool(func() bool { return nodes[0].c.Stats().RejectedDecrypt > 0 }))
	converge("n3 left behind", nodes[:2])

	for name, bad := range map[string]func() error{
		"short key":   func() error { return nodes[0].c.SetKeys([]byte("short"), nil, []string{newID}) },
		"bad id":      func() error { return nodes[0].c.SetKeys(newKey, nil, []string{"secret!!"}) },
		"no primary":  func() error { return nodes[0].c.SetKeys(nil, nil, nil) },
		"ids twice":   func() error { return nodes[0].c.SetKeys(newKey, [][]byte{oldKey}, []string{newID, newID}) },
		"9 key ids":   func() error { return nodes[0].c.SetKeys(newKey, nil, slices.Repeat([]string{newID}, 9)) },
		"a bad extra": func() error { return nodes[0].c.SetKeys(newKey, [][]byte{{1, 2, 3}}, []string{newID, oldID}) },
	} {
		if err := bad(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	converge("after refused keyrings", nodes[:2])
}

// TestSetKeysNeedsAnEncryptedCluster: a plaintext cluster gets no key.
func TestSetKeysNeedsAnEncryptedCluster(t *testing.T) {
	h := newHarness(t)
	n := h.start(1)
	if err := n.c.SetKeys(bytes.Repeat([]byte{1}, 32), nil, []string{"11111111"}); err == nil {
		t.Fatal("a plaintext cluster took a key")
	}
}

// TestMemberKeyIDsReachTheCallback: each member's key ids reach
// MemberKeyIDs by its VTEP, also when its settings came before the event
// that it is alive (a restarted member's often do).
func TestMemberKeyIDsReachTheCallback(t *testing.T) {
	var mu sync.Mutex
	got := map[netip.Addr][]string{}
	held := func(v netip.Addr) []string { mu.Lock(); defer mu.Unlock(); return got[v] }
	h := newHarness(t)
	h.key, h.keyIDs = bytes.Repeat([]byte{1}, 32), []string{"11111111"}
	h.settings = Settings{VXLANPort: 4789, UnderlayMTU: 1500}
	h.memberKeyIDs = func(v netip.Addr, ids []string) { mu.Lock(); got[v] = ids; mu.Unlock() }
	n1 := h.start(1)
	n2 := h.start(2, 1)
	waitMembers(t, []*tnode{n1, n2}, 2)
	for _, n := range []*tnode{n1, n2} {
		wait.For(t, 5*time.Second, 20*time.Millisecond, "the ids of "+n.name, wait.Bool(func() bool { return slices.Equal(held(n.ip), h.keyIDs) }))
	}

	// Settings of an instance n1 does not know alive yet, then the event.
	c, ip9 := n1.c, nodeIP(9)
	c.mu.Lock()
	c.st.adverts["n9"] = advert{epoch: 7, Settings: h.settings, keyIDs: []string{"99999999"}}
	c.keyIDsDueLocked("n9")
	c.mu.Unlock()
	time.Sleep(100 * time.Millisecond)
	if ids := held(ip9); ids != nil {
		t.Fatalf("ids %v delivered for a member not alive", ids)
	}
	(&events{c}).NotifyJoin(&memberlist.Node{Name: "n9", Addr: ip9.AsSlice(), Port: gossipPort, Meta: encodeMeta(ip9, 7, nil)})
	wait.For(t, 5*time.Second, 20*time.Millisecond, "n9's ids once it is alive", wait.Bool(func() bool { return slices.Equal(held(ip9), []string{"99999999"}) }))
}
