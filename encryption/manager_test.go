package encryption_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/encryption/fakexfrm"
	"github.com/overlay-plugin/overlay-plugin/firewall/firewalltest"
	"github.com/overlay-plugin/overlay-plugin/internal/countmap"
)

// clock is a settable time source shared by a test's managers.
type clock struct {
	// mu guards t. Leaf lock.
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// host is one node: a manager with its fake kernel and its published keys,
// which the test's gossip carries to the other hosts.
type host struct {
	m    *encryption.Manager
	x    *fakexfrm.XFRM
	fw   *firewalltest.Fake
	addr netip.Addr

	// mu guards pub. Leaf lock, taken under the manager's mutex.
	mu  sync.Mutex
	pub []encryption.PublicKey
}

func newHost(t *testing.T, addr string, now func() time.Time) *host {
	t.Helper()
	h := &host{x: fakexfrm.New(), fw: firewalltest.New(), addr: netip.MustParseAddr(addr)}
	h.start(t, now, nil)
	return h
}

// start runs a new manager on h's kernel, resuming the keys if any.
func (h *host) start(t *testing.T, now func() time.Time, resume []encryption.PublicKey) {
	t.Helper()
	m, err := encryption.NewManager(encryption.Config{XFRM: h.x, Firewall: h.fw, Salts: encryption.TestSalts, Local: h.addr, Port: 4789,
		Schedule: encryption.TestSchedule, Now: now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Publish: func(k []encryption.PublicKey) { h.mu.Lock(); h.pub = k; h.mu.Unlock() }, Resume: resume})
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
}

// restart stops h's manager as the plugin's stop does and starts one that
// takes its state over, as the next run does.
func (h *host) restart(t *testing.T, now func() time.Time) {
	t.Helper()
	old := h.published()
	h.m.Detach()
	h.start(t, now, old)
	if !h.m.Resumed() {
		t.Fatal("the new manager did not take over")
	}
}

func (h *host) published() []encryption.PublicKey { h.mu.Lock(); defer h.mu.Unlock(); return h.pub }

// gossip delivers every host's current keys to every other host.
func gossip(t *testing.T, hosts ...*host) {
	t.Helper()
	for _, from := range hosts {
		for _, to := range hosts {
			if from != to {
				if err := to.m.SetPeerKeys(from.addr, from.published()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// mesh gives every host a reference on every other, as one encrypted
// network across them does.
func mesh(t *testing.T, hosts ...*host) {
	t.Helper()
	for _, h := range hosts {
		for _, o := range hosts {
			if h != o {
				if err := h.m.AddRemote(o.addr); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// tick advances every host's manager to the clock's time.
func tick(t *testing.T, hosts ...*host) {
	t.Helper()
	for _, h := range hosts {
		if err := h.m.Tick(); err != nil {
			t.Fatal(err)
		}
	}
}

// checkPath verifies that traffic from a to b would be encrypted with an SA
// b can decrypt: a's policy names an SA a holds, and b holds the same SPI
// with the same key.
func checkPath(t *testing.T, a, b *host) {
	t.Helper()
	pols, err := a.x.Policies()
	if err != nil {
		t.Fatal(err)
	}
	var spi uint32
	found := false
	for _, p := range pols {
		if p.Dst == b.addr {
			spi, found = p.SPI, true
		}
	}
	if !found || spi == 0 {
		t.Fatalf("%s→%s: no usable outbound policy (found=%v spi=%#x)", a.addr, b.addr, found, spi)
	}
	out, ok := a.x.Key(b.addr, spi)
	if !ok {
		t.Fatalf("%s→%s: policy SPI %#x has no SA at the sender", a.addr, b.addr, spi)
	}
	in, ok := b.x.Key(b.addr, spi)
	if !ok {
		t.Fatalf("%s→%s: SPI %#x has no inbound SA at the receiver: packets would be lost", a.addr, b.addr, spi)
	}
	if !bytes.Equal(in, out) {
		t.Fatalf("%s→%s: sender and receiver keys differ for SPI %#x", a.addr, b.addr, spi)
	}
}

func TestTwoHostsAgreeAndBlockUntilKeysKnown(t *testing.T) {
	c := &clock{t: encryption.TestT0}
	a := newHost(t, "198.51.100.1", c.now)
	b := newHost(t, "198.51.100.2", c.now)
	if err := a.m.AddRemote(b.addr); err != nil {
		t.Fatal(err)
	}
	// b's keys are unknown: traffic is blocked, not sent in clear.
	pols, _ := a.x.Policies()
	if len(pols) != 1 || pols[0].SPI != 0 {
		t.Fatalf("want one blocking policy before keys are known, got %+v", pols)
	}
	if err := b.m.AddRemote(a.addr); err != nil {
		t.Fatal(err)
	}
	gossip(t, a, b)
	checkPath(t, a, b)
	checkPath(t, b, a)
}

// twoHosts starts hosts a and b, each with a reference on the other.
func twoHosts(t *testing.T, c *clock) (a, b *host) {
	t.Helper()
	a = newHost(t, "198.51.100.1", c.now)
	b = newHost(t, "198.51.100.2", c.now)
	for _, h := range []struct{ from, to *host }{{a, b}, {b, a}} {
		if err := h.from.m.AddRemote(h.to.addr); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

// TestReprogramsStateLostFromOutside: a policy removed behind the
// manager's back is back after the next tick, as are inbound SAs; a lost
// outbound SA blocks its traffic and starts a new generation, whose fresh
// SAs take over once it activates (the old one, installed again, would
// restart its sequence numbers inside the receiver's replay window).
func TestReprogramsStateLostFromOutside(t *testing.T) {
	c := &clock{t: encryption.TestT0}
	a, b := twoHosts(t, c)
	gossip(t, a, b)
	checkPath(t, a, b)
	outSPI := func() uint32 {
		pols, _ := a.x.Policies()
		if len(pols) != 1 {
			t.Fatalf("a's policies: %+v", pols)
		}
		return pols[0].SPI
	}
	before := outSPI()
	if err := a.x.DeletePolicy(a.addr, b.addr, 4789); err != nil {
		t.Fatal(err)
	}
	if err := a.m.Tick(); err != nil {
		t.Fatal(err)
	}
	checkPath(t, a, b)
	if n := len(a.published()); n != 1 || outSPI() != before {
		t.Fatalf("a lost policy: %d generations published, policy SPI %#x (was %#x); want it back as it was", n, outSPI(), before)
	}
	if err := a.x.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := a.m.Tick(); err != nil {
		t.Fatal(err)
	}
	if n := len(a.published()); n != 2 {
		t.Fatalf("after its outbound SA was lost, a publishes %d generations, want a new one", n)
	}
	if spi := outSPI(); spi != 0 {
		t.Fatalf("after its outbound SA was lost, a sends with SA %#x; want a blocking policy until the new generation activates", spi)
	}
	checkPath(t, b, a) // inbound SAs are back at once
	gossip(t, a, b)
	c.add(encryption.TestSchedule.Lead)
	tick(t, a, b)
	checkPath(t, a, b)
	checkPath(t, b, a)
	if outSPI() == before {
		t.Fatalf("a still sends with SA %#x, installed anew after the flush", before)
	}
}

func TestRefcountsAcrossNetworks(t *testing.T) {
	c := &clock{t: encryption.TestT0}
	a := newHost(t, "198.51.100.1", c.now)
	b := newHost(t, "198.51.100.2", c.now)
	gossip(t, a, b)
	for range 2 { // two networks reach b
		if err := a.m.AddRemote(b.addr); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.m.RemoveRemote(b.addr); err != nil {
		t.Fatal(err)
	}
	if pols, _ := a.x.Policies(); len(pols) != 1 {
		t.Fatal("state removed while another network still reaches the host")
	}
	if err := a.m.RemoveRemote(b.addr); err != nil {
		t.Fatal(err)
	}
	if pols, _ := a.x.Policies(); len(pols) != 0 {
		t.Fatalf("policy left after the last reference: %+v", pols)
	}
	if err := a.m.RemoveRemote(b.addr); err != nil { // extra removes are harmless
		t.Fatal(err)
	}
	c.add(encryption.Linger)
	if err := a.m.Tick(); err != nil {
		t.Fatal(err)
	}
	if states, _ := a.x.States(); len(states) != 0 {
		t.Fatalf("SAs left %v after the last reference: %+v", encryption.Linger, states)
	}
}

// TestReferenceBackWithinLinger: a host's last reference goes and comes
// back (its only container restarted). The peer may never have seen it go
// and still holds the inbound SA with its replay window, so the outbound
// SA is the same instance, its sequence numbers going on, not installed
// again from 1; the counters the fake keeps per instance tell.
func TestReferenceBackWithinLinger(t *testing.T) {
	c := &clock{t: encryption.TestT0}
	a, b := twoHosts(t, c)
	gossip(t, a, b)
	checkPath(t, a, b)
	pols, _ := a.x.Policies()
	spi := pols[0].SPI
	if !a.x.Count(b.addr, spi, 1000, 100000) {
		t.Fatalf("no outbound SA %#x", spi)
	}
	if err := a.m.RemoveRemote(b.addr); err != nil {
		t.Fatal(err)
	}
	if pols, _ := a.x.Policies(); len(pols) != 0 {
		t.Fatalf("policy left without references: %+v", pols)
	}
	st := a.m.Status()
	if len(st.Remotes) != 1 || st.Remotes[0].Refs != 0 || st.Remotes[0].PolicySPI != 0 || st.Remotes[0].SAs != 2 {
		t.Fatalf("status without references: %+v; want no policy, the two SAs kept", st.Remotes)
	}
	c.add(encryption.Linger - time.Second)
	if err := a.m.Tick(); err != nil {
		t.Fatal(err)
	}
	if err := a.m.AddRemote(b.addr); err != nil {
		t.Fatal(err)
	}
	checkPath(t, a, b)
	states, _ := a.x.States()
	i := slices.IndexFunc(states, func(s encryption.StateInfo) bool { return s.SPI == spi })
	if i < 0 || states[i].Packets != 1000 {
		t.Fatalf("outbound SA %#x after the reference came back: %+v; want the same instance, 1000 packets counted", spi, states)
	}
}

func TestVNIFirewallRefcount(t *testing.T) {
	c := &clock{t: encryption.TestT0}
	a := newHost(t, "198.51.100.1", c.now)
	for range 2 {
		if err := a.m.EnableVNI(300); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.m.DisableVNI(300); err != nil {
		t.Fatal(err)
	}
	if !a.fw.Enabled(300) {
		t.Fatal("firewall rule removed while still used")
	}
	if err := a.m.DisableVNI(300); err != nil {
		t.Fatal(err)
	}
	if a.fw.Enabled(300) {
		t.Fatal("firewall rule kept after the last user")
	}
}

func TestUnsupportedKernel(t *testing.T) {
	x := fakexfrm.New()
	x.CheckErr = fakexfrm.NoESPError()
	m, err := encryption.NewManager(encryption.Config{XFRM: x, Firewall: firewalltest.New(), Salts: encryption.TestSalts,
		Local: encryption.TestHostA, Port: 4789, Schedule: encryption.TestSchedule, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.EnableVNI(300); !errors.Is(err, encryption.ErrNoESP) {
		t.Fatalf("EnableVNI on a kernel without ESP: %v", err)
	}
}

// TestRotationNeverLosesAPacket walks three hosts through several
// rotations with gossip lagging one step and clocks skewed, checking after
// every step that each direction's outbound SA exists at the receiver with
// the same key.
func TestRotationNeverLosesAPacket(t *testing.T) {
	s := encryption.TestSchedule
	clocks := []*clock{{t: encryption.TestT0}, {t: encryption.TestT0.Add(20 * time.Second)}, {t: encryption.TestT0.Add(-20 * time.Second)}}
	hosts := []*host{
		newHost(t, "198.51.100.1", clocks[0].now),
		newHost(t, "198.51.100.2", clocks[1].now),
		newHost(t, "198.51.100.3", clocks[2].now),
	}
	mesh(t, hosts...)
	gossip(t, hosts...)
	step := 10 * time.Second
	gens := map[uint64]bool{}
	for i := time.Duration(0); i < 4*s.Interval; i += step {
		for j, h := range hosts {
			clocks[j].add(step)
			if err := h.m.Tick(); err != nil {
				t.Fatal(err)
			}
			for _, k := range h.published() {
				gens[k.Gen] = true
			}
		}
		for _, a := range hosts {
			for _, b := range hosts {
				if a != b {
					checkPath(t, a, b)
				}
			}
		}
		gossip(t, hosts...) // arrives one step late
	}
	if len(gens) < 3*4 {
		t.Fatalf("only %d generations in 4 intervals on 3 hosts: rotation did not run", len(gens))
	}
	// Retired generations leave no SA behind: each host holds inbound SAs
	// for at most 2 own × 2 peer generations per peer, plus outbound.
	for _, h := range hosts {
		states, _ := h.x.States()
		if len(states) > 2*(4+1) {
			t.Errorf("%s holds %d SAs: retired ones are not removed", h.addr, len(states))
		}
	}
}

func TestForcedRotationSwitchesAfterLead(t *testing.T) {
	s := encryption.TestSchedule
	c := &clock{t: encryption.TestT0}
	a := newHost(t, "198.51.100.1", c.now)
	b := newHost(t, "198.51.100.2", c.now)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(a.m.AddRemote(b.addr))
	must(b.m.AddRemote(a.addr))
	gossip(t, a, b)
	pol := func() uint32 { p, _ := a.x.Policies(); return p[0].SPI }
	before := pol()
	must(a.m.Rotate())
	gossip(t, a, b)
	if pol() != before {
		t.Fatal("sender switched before the new generation's lead time")
	}
	checkPath(t, a, b)
	c.add(s.Lead)
	must(a.m.Tick())
	must(b.m.Tick())
	if pol() == before {
		t.Fatal("sender did not switch after the lead time")
	}
	checkPath(t, a, b)
	checkPath(t, b, a)
}

// TestConcurrentRotationAndPeers races rotation, ticks, key updates and
// remote add/remove under -race, then checks that the fake kernel holds
// exactly what the refcounts imply.
func TestConcurrentRotationAndPeers(t *testing.T) {
	c := &clock{t: encryption.TestT0}
	a := newHost(t, "198.51.100.1", c.now)
	peers := make([]*host, 4)
	for i := range peers {
		peers[i] = newHost(t, fmt.Sprintf("198.51.100.%d", 10+i), c.now)
	}
	gossip(t, append([]*host{a}, peers...)...)
	var refsMu sync.Mutex
	refs := countmap.Map[netip.Addr]{}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range 300 {
				p := peers[r.IntN(len(peers))]
				switch r.IntN(6) {
				case 0, 1:
					refsMu.Lock()
					refs.Add(p.addr, 1)
					err := a.m.AddRemote(p.addr)
					refsMu.Unlock()
					if err != nil {
						t.Error(err)
					}
				case 2:
					refsMu.Lock()
					if refs[p.addr] > 0 {
						refs.Add(p.addr, -1)
						if err := a.m.RemoveRemote(p.addr); err != nil {
							t.Error(err)
						}
					}
					refsMu.Unlock()
				case 3:
					if r.IntN(10) == 0 {
						_ = p.m.Rotate()
					}
					_ = a.m.SetPeerKeys(p.addr, p.published())
				case 4:
					c.add(time.Second)
					_ = a.m.Tick()
				case 5:
					if r.IntN(20) == 0 {
						_ = a.m.Rotate()
					}
				}
			}
		})
	}
	wg.Wait()
	// Settle: everyone learns everyone's latest keys.
	for _, p := range peers {
		if err := p.m.SetPeerKeys(a.addr, a.published()); err != nil {
			t.Fatal(err)
		}
		if err := a.m.SetPeerKeys(p.addr, p.published()); err != nil {
			t.Fatal(err)
		}
	}
	pols, _ := a.x.Policies()
	polBy := map[netip.Addr]uint32{}
	for _, p := range pols {
		polBy[p.Dst] = p.SPI
	}
	states, _ := a.x.States()
	for _, p := range peers {
		if refs[p.addr] == 0 {
			if _, ok := polBy[p.addr]; ok {
				t.Errorf("policy to unreferenced %s", p.addr)
			}
			for _, s := range states {
				if s.Src == p.addr || s.Dst == p.addr {
					t.Errorf("SA %+v for unreferenced %s", s, p.addr)
				}
			}
			continue
		}
		if err := p.m.AddRemote(a.addr); err != nil {
			t.Fatal(err)
		}
		checkPath(t, a, p)
	}
}

// TestResumeTakesOverLosslessly restarts a's manager on the same kernel
// the way the plugin does across `docker plugin disable`/`enable`: the
// old one detaches, the new one resumes its published keys. At every step
// each direction has an SA both ends agree on: the inherited ones until
// a's fresh generation activates, Lead after b reached it; Grace later the
// inherited SAs are gone, and so is the previous run's firewall table,
// which no encrypted sandbox claimed again.
func TestResumeTakesOverLosslessly(t *testing.T) {
	c := &clock{t: encryption.TestT0}
	a, b := twoHosts(t, c)
	if err := a.m.EnableVNI(256); err != nil {
		t.Fatal(err)
	}
	gossip(t, a, b)
	both := func(step string) {
		t.Helper()
		t.Log(step)
		checkPath(t, a, b)
		checkPath(t, b, a)
	}
	both("before the restart")
	kernel, _ := a.x.States()
	old := a.published()

	a.restart(t, c.now)
	m := a.m
	if got, _ := a.x.States(); !slices.EqualFunc(got, kernel, func(x, y encryption.StateInfo) bool { return x.SPI == y.SPI }) {
		t.Fatalf("taking over changed the kernel's SAs: %+v, was %+v", got, kernel)
	}
	if pub := a.published(); !slices.EqualFunc(pub, old, func(x, y encryption.PublicKey) bool { return x.Gen == y.Gen }) {
		t.Fatalf("resumed keys %+v; want the old generations only until a peer is back, %+v", pub, old)
	}
	if err := m.Tick(); err != nil {
		t.Fatal(err)
	}
	both("after the restart, before the driver has its peers back")
	if err := m.AddRemote(b.addr); err != nil {
		t.Fatal(err)
	}
	gossip(t, a, b)
	gossip(t, a, b)
	both("peers and keys known again")
	if pub := a.published(); len(pub) != 2 || pub[0].Gen != old[0].Gen || !pub[1].ActivateAt.Equal(encryption.TestT0.Add(encryption.TestSchedule.Lead)) {
		t.Fatalf("keys once the peer is back %+v; want the old generation, then a new one activating after Lead", pub)
	}

	c.add(encryption.TestSchedule.Lead)
	tick(t, a, b)
	both("the new generation active")
	if !a.fw.Enabled(256) {
		t.Fatal("the previous run's firewall table went while its generation lives")
	}

	c.add(encryption.TestSchedule.Grace)
	tick(t, a, b)
	gossip(t, a, b)
	both("the inherited generation retired")
	now, _ := a.x.States()
	for _, st := range now {
		if slices.ContainsFunc(kernel, func(k encryption.StateInfo) bool { return k.SPI == st.SPI }) {
			t.Errorf("inherited SA %#x still installed after its generation retired", st.SPI)
		}
	}
	if len(a.published()) != 1 || len(a.fw.VNIs()) != 0 {
		t.Fatalf("after the window: %d generations published, firewall VNIs %v", len(a.published()), a.fw.VNIs())
	}
}

// TestResumedRunReachedLate: peers re-join a restarted node only after a
// while (every 10 s), possibly later than Lead. The resumed run starts its
// own generation only when the first peer's keys arrive, so whichever side
// hears of the other first, no sender switches to an SA its receiver lacks.
func TestResumedRunReachedLate(t *testing.T) {
	for _, first := range []string{"the peer's keys reach the resumed run", "the resumed run's keys reach the peer"} {
		t.Run(first, func(t *testing.T) {
			c := &clock{t: encryption.TestT0}
			a, b := twoHosts(t, c)
			gossip(t, a, b)
			old := a.published()
			a.restart(t, c.now)
			if err := a.m.AddRemote(b.addr); err != nil {
				t.Fatal(err)
			}
			step := func(what string, deliver func()) {
				t.Helper()
				t.Log(what)
				deliver()
				checkPath(t, a, b)
				checkPath(t, b, a)
			}
			step("cut off for longer than Lead", func() { c.add(encryption.TestSchedule.Lead + time.Second); tick(t, a, b) })
			deliver := func(to, from *host) func() {
				return func() {
					if err := to.m.SetPeerKeys(from.addr, from.published()); err != nil {
						t.Fatal(err)
					}
				}
			}
			toA, toB := deliver(a, b), deliver(b, a)
			if first == "the peer's keys reach the resumed run" {
				step(first, toA)
				step("then the other way", toB)
			} else {
				step(first, toB)
				step("then the other way", toA)
				step("the new generation follows", toB)
			}
			step("the new generation active", func() { c.add(encryption.TestSchedule.Lead); tick(t, a, b) })
			step("the inherited one retired", func() { c.add(encryption.TestSchedule.Grace); tick(t, a, b); gossip(t, a, b) })
			if pub := a.published(); len(pub) != 1 || pub[0].Gen == old[len(old)-1].Gen {
				t.Fatalf("a's generations at the end %+v; want only this run's", pub)
			}
		})
	}
}

// TestPeerRotatesWhileResuming: a peer's scheduled generation activates
// while a restarted node still receives on inherited SAs only. The peer
// keeps the SA it uses until the restarted node's own generation is
// active: one pairing its new generation with the inherited one would
// meet no inbound SA.
func TestPeerRotatesWhileResuming(t *testing.T) {
	c := &clock{t: encryption.TestT0}
	a, b := twoHosts(t, c)
	gossip(t, a, b)
	a.restart(t, c.now)
	if err := a.m.AddRemote(b.addr); err != nil {
		t.Fatal(err)
	}
	lead := encryption.TestSchedule.Lead
	step := func(what string, fn func()) {
		t.Helper()
		t.Log(what)
		fn()
		tick(t, a, b)
		checkPath(t, a, b)
		checkPath(t, b, a)
	}
	step("b starts a generation while a is cut off", func() {
		if err := b.m.Rotate(); err != nil {
			t.Fatal(err)
		}
	})
	step("the peers reach each other", func() { c.add(lead / 2); gossip(t, a, b); gossip(t, a, b) })
	step("b's generation active, a's not yet", func() { c.add(lead/2 + time.Second) })
	step("a's generation active", func() { c.add(lead / 2) })
	step("the old generations retired", func() { c.add(encryption.TestSchedule.Grace); gossip(t, a, b) })
}

// TestNewPeerOfResumedNodeWaits: a node the resumed run's predecessor
// never knew cannot reach it on inherited keys; it blocks instead of
// sending what nobody can decrypt, and both paths work once the resumed
// run's own generation is active.
func TestNewPeerOfResumedNodeWaits(t *testing.T) {
	c := &clock{t: encryption.TestT0}
	a := newHost(t, "198.51.100.1", c.now)
	a.restart(t, c.now)
	n := newHost(t, "198.51.100.3", c.now)
	for _, h := range []struct{ from, to *host }{{a, n}, {n, a}} {
		if err := h.from.m.AddRemote(h.to.addr); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.m.SetPeerKeys(a.addr, a.published()); err != nil {
		t.Fatal(err)
	}
	if pols, _ := n.x.Policies(); len(pols) != 1 || pols[0].SPI != 0 {
		t.Fatalf("towards a resumed node's inherited keys: policies %+v, want one blocking", pols)
	}
	gossip(t, a, n)
	gossip(t, a, n)
	c.add(encryption.TestSchedule.Lead)
	tick(t, a, n)
	checkPath(t, a, n)
	checkPath(t, n, a)
}

// blockingStates is a kernel whose SA dump hangs until released, as a dump
// of many SAs on a busy host takes its time.
type blockingStates struct {
	*fakexfrm.XFRM
	entered, release chan struct{}
}

func (b blockingStates) States() ([]encryption.StateInfo, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.XFRM.States()
}

// A metrics scrape (Status) reading the kernel does not hold the
// encryption mutex: peers are programmed meanwhile.
func TestStatusDoesNotBlockProgramming(t *testing.T) {
	x := blockingStates{fakexfrm.New(), make(chan struct{}), make(chan struct{})}
	m, err := encryption.NewManager(encryption.Config{XFRM: x, Firewall: firewalltest.New(), Salts: encryption.TestSalts,
		Local: netip.MustParseAddr("198.51.100.1"), Port: 4789, Schedule: encryption.TestSchedule,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan encryption.Status)
	go func() { done <- m.Status() }()
	<-x.entered
	programmed := make(chan error)
	go func() { programmed <- m.AddRemote(netip.MustParseAddr("198.51.100.2")) }()
	select {
	case err := <-programmed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("AddRemote waited for Status's kernel dump")
	}
	close(x.release)
	<-done
}
