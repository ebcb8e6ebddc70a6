package encrypted

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// 4. Forced rotation under continuous traffic.

// steady reports whether every host has one generation of its own, knows
// exactly one of every other host, and holds exactly an inbound and an
// outbound SA per remote.
func (s *suite) steady() (map[*testbed.Node]encryption.Status, error) {
	out := map[*testbed.Node]encryption.Status{}
	for _, n := range s.Nodes {
		st, err := n.Plugin.EncryptionStatus()
		if err != nil {
			return nil, err
		}
		if len(st.Own) != 1 {
			return nil, fmt.Errorf("%s: %d own generations", n.Name, len(st.Own))
		}
		for _, o := range s.Others(n) {
			r := testbed.RemoteOf(st, o.Underlay)
			if r == nil || len(r.Generations) != 1 || r.Refs != 1 || r.Blocked || r.PolicySPI == 0 {
				return nil, fmt.Errorf("%s: remote %s: %+v", n.Name, o.Name, r)
			}
		}
		if len(st.States) != 2*len(s.Others(n)) {
			return nil, fmt.Errorf("%s: %d SAs", n.Name, len(st.States))
		}
		out[n] = st
	}
	// Everyone agrees on everyone's generation.
	for _, n := range s.Nodes {
		for _, o := range s.Others(n) {
			if g := testbed.RemoteOf(out[n], o.Underlay).Generations[0].Gen; g != out[o].Own[0].Gen {
				return nil, fmt.Errorf("%s knows generation %d of %s, which has %d", n.Name, g, o.Name, out[o].Own[0].Gen)
			}
		}
	}
	return out, nil
}

// quietSchedule waits until the hosts are steady and no scheduled
// generation is due within margin, and returns their status. A scheduled
// rotation due sooner, or in progress, is waited out (in the rotation
// phase under the running streams, whose loss check then covers it too).
// A new generation switches no SA before it activates, Lead after it is
// due, so margin plus Lead is the time without SA changes.
func (s *suite) quietSchedule(t *testing.T, margin time.Duration) map[*testbed.Node]encryption.Status {
	t.Helper()
	deadline := time.Now().Add(keyRotation + lead + grace + 60*time.Second)
	logged := false
	for {
		st, err := s.steady()
		if err == nil {
			next := s.nextDue(st)
			if time.Until(next) > margin {
				return st
			}
			t.Logf("a scheduled generation is due in %v: letting it complete first", time.Until(next).Round(time.Millisecond))
			time.Sleep(time.Until(next) + lead + grace)
		} else if !logged {
			t.Logf("waiting for a key rotation in progress to complete: %v", err)
			logged = true
		}
		if time.Now().After(deadline) {
			t.Fatalf("hosts not steady with no scheduled rotation due within %v: %v", margin, err)
		}
		time.Sleep(poll)
	}
}

// nextDue is when the first host of a steady cluster (one generation
// each) creates its next scheduled generation.
func (s *suite) nextDue(st map[*testbed.Node]encryption.Status) time.Time {
	var next time.Time
	for _, n := range s.Nodes {
		due := st[n].Own[0].ActivateAt.Add(keyRotation - lead)
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	return next
}

// startStreams starts the sequenced streams c1->c2 and c3->c1, waits
// until both echo, and returns what stops them and tallies (once).
func (s *suite) startStreams(t *testing.T) (stopAll func() []streamResult) {
	t.Helper()
	c1, c2, c3 := s.ep("c1"), s.ep("c2"), s.ep("c3")
	var streams []*stream
	stopped := false
	stopAll = func() []streamResult {
		var rs []streamResult
		if !stopped {
			stopped = true
			for _, st := range streams {
				rs = append(rs, st.Stop(3*time.Second))
			}
		}
		return rs
	}
	for _, p := range [][2]*endpoint{{c1, c2}, {c3, c1}} {
		st, err := startStream(p[0].name+"->"+p[1].name, p[0].Ctr.Netns, p[1].Ctr.Netns,
			netip.AddrPortFrom(p[1].addr(testbed.IPv4), streamPort), streamEvery)
		if err != nil {
			stopAll()
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	if err := wait.Until(30*time.Second, poll, func() error {
		for _, st := range streams {
			if _, echoed := st.Progress(); echoed == 0 {
				return fmt.Errorf("stream %s: no echo yet", st.Name)
			}
		}
		return nil
	}); err != nil {
		stopAll()
		t.Fatalf("both streams echo: %v", err)
	}
	return stopAll
}

func (s *suite) phaseRotation(t *testing.T) {
	stopAll := s.startStreams(t)
	defer stopAll()

	// Margin: forcing the rotation on the three hosts takes a few process
	// starts; a scheduled generation created meanwhile would make three.
	// Reading the counters takes process starts too, which a loaded
	// emulator stretches past the margin: then the quiet window is
	// looked for again.
	var pre map[*testbed.Node]encryption.Status
	var counters0 ipsecCounters
	for {
		pre = s.quietSchedule(t, 10*time.Second)
		counters0 = s.readIPsecCounters(t)
		left := time.Until(s.nextDue(pre))
		if left > 5*time.Second {
			break
		}
		t.Logf("reading the counters left %v before a scheduled generation: waiting for it", left.Round(time.Millisecond))
	}
	s.preRotation = pre
	// A timeline of what each host programs, for diagnosing loss.
	lastPol := map[[2]*testbed.Node]uint32{}
	lastSAs := map[*testbed.Node]string{}
	for _, n := range s.Nodes {
		for _, o := range s.Others(n) {
			lastPol[[2]*testbed.Node{n, o}] = testbed.RemoteOf(pre[n], o.Underlay).PolicySPI
		}
		lastSAs[n] = saList(pre[n].States)
		t.Logf("%s before rotation: SAs %s", n.Name, lastSAs[n])
	}
	var rotateStart time.Time
	rotated := map[*testbed.Node]time.Time{}
	for i, n := range s.Nodes {
		if i == 0 {
			rotateStart = time.Now()
		}
		out, err := s.cli(n, "rotate-keys")
		if err != nil {
			t.Fatalf("%s: overlay-plugin rotate-keys: %v", n.Name, err)
		}
		rotated[n] = time.Now()
		if !strings.Contains(out, "new key generation") {
			t.Errorf("%s: rotate-keys printed %q", n.Name, out)
		}
	}
	t.Logf("rotate-keys on 3 hosts took %v", time.Since(rotateStart).Round(time.Millisecond))

	// Watch every host until its new generation is the only one left and
	// every host uses it: own generations 1 -> 2 -> 1, policy SPIs changed.
	counts := map[*testbed.Node][]int{}
	for _, n := range s.Nodes {
		counts[n] = []int{len(pre[n].Own)}
	}
	newGen := map[*testbed.Node]encryption.PublicKeyInfo{}
	var post map[*testbed.Node]encryption.Status
	deadline := time.Now().Add(lead + grace + 90*time.Second)
	for {
		all := map[*testbed.Node]encryption.Status{}
		for _, n := range s.Nodes {
			st, err := n.Plugin.EncryptionStatus()
			if err != nil {
				t.Fatal(err)
			}
			all[n] = st
			c := len(st.Own)
			if h := counts[n]; len(h) == 0 || h[len(h)-1] != c {
				counts[n] = append(counts[n], c)
				t.Logf("%s: %d own generation(s) at rotate+%v: %+v", n.Name, c, time.Since(rotated[n]).Round(time.Millisecond), st.Own)
			}
			for _, o := range s.Others(n) {
				if r := testbed.RemoteOf(st, o.Underlay); r != nil && r.PolicySPI != lastPol[[2]*testbed.Node{n, o}] {
					t.Logf("%s: %s policy towards %s %#x -> %#x (blocked %v)", time.Now().Format("15:04:05.000"), n.Name, o.Name, lastPol[[2]*testbed.Node{n, o}], r.PolicySPI, r.Blocked)
					lastPol[[2]*testbed.Node{n, o}] = r.PolicySPI
				}
			}
			if l := saList(st.States); l != lastSAs[n] {
				t.Logf("%s: %s SAs %s", time.Now().Format("15:04:05.000"), n.Name, l)
				lastSAs[n] = l
			}
			if c == 2 && newGen[n].Gen == 0 {
				newGen[n] = st.Own[1]
			}
			if c > 2 {
				t.Fatalf("%s: %d own generations %+v: a scheduled rotation overlapped the forced one", n.Name, c, st.Own)
			}
		}
		done := true
		for _, n := range s.Nodes {
			st := all[n]
			if newGen[n].Gen == 0 || len(st.Own) != 1 || st.Own[0].Gen != newGen[n].Gen {
				done = false
				break
			}
			for _, o := range s.Others(n) {
				r := testbed.RemoteOf(st, o.Underlay)
				if r == nil || len(r.Generations) != 1 || r.Generations[0].Gen != newGen[o].Gen || r.Blocked || r.PolicySPI == 0 ||
					r.PolicySPI == testbed.RemoteOf(pre[n], o.Underlay).PolicySPI {
					done = false
				}
			}
			if len(st.States) != 2*len(s.Others(n)) {
				done = false
			}
		}
		if done {
			post = all
			break
		}
		if time.Now().After(deadline) {
			for _, n := range s.Nodes {
				t.Logf("%s: %s", n.Name, testbed.DumpStatus(all[n]))
			}
			t.Fatalf("rotation did not complete within %v of rotate-keys: own generation counts %v", lead+grace+90*time.Second, counts)
		}
		time.Sleep(poll)
	}
	t.Logf("rotation complete on every host %v after the first rotate-keys", time.Since(rotateStart).Round(time.Millisecond))
	for _, n := range s.Nodes {
		if !slices.Equal(counts[n], []int{1, 2, 1}) {
			t.Errorf("%s: own generation counts went %v, want [1 2 1]", n.Name, counts[n])
		}
		// The new generation activates Lead after it was published.
		act := newGen[n].ActivateAt
		lo, hi := rotateStart.Add(lead-time.Second), rotated[n].Add(lead+time.Second)
		if act.Before(lo) || act.After(hi) {
			t.Errorf("%s: new generation activates at %v, want rotate-keys + %v (between %v and %v)", n.Name, act, lead, lo, hi)
		}
		for _, o := range s.Others(n) {
			t.Logf("%s: policy SPI towards %s %#x -> %#x", n.Name, o.Name,
				testbed.RemoteOf(pre[n], o.Underlay).PolicySPI, testbed.RemoteOf(post[n], o.Underlay).PolicySPI)
		}
	}
	s.postRotation = post
	s.newGen = map[*testbed.Node]uint64{}
	for n, g := range newGen {
		s.newGen[n] = g.Gen
	}

	// A little traffic on the new SAs only, then the tally.
	time.Sleep(2 * time.Second)
	for _, r := range stopAll() {
		t.Logf("%s", r)
		if !r.Lossless() {
			t.Errorf("packets lost or duplicated across the rotation: %s", r)
		}
	}
	s.checkNoIPsecErrors(t, counters0, "the rotation")
}

// ipsecCounters are each host's xfrm_stat error counters and nft
// plaintext drops at one moment.
type ipsecCounters struct {
	stat map[*testbed.Node]map[string]uint64
	drop map[*testbed.Node]uint64
}

func (s *suite) readIPsecCounters(t *testing.T) ipsecCounters {
	t.Helper()
	c := ipsecCounters{stat: map[*testbed.Node]map[string]uint64{}, drop: map[*testbed.Node]uint64{}}
	for _, n := range s.Nodes {
		var err error
		if c.stat[n], err = xfrmStat(n.NS); err != nil {
			t.Fatal(err)
		}
		if c.drop[n], err = nftCounter(n.NS, "input"); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// checkNoIPsecErrors fails the test if any host counted an IPsec error
// or dropped plaintext since before.
func (s *suite) checkNoIPsecErrors(t *testing.T, before ipsecCounters, during string) {
	t.Helper()
	now := s.readIPsecCounters(t)
	for _, n := range s.Nodes {
		d, drops := statDelta(before.stat[n], now.stat[n]), now.drop[n]-before.drop[n]
		t.Logf("%s during %s: xfrm_stat errors %v, nft plaintext drops +%d", n.Name, during, d, drops)
		if len(d) != 0 || drops != 0 {
			t.Errorf("%s: IPsec errors during %s: xfrm_stat %v, nft drops +%d", n.Name, during, d, drops)
		}
	}
}

// saList renders states compactly: src->dst:spi, sorted.
func saList(states []encryption.StateInfo) string {
	var l []string
	for _, x := range states {
		l = append(l, fmt.Sprintf("h%d->h%d:%08x", x.Src.As4()[3], x.Dst.As4()[3], x.SPI))
	}
	slices.Sort(l)
	return strings.Join(l, " ")
}
