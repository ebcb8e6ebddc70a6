package peerdb

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
)

func mac(b byte) hwaddr.MAC { return hwaddr.MAC{0x02, 0, 0, 0, 0, b} }

func ips(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func remote(id, vtep string, m byte, addrs ...string) Peer {
	return Peer{EndpointID: id, IPs: ips(addrs...), MAC: mac(m), VTEP: netip.MustParseAddr(vtep)}
}

func local(id string, m byte, addrs ...string) Peer {
	return Peer{EndpointID: id, IPs: ips(addrs...), MAC: mac(m), Local: true}
}

func bind(p Peer) *Binding {
	b := Binding{EndpointID: p.EndpointID, MAC: p.MAC, VTEP: p.VTEP, Local: p.Local}
	if p.Local {
		b.VTEP = netip.Addr{}
	}
	return &b
}

func mustAdd(t *testing.T, db *DB, p Peer) []Change {
	t.Helper()
	ch, err := db.Add(p)
	if err != nil {
		t.Fatalf("Add(%+v): %v", p, err)
	}
	return ch
}

func fmtBinding(b *Binding) string {
	if b == nil {
		return "<nil>"
	}
	return fmt.Sprintf("{%s %s %v local=%v}", b.EndpointID, b.MAC, b.VTEP, b.Local)
}

func fmtChanges(cs []Change) string {
	var sb strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&sb, "\n\t%v: %s -> %s", c.IP, fmtBinding(c.Old), fmtBinding(c.New))
	}
	return sb.String()
}

func sameBinding(a, b *Binding) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// wantChanges compares changes as a set keyed by IP: the order is not part
// of the contract.
func wantChanges(t *testing.T, got, want []Change) {
	t.Helper()
	byIP := func(a, b Change) int { return a.IP.Compare(b.IP) }
	got, want = slices.Clone(got), slices.Clone(want)
	slices.SortFunc(got, byIP)
	slices.SortFunc(want, byIP)
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].IP == want[i].IP && sameBinding(got[i].Old, want[i].Old) && sameBinding(got[i].New, want[i].New)
	}
	if !ok {
		t.Errorf("changes:%s\nwant:%s", fmtChanges(got), fmtChanges(want))
	}
}

func wantBindings(t *testing.T, db *DB, want map[netip.Addr]Binding) {
	t.Helper()
	got := db.Bindings()
	if !maps.Equal(got, want) {
		t.Errorf("Bindings() = %v, want %v", got, want)
	}
}

func TestValidate(t *testing.T) {
	good := remote("ep", "192.0.2.1", 1, "10.0.0.1")
	if err := good.Validate(); err != nil {
		t.Fatalf("valid remote peer: %v", err)
	}
	if err := local("ep", 1, "10.0.0.1").Validate(); err != nil {
		t.Fatalf("valid local peer without VTEP: %v", err)
	}
	bad := map[string]func(p *Peer){
		"empty id":                   func(p *Peer) { p.EndpointID = "" },
		"id with a dash":             func(p *Peer) { p.EndpointID = "0-forged" },
		"id with a slash":            func(p *Peer) { p.EndpointID = "../x" },
		"id with a non-ASCII letter": func(p *Peer) { p.EndpointID = "caf\u00e9" },
		"id with invalid UTF-8":      func(p *Peer) { p.EndpointID = "ab\xffcd" },
		"id of 129 characters":       func(p *Peer) { p.EndpointID = strings.Repeat("a", 129) },
		"no IPs":                     func(p *Peer) { p.IPs = nil },
		"empty IP slice":             func(p *Peer) { p.IPs = []netip.Addr{} },
		"invalid IP":                 func(p *Peer) { p.IPs = []netip.Addr{{}} },
		"unspecified IPv4":           func(p *Peer) { p.IPs = ips("0.0.0.0") },
		"unspecified IPv6":           func(p *Peer) { p.IPs = ips("::") },
		"one bad IP of two":          func(p *Peer) { p.IPs = ips("10.0.0.1", "0.0.0.0") },
		"multicast IP":               func(p *Peer) { p.IPs = ips("224.0.0.1") },
		"multicast IPv6":             func(p *Peer) { p.IPs = ips("ff02::1") },
		"zoned IP":                   func(p *Peer) { p.IPs = ips("fe80::1%eth0") },
		"zero MAC":                   func(p *Peer) { p.MAC = hwaddr.MAC{} },
		"multicast MAC":              func(p *Peer) { p.MAC = hwaddr.MAC{0x01, 0, 0x5e, 0, 0, 1} },
		"broadcast MAC":              func(p *Peer) { p.MAC = hwaddr.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} },
		"remote without VTEP":        func(p *Peer) { p.VTEP = netip.Addr{} },
		"unspecified VTEP":           func(p *Peer) { p.VTEP = netip.MustParseAddr("0.0.0.0") },
		"multicast VTEP":             func(p *Peer) { p.VTEP = netip.MustParseAddr("239.1.1.1") },
		"local with zero MAC":        func(p *Peer) { p.Local = true; p.VTEP = netip.Addr{}; p.MAC = hwaddr.MAC{} },
		"local with no IPs":          func(p *Peer) { p.Local = true; p.IPs = nil },
		"unspecified IPv6 too":       func(p *Peer) { p.IPs = ips("2001:db8::1", "::") },
	}
	for name, mutate := range bad {
		t.Run(name, func(t *testing.T) {
			p := good.Clone()
			mutate(&p)
			if err := p.Validate(); err == nil {
				t.Fatalf("Validate accepted %+v", p)
			}
			var db DB
			ch, err := db.Add(p)
			if err == nil || ch != nil || db.Len() != 0 || len(db.Bindings()) != 0 {
				t.Fatalf("Add of invalid peer: changes %v, err %v, len %d", ch, err, db.Len())
			}
		})
	}
}

func TestAddInvalidKeepsExisting(t *testing.T) {
	var db DB
	p := remote("ep", "192.0.2.1", 1, "10.0.0.1")
	mustAdd(t, &db, p)
	bad := p.Clone()
	bad.MAC = hwaddr.MAC{}
	if _, err := db.Add(bad); err == nil {
		t.Fatal("Add accepted a zero MAC")
	}
	if got, _ := db.Get("ep"); got.MAC != p.MAC {
		t.Errorf("invalid Add replaced the peer: %+v", got)
	}
}

func TestZeroValue(t *testing.T) {
	var db DB
	if db.Len() != 0 || len(db.Peers()) != 0 || len(db.Bindings()) != 0 {
		t.Error("zero DB not empty")
	}
	if ch := db.Delete("nope"); ch != nil {
		t.Errorf("Delete on zero DB: %v", ch)
	}
	if _, ok := db.Get("nope"); ok {
		t.Error("Get on zero DB found a peer")
	}
	if _, ok := db.Owner(netip.MustParseAddr("10.0.0.1")); ok {
		t.Error("Owner on zero DB found a binding")
	}
}

func TestAddNewRemote(t *testing.T) {
	var db DB
	p := remote("ep1", "192.0.2.1", 1, "10.0.0.1", "2001:db8::1")
	ch := mustAdd(t, &db, p)
	wantChanges(t, ch, []Change{
		{IP: netip.MustParseAddr("10.0.0.1"), New: bind(p)},
		{IP: netip.MustParseAddr("2001:db8::1"), New: bind(p)},
	})
	wantBindings(t, &db, map[netip.Addr]Binding{
		netip.MustParseAddr("10.0.0.1"):    *bind(p),
		netip.MustParseAddr("2001:db8::1"): *bind(p),
	})
	if b, ok := db.Owner(netip.MustParseAddr("2001:db8::1")); !ok || b != *bind(p) {
		t.Errorf("Owner = %+v, %v", b, ok)
	}
	if db.Len() != 1 {
		t.Errorf("Len = %d", db.Len())
	}

	// The same peer again changes nothing.
	if ch := mustAdd(t, &db, p); len(ch) != 0 {
		t.Errorf("re-Add: %s", fmtChanges(ch))
	}
	// Nor does the same peer with its IPs reordered and repeated.
	again := remote("ep1", "192.0.2.1", 1, "2001:db8::1", "10.0.0.1", "10.0.0.1")
	if ch := mustAdd(t, &db, again); len(ch) != 0 {
		t.Errorf("re-Add reordered: %s", fmtChanges(ch))
	}
}

func TestAddLocal(t *testing.T) {
	var db DB
	p := local("l", 9, "10.0.0.9")
	p.VTEP = netip.MustParseAddr("192.0.2.9") // ignored for a local peer
	ch := mustAdd(t, &db, p)
	want := &Binding{EndpointID: "l", MAC: mac(9), Local: true}
	wantChanges(t, ch, []Change{{IP: netip.MustParseAddr("10.0.0.9"), New: want}})
	if got, _ := db.Get("l"); got.VTEP.IsValid() {
		t.Errorf("local peer kept VTEP %v", got.VTEP)
	}
}

func TestUpdate(t *testing.T) {
	ip1, ip2, ip3 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::3")
	var db DB
	p := remote("ep", "192.0.2.1", 1, "10.0.0.1", "10.0.0.2")
	mustAdd(t, &db, p)

	t.Run("new MAC", func(t *testing.T) {
		q := p.Clone()
		q.MAC = mac(2)
		wantChanges(t, mustAdd(t, &db, q), []Change{
			{IP: ip1, Old: bind(p), New: bind(q)},
			{IP: ip2, Old: bind(p), New: bind(q)},
		})
		p = q
	})
	t.Run("new VTEP", func(t *testing.T) {
		q := p.Clone()
		q.VTEP = netip.MustParseAddr("2001:db8::100")
		wantChanges(t, mustAdd(t, &db, q), []Change{
			{IP: ip1, Old: bind(p), New: bind(q)},
			{IP: ip2, Old: bind(p), New: bind(q)},
		})
		p = q
	})
	t.Run("new IP set", func(t *testing.T) {
		// Drop ip1, keep ip2, gain ip3: ip2 is untouched.
		q := p.Clone()
		q.IPs = []netip.Addr{ip2, ip3}
		wantChanges(t, mustAdd(t, &db, q), []Change{
			{IP: ip1, Old: bind(p)},
			{IP: ip3, New: bind(q)},
		})
		p = q
		wantBindings(t, &db, map[netip.Addr]Binding{ip2: *bind(p), ip3: *bind(p)})
	})
	t.Run("IP set and MAC", func(t *testing.T) {
		q := p.Clone()
		q.IPs = []netip.Addr{ip1, ip2}
		q.MAC = mac(3)
		wantChanges(t, mustAdd(t, &db, q), []Change{
			{IP: ip1, New: bind(q)},
			{IP: ip2, Old: bind(p), New: bind(q)},
			{IP: ip3, Old: bind(p)},
		})
		p = q
	})
	t.Run("remote becomes local", func(t *testing.T) {
		q := p.Clone()
		q.Local = true
		wantChanges(t, mustAdd(t, &db, q), []Change{
			{IP: ip1, Old: bind(p), New: bind(q)},
			{IP: ip2, Old: bind(p), New: bind(q)},
		})
		p = q
	})
	if db.Len() != 1 {
		t.Errorf("Len = %d after updates", db.Len())
	}
}

func TestDuplicateIPRemote(t *testing.T) {
	ip := netip.MustParseAddr("10.0.0.5")
	a := remote("aaa", "192.0.2.1", 1, "10.0.0.5")
	b := remote("bbb", "192.0.2.2", 2, "10.0.0.5", "10.0.0.6")

	var ab, ba DB
	// a then b: b loses ip, so only its other IP changes.
	wantChanges(t, mustAdd(t, &ab, a), []Change{{IP: ip, New: bind(a)}})
	wantChanges(t, mustAdd(t, &ab, b), []Change{{IP: netip.MustParseAddr("10.0.0.6"), New: bind(b)}})
	// b then a: a takes ip over from b.
	mustAdd(t, &ba, b)
	wantChanges(t, mustAdd(t, &ba, a), []Change{{IP: ip, Old: bind(b), New: bind(a)}})

	if !maps.Equal(ab.Bindings(), ba.Bindings()) {
		t.Errorf("arrival order matters:\n%v\n%v", ab.Bindings(), ba.Bindings())
	}
	if o, _ := ab.Owner(ip); o.EndpointID != "aaa" {
		t.Errorf("Owner = %s, want aaa", o.EndpointID)
	}

	// Deleting the loser changes nothing for the shared IP.
	wantChanges(t, ba.Delete("bbb"), []Change{{IP: netip.MustParseAddr("10.0.0.6"), Old: bind(b)}})
	wantBindings(t, &ba, map[netip.Addr]Binding{ip: *bind(a)})

	// Deleting the winner restores the other claimant.
	wantChanges(t, ab.Delete("aaa"), []Change{{IP: ip, Old: bind(a), New: bind(b)}})
	wantBindings(t, &ab, map[netip.Addr]Binding{ip: *bind(b), netip.MustParseAddr("10.0.0.6"): *bind(b)})

	// The winner moving off the IP also restores the other claimant.
	var db DB
	mustAdd(t, &db, a)
	mustAdd(t, &db, b)
	moved := a.Clone()
	moved.IPs = ips("10.0.0.7")
	wantChanges(t, mustAdd(t, &db, moved), []Change{
		{IP: ip, Old: bind(a), New: bind(b)},
		{IP: netip.MustParseAddr("10.0.0.7"), New: bind(moved)},
	})
}

func TestDuplicateIPLoserUpdate(t *testing.T) {
	// A losing claimant changing its MAC changes nothing for the shared IP.
	var db DB
	a := remote("a", "192.0.2.1", 1, "10.0.0.5")
	b := remote("b", "192.0.2.2", 2, "10.0.0.5")
	mustAdd(t, &db, a)
	mustAdd(t, &db, b)
	b.MAC = mac(3)
	if ch := mustAdd(t, &db, b); len(ch) != 0 {
		t.Errorf("loser update: %s", fmtChanges(ch))
	}
}

func TestLocalBeatsRemote(t *testing.T) {
	ip := netip.MustParseAddr("10.0.0.5")
	// The remote claimant has the smaller id, yet the local one wins.
	r := remote("aaa", "192.0.2.1", 1, "10.0.0.5")
	l := local("zzz", 2, "10.0.0.5")

	var rl, lr DB
	mustAdd(t, &rl, r)
	wantChanges(t, mustAdd(t, &rl, l), []Change{{IP: ip, Old: bind(r), New: bind(l)}})
	mustAdd(t, &lr, l)
	if ch := mustAdd(t, &lr, r); len(ch) != 0 {
		t.Errorf("remote claim over local: %s", fmtChanges(ch))
	}
	if !maps.Equal(rl.Bindings(), lr.Bindings()) {
		t.Errorf("arrival order matters:\n%v\n%v", rl.Bindings(), lr.Bindings())
	}
	wantBindings(t, &rl, map[netip.Addr]Binding{ip: *bind(l)})

	// When the local endpoint goes, the remote claimant is restored.
	wantChanges(t, rl.Delete("zzz"), []Change{{IP: ip, Old: bind(l), New: bind(r)}})
	wantBindings(t, &rl, map[netip.Addr]Binding{ip: *bind(r)})
	// Deleting the remote loser while the local one stays changes nothing.
	if ch := lr.Delete("aaa"); len(ch) != 0 {
		t.Errorf("delete remote loser: %s", fmtChanges(ch))
	}
}

func TestDeleteUnknown(t *testing.T) {
	var db DB
	mustAdd(t, &db, remote("a", "192.0.2.1", 1, "10.0.0.1"))
	if ch := db.Delete("b"); ch != nil {
		t.Errorf("Delete(unknown) = %v", ch)
	}
	if ch := db.Delete(""); ch != nil {
		t.Errorf("Delete(\"\") = %v", ch)
	}
	db.Delete("a")
	if ch := db.Delete("a"); ch != nil {
		t.Errorf("second Delete = %v", ch)
	}
	if db.Len() != 0 || len(db.Bindings()) != 0 {
		t.Errorf("not empty after delete: %d peers, %v", db.Len(), db.Bindings())
	}
}

func TestCopies(t *testing.T) {
	var db DB
	in := remote("a", "192.0.2.1", 1, "10.0.0.2", "10.0.0.1")
	mustAdd(t, &db, in)
	// Add copies its argument and does not reorder the caller's slice.
	if in.IPs[0] != netip.MustParseAddr("10.0.0.2") {
		t.Errorf("Add reordered the caller's IPs: %v", in.IPs)
	}
	in.IPs[0] = netip.MustParseAddr("10.9.9.9")

	ps := db.Peers()
	ps[0].IPs[0] = netip.MustParseAddr("10.8.8.8")
	ps[0].IPs = append(ps[0].IPs, netip.MustParseAddr("10.7.7.7"))
	ps[0].MAC = mac(7)
	g, _ := db.Get("a")
	g.IPs[0] = netip.MustParseAddr("10.6.6.6")

	want := ips("10.0.0.1", "10.0.0.2")
	got, _ := db.Get("a")
	if !slices.Equal(got.IPs, want) || got.MAC != mac(1) {
		t.Errorf("stored peer changed through a copy: %+v", got)
	}
	if ps2 := db.Peers(); !slices.Equal(ps2[0].IPs, want) {
		t.Errorf("Peers()[0].IPs = %v", ps2[0].IPs)
	}
	// Delete reports the stored IPs, not the mutated ones.
	wantChanges(t, db.Delete("a"), []Change{
		{IP: want[0], Old: bind(remote("a", "192.0.2.1", 1))},
		{IP: want[1], Old: bind(remote("a", "192.0.2.1", 1))},
	})
}

func TestPeersSorted(t *testing.T) {
	var db DB
	for _, id := range []string{"c", "a", "b"} {
		mustAdd(t, &db, remote(id, "192.0.2.1", 1, "10.0.0.1"))
	}
	var ids []string
	for _, p := range db.Peers() {
		ids = append(ids, p.EndpointID)
	}
	if !slices.Equal(ids, []string{"a", "b", "c"}) {
		t.Errorf("Peers order %v", ids)
	}
}

func TestMixedFamiliesAndDedup(t *testing.T) {
	var db DB
	p := remote("a", "2001:db8::1", 1, "10.0.0.1", "fd00::1", "10.0.0.1", "fd00::1", "fd00:0::1")
	ch := mustAdd(t, &db, p)
	wantChanges(t, ch, []Change{
		{IP: netip.MustParseAddr("10.0.0.1"), New: bind(p)},
		{IP: netip.MustParseAddr("fd00::1"), New: bind(p)},
	})
	got, _ := db.Get("a")
	if !slices.Equal(got.IPs, ips("10.0.0.1", "fd00::1")) {
		t.Errorf("stored IPs %v", got.IPs)
	}
	// An IPv6 peer claiming only the IPv6 address competes only there.
	q := remote("0", "192.0.2.2", 2, "fd00::1")
	wantChanges(t, mustAdd(t, &db, q), []Change{{IP: netip.MustParseAddr("fd00::1"), Old: bind(p), New: bind(q)}})
	wantBindings(t, &db, map[netip.Addr]Binding{
		netip.MustParseAddr("10.0.0.1"): *bind(p),
		netip.MustParseAddr("fd00::1"):  *bind(q),
	})
	// Deleting removes each distinct IP once.
	wantChanges(t, db.Delete("a"), []Change{{IP: netip.MustParseAddr("10.0.0.1"), Old: bind(p)}})
	wantChanges(t, db.Delete("0"), []Change{{IP: netip.MustParseAddr("fd00::1"), Old: bind(q)}})
}

// TestOwnerExactIP: the DB keeps IPs in 16 bytes; an IPv4-mapped IPv6
// address or a zone is still not the IPv4 address or the plain one.
func TestOwnerExactIP(t *testing.T) {
	var db DB
	p := remote("a", "2001:db8::1", 1, "10.0.0.1", "fe80::1")
	mustAdd(t, &db, p)
	for _, ip := range []string{"10.0.0.1", "fe80::1"} {
		if b, ok := db.Owner(netip.MustParseAddr(ip)); !ok || b != *bind(p) {
			t.Errorf("Owner(%s) = %+v, %v", ip, b, ok)
		}
	}
	for _, ip := range []string{"::ffff:10.0.0.1", "fe80::1%eth0"} {
		if b, ok := db.Owner(netip.MustParseAddr(ip)); ok {
			t.Errorf("Owner(%s) = %+v, want none", ip, b)
		}
	}
}

// oracle computes the bindings from the peer set by the documented rule,
// independently of DB.
func oracle(peers map[string]Peer) map[netip.Addr]Binding {
	out := map[netip.Addr]Binding{}
	for _, p := range peers {
		for _, ip := range p.IPs {
			cur, ok := out[ip]
			better := !ok || (p.Local && !cur.Local) || (p.Local == cur.Local && p.EndpointID < cur.EndpointID)
			if better {
				out[ip] = *bind(p)
			}
		}
	}
	return out
}

// TestRandomOps applies random Adds and Deletes and checks that replaying
// the returned changes onto a model reproduces Bindings() after every step,
// and that Bindings() follows the ownership rule.
func TestRandomOps(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e"}
	pool := ips("10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1", "fd00::2", "2001:db8::3")
	vteps := ips("192.0.2.1", "192.0.2.2", "2001:db8:ffff::1")

	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x5eed))
			var db DB
			model := map[netip.Addr]Binding{}
			peers := map[string]Peer{}

			for step := range 1500 {
				var (
					changes []Change
					op      string
				)
				id := ids[rng.IntN(len(ids))]
				switch r := rng.IntN(10); {
				case r < 6:
					p := Peer{
						EndpointID: id,
						MAC:        mac(byte(1 + rng.IntN(3))),
						Local:      rng.IntN(4) == 0,
					}
					if !p.Local || rng.IntN(2) == 0 {
						p.VTEP = vteps[rng.IntN(len(vteps))]
					}
					for range 1 + rng.IntN(4) { // repeats allowed
						p.IPs = append(p.IPs, pool[rng.IntN(len(pool))])
					}
					invalid := rng.IntN(20) == 0
					if invalid {
						p.MAC = hwaddr.MAC{}
					}
					op = fmt.Sprintf("Add(%s local=%v mac=%s vtep=%v ips=%v)", p.EndpointID, p.Local, p.MAC, p.VTEP, p.IPs)
					var err error
					changes, err = db.Add(p)
					if invalid {
						if err == nil || changes != nil {
							t.Fatalf("step %d %s: invalid peer accepted (err %v)", step, op, err)
						}
						break
					}
					if err != nil {
						t.Fatalf("step %d %s: %v", step, op, err)
					}
					if p.Local {
						p.VTEP = netip.Addr{}
					}
					peers[id] = p
				default:
					op = fmt.Sprintf("Delete(%s)", id)
					_, had := peers[id]
					changes = db.Delete(id)
					if !had && changes != nil {
						t.Fatalf("step %d %s: unknown delete returned %v", step, op, changes)
					}
					delete(peers, id)
				}

				seen := map[netip.Addr]bool{}
				for _, c := range changes {
					if seen[c.IP] {
						t.Fatalf("step %d %s: IP %v changed twice:%s", step, op, c.IP, fmtChanges(changes))
					}
					seen[c.IP] = true
					if c.Old == nil && c.New == nil || sameBinding(c.Old, c.New) {
						t.Fatalf("step %d %s: empty change for %v:%s", step, op, c.IP, fmtChanges(changes))
					}
					cur, ok := model[c.IP]
					var curp *Binding
					if ok {
						curp = &cur
					}
					if !sameBinding(c.Old, curp) {
						t.Fatalf("step %d %s: change for %v has Old %s, model has %s", step, op, c.IP, fmtBinding(c.Old), fmtBinding(curp))
					}
					if c.New == nil {
						delete(model, c.IP)
					} else {
						model[c.IP] = *c.New
					}
				}

				got := db.Bindings()
				if !maps.Equal(model, got) {
					t.Fatalf("step %d %s: model %v != Bindings() %v", step, op, model, got)
				}
				if want := oracle(peers); !maps.Equal(got, want) {
					t.Fatalf("step %d %s: Bindings() %v, rule says %v", step, op, got, want)
				}
				if db.Len() != len(peers) {
					t.Fatalf("step %d %s: Len %d, want %d", step, op, db.Len(), len(peers))
				}
			}
		})
	}
}

// WithMAC finds the peers holding a MAC, local and remote, by endpoint id.
func TestWithMAC(t *testing.T) {
	var db DB
	mustAdd(t, &db, remote("ep2", "192.0.2.1", 7, "10.0.0.2"))
	mustAdd(t, &db, local("ep1", 7, "10.0.0.1"))
	mustAdd(t, &db, remote("ep3", "192.0.2.1", 8, "10.0.0.3"))
	got := db.WithMAC(mac(7))
	if len(got) != 2 || got[0].EndpointID != "ep1" || !got[0].Local || got[1].EndpointID != "ep2" || got[1].VTEP != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("WithMAC(7) = %+v, want ep1 (local) and ep2", got)
	}
	if got := db.WithMAC(mac(9)); len(got) != 0 {
		t.Errorf("WithMAC(9) = %+v, want none", got)
	}
}
