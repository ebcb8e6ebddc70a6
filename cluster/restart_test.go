package cluster

import (
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"
)

// The restart mark in the state alone: it belongs to one instance, it
// turns the dead grace into the restart grace at the sweep, a new epoch
// clears it, and an announcement for another epoch is ignored.
func TestStateRestartGrace(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	addr := netip.MustParseAddrPort("10.0.0.2:7946")
	metaAt := func(epoch uint64) []byte { return encodeMeta(netip.MustParseAddr("10.0.0.2"), epoch, nil) }
	setup := func() *state {
		s := newTestState("a", "10.0.0.1", 100)
		s.restartGrace = 10 * time.Minute
		s.memberUp("b", addr, metaAt(1), t0)
		s.apply(&record{NetworkID: netA, EndpointID: memberEID("b"), Owner: "b", Member: true, Version: Version{1, 1}}, srcPush, t0)
		if !s.apply(liveRec(netA, "eb", "b", "10.0.0.2", "10.1.0.2", Version{1, 2}), srcPush, t0) {
			t.Fatal("b's record not taken")
		}
		return s
	}
	has := func(s *state) bool { return s.get(key{netA, "eb"}) != nil }

	s := setup()
	if s.restartAnnounced("b", 2) || s.restartAnnounced("b", 0) || s.restartAnnounced("a", 100) || s.restartAnnounced("zz", 1) {
		t.Fatal("an announcement for another instance, for this node or for an unknown node was taken")
	}
	if !s.restartAnnounced("b", 1) {
		t.Fatal("b's announcement for its current epoch ignored")
	}
	s.memberDown("b", t0)
	s.sweep(t0.Add(grace + time.Second))
	if !has(s) || s.members["b"].purged {
		t.Fatal("a restarting member's records purged after the dead grace")
	}
	if s.apply(liveRec(netA, "eb2", "b", "10.0.0.2", "10.1.0.3", Version{1, 3}), srcPush, t0.Add(grace+time.Second)); s.get(key{netA, "eb2"}) == nil {
		t.Error("a record of a restarting member within its restart grace refused")
	}
	s.sweep(t0.Add(10*time.Minute - time.Second))
	if !has(s) {
		t.Fatal("purged before the restart grace")
	}
	s.sweep(t0.Add(10 * time.Minute))
	if has(s) || !s.members["b"].purged || s.members["b"].data != nil {
		t.Fatal("not purged at the restart grace")
	}

	// A new instance clears the mark: gone again, it keeps the dead grace.
	s = setup()
	s.restartAnnounced("b", 1)
	s.memberDown("b", t0)
	s.memberUp("b", addr, metaAt(2), t0.Add(time.Second))
	if s.members["b"].restartMarked() || s.members["b"].restarting != 0 {
		t.Fatal("the mark survived a new epoch")
	}
	s.memberDown("b", t0.Add(2*time.Second))
	s.sweep(t0.Add(2*time.Second + grace))
	if has(s) {
		t.Fatal("the new instance's records outlived the dead grace")
	}

	// An announcement for the old epoch once the new instance is known
	// is ignored.
	s = setup()
	s.memberUp("b", addr, metaAt(2), t0)
	if s.restartAnnounced("b", 1) {
		t.Fatal("an announcement for the old epoch taken")
	}
	s.memberDown("b", t0)
	s.sweep(t0.Add(grace))
	if has(s) {
		t.Fatal("a stale announcement extended the grace")
	}
}

// restartHarness is three nodes, in virtual time, with a dead grace of 2 s
// and a restart grace of 60 s; n3 has an endpoint and node data.
func restartHarness(t *testing.T) (*harness, []*tnode, map[string]ep) {
	// memberlist's probes and streams outlive Close until they time out;
	// the bubble must see them end. Runs last.
	t.Cleanup(func() { time.Sleep(15 * time.Second) })
	h := newHarness(t)
	h.grace, h.restartGrace = 2*time.Second, time.Minute
	nodes := []*tnode{h.start(1), h.start(2, 1), h.start(3, 1)}
	waitMembers(t, nodes, 3)
	p := testPeer("e3", 3)
	nodes[2].c.Publish(netA, p)
	want := map[string]ep{"e3": {nodes[2], p}}
	if err := nodes[2].c.SetNodeData([]byte("keys3")); err != nil {
		t.Fatal(err)
	}
	waitConverged(t, nodes, netA, want, 10*time.Second)
	waitData(t, nodes[:2], nodes[2], "keys3")
	return h, nodes, want
}

// waitData waits until every observer holds owner's node data d ("": none).
func waitData(t *testing.T, observers []*tnode, owner *tnode, d string) {
	t.Helper()
	waitFor(t, 10*time.Second, "node data "+fmt.Sprintf("%q", d), func() error {
		for _, o := range observers {
			got, ok := o.sink.getData(owner.ip)
			if d == "" && ok || d != "" && string(got) != d {
				return fmt.Errorf("%s has %q (%v)", o.name, got, ok)
			}
		}
		return nil
	})
}

// waitFor polls in the bubble's virtual time.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(tick)
	}
}

func waitState(t *testing.T, observers []*tnode, name string, want MemberState) time.Time {
	t.Helper()
	waitFor(t, 10*time.Second, name+" "+string(want), func() error {
		for _, o := range observers {
			if m := memberOf(o.c, name); m.State != want {
				return fmt.Errorf("%s lists %s %q", o.name, name, m.State)
			}
		}
		return nil
	})
	return time.Now()
}

// A node stopped with Close announces its restart, then leaves: the others
// list it as restarting and keep its endpoint and node data (its IPsec
// keys) past the dead grace, until the restart grace.
func TestRestartAnnouncedKeepsRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, nodes, want := restartHarness(t)
		obs, n3 := nodes[:2], nodes[2]
		stopped := time.Now()
		n3.c.Close()
		if took := time.Since(stopped); took > 2*time.Second {
			t.Errorf("Close took %v", took)
		}
		if s := n3.c.Stats(); s.RestartsAnnounced != 2 {
			t.Errorf("n3 announced its restart to %d members, want 2", s.RestartsAnnounced)
		}
		gone := waitState(t, obs, "n3", MemberRestarting)
		for _, o := range obs {
			s := o.c.Stats()
			if s.RestartsReceived != 1 || s.MembersRestarting != 1 || s.MembersGone != 1 {
				t.Errorf("%s: %d announcements received, %d restarting, %d gone; want 1, 1, 1", o.name, s.RestartsReceived, s.MembersRestarting, s.MembersGone)
			}
			m := memberOf(o.c, "n3")
			if until := m.KeptUntil.Sub(m.Since); until != time.Minute {
				t.Errorf("%s keeps n3's records until %v after it went, want the restart grace of 1m", o.name, until)
			}
		}
		time.Sleep(5 * 2 * time.Second) // five dead graces
		if err := converged(obs, netA, want); err != nil {
			t.Fatalf("past the dead grace: %v", err)
		}
		waitData(t, obs, n3, "keys3")
		time.Sleep(time.Until(gone.Add(time.Minute - time.Second)))
		if err := converged(obs, netA, want); err != nil {
			t.Fatalf("a second before the restart grace: %v", err)
		}
		waitFor(t, 5*time.Second, "n3's endpoint removed after the restart grace", func() error {
			return converged(obs, netA, map[string]ep{})
		})
		if elapsed := time.Since(gone); elapsed < time.Minute-time.Second {
			t.Errorf("removed %v after n3 went, before the restart grace", elapsed)
		}
		waitData(t, obs, n3, "")
		waitState(t, obs, "n3", MemberPurged)
	})
}

// A node that leaves without announcing (as 0.1.0 does, or a stop that is
// not Close) or crashes loses its records after the dead grace.
func TestUnannouncedGoneAfterDeadGrace(t *testing.T) {
	for _, how := range []string{"leave", "crash"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				_, nodes, _ := restartHarness(t)
				obs, n3 := nodes[:2], nodes[2]
				stopped := time.Now()
				if how == "leave" {
					n3.c.closeOnce.Do(func() { n3.c.shutdown(true) })
				} else {
					n3.crash()
				}
				waitFor(t, 20*time.Second, "n3's endpoint removed after the dead grace", func() error {
					return converged(obs, netA, map[string]ep{})
				})
				if took := time.Since(stopped); took > 15*time.Second || took < 2*time.Second {
					t.Errorf("removed %v after the stop: want the dead grace of 2s after the departure was seen", took)
				}
				waitData(t, obs, n3, "")
				for _, o := range obs {
					if s := o.c.Stats(); s.RestartsReceived != 0 || s.MembersRestarting != 0 {
						t.Errorf("%s: %d announcements, %d restarting", o.name, s.RestartsReceived, s.MembersRestarting)
					}
				}
			})
		})
	}
}

// A new instance of a node that announced its restart takes over (the
// mark is gone); an announcement then for the old instance is ignored,
// so a crash of the new one loses its records after the dead grace.
func TestRestartNewEpochClears(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, nodes, want := restartHarness(t)
		obs, n3 := nodes[:2], nodes[2]
		oldEpoch := n3.c.epoch
		n3.c.Close()
		waitState(t, obs, "n3", MemberRestarting)
		time.Sleep(5 * time.Second)
		n3 = h.start(3, 1)
		if n3.c.epoch == oldEpoch {
			t.Fatal("the restarted node has the old epoch")
		}
		n3.c.Publish(netA, want["e3"].p)
		want["e3"] = ep{n3, want["e3"].p}
		waitMembers(t, []*tnode{obs[0], obs[1], n3}, 3)
		waitConverged(t, []*tnode{obs[0], obs[1], n3}, netA, want, 10*time.Second)
		for _, o := range obs {
			o.c.mu.Lock()
			m := o.c.st.members["n3"]
			marked, epoch := m.restarting != 0, m.epoch
			o.c.mu.Unlock()
			if marked || epoch != n3.c.epoch {
				t.Errorf("%s: n3 at epoch %d (want %d), mark kept %v", o.name, epoch, n3.c.epoch, marked)
			}
			(&delegate{o.c}).NotifyMsg(encodeRestart(3, "n3", oldEpoch))
			if s := o.c.Stats(); s.RestartsReceived != 2 {
				t.Errorf("%s received %d announcements, want 2", o.name, s.RestartsReceived)
			}
		}
		stopped := time.Now()
		n3.crash()
		waitFor(t, 20*time.Second, "the new n3's endpoint removed after the dead grace", func() error {
			return converged(obs, netA, map[string]ep{})
		})
		if took := time.Since(stopped); took > 15*time.Second || took < 2*time.Second {
			t.Errorf("removed %v after the crash, want the dead grace of 2s after it was seen (the stale announcement or the old mark counted?)", took)
		}
		for _, o := range obs {
			if m := memberOf(o.c, "n3"); m.State != MemberPurged {
				t.Errorf("%s lists n3 %q", o.name, m.State)
			}
		}
	})
}

// A gone member named by its IP is not pinged by address: memberlist's
// nameless Ping looks the address up as a node name and reads that node
// unlocked, racing with its coming back alive (seen under -race in
// cmd's TestRestartKeepsEncryptedNetwork). The rejoin round reaches it.
func TestGoneMemberNamedByItsIPIsNotPinged(t *testing.T) {
	c := &Cluster{st: newState("self", netip.MustParseAddr("192.0.2.1"), 1, time.Minute, time.Minute, slog.New(slog.DiscardHandler)),
		cands: map[string]*candidate{}, selfAddr: "192.0.2.1:7947"}
	named := netip.MustParseAddrPort("192.0.2.2:7947")
	other := netip.MustParseAddrPort("192.0.2.3:7947")
	now := time.Now()
	for name, a := range map[string]netip.AddrPort{"192.0.2.2": named, "host3-192.0.2.3": other} {
		c.st.memberUp(name, a, nil, now)
		c.st.memberDown(name, now)
		c.cands[a.String()] = &candidate{kinds: candSeen}
	}
	if got := c.goneCandidates(); len(got) != 1 || got[0] != other {
		t.Fatalf("candidates %v, want only %v", got, other)
	}
}
