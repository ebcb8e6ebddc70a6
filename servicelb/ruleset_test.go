package servicelb

// Unit tests of the translation of services into nftables objects; no
// kernel involved.

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
)

// render prints an expression roughly as nft does, for readable
// expectations.
func render(e expr.Any) string {
	switch x := e.(type) {
	case *expr.Meta:
		return fmt.Sprintf("meta(%d)", x.Key)
	case *expr.Cmp:
		if x.Op == expr.CmpOpNeq {
			return fmt.Sprintf("!= %x", x.Data)
		}
		return fmt.Sprintf("== %x", x.Data)
	case *expr.Payload:
		return fmt.Sprintf("nh@%d,%d", x.Offset, x.Len)
	case *expr.Lookup:
		if x.IsDestRegSet {
			return "vmap @" + x.SetName
		}
		return "@" + x.SetName
	case *expr.Numgen:
		return fmt.Sprintf("numgen random mod %d", x.Modulus)
	case *expr.Counter:
		return fmt.Sprintf("counter %d %d", x.Packets, x.Bytes)
	case *expr.Immediate:
		ip, _ := netip.AddrFromSlice(x.Data)
		return "imm " + ip.String()
	case *expr.NAT:
		return fmt.Sprintf("dnat(%d)", x.Family)
	case *expr.Reject:
		return fmt.Sprintf("reject(%d,%d)", x.Type, x.Code)
	case *expr.Ct:
		return fmt.Sprintf("ct(%d)", x.Key)
	case *expr.Bitwise:
		return fmt.Sprintf("& %x ^ %x", x.Mask, x.Xor)
	case *expr.Verdict:
		return fmt.Sprintf("verdict(%d)", x.Kind)
	}
	return fmt.Sprintf("%T", e)
}

func renderRule(r ruleSpec) string {
	parts := make([]string, len(r.exprs))
	for i, e := range r.exprs {
		parts[i] = render(e)
	}
	return strings.Join(parts, " ")
}

// chainsOf maps chain name to its rules, rendered.
func chainsOf(rs *ruleset) map[string][]string {
	out := map[string][]string{}
	for _, ch := range rs.chains {
		var rules []string
		for _, r := range ch.rules {
			rules = append(rules, renderRule(r))
		}
		out[ch.chain.Name] = rules
	}
	return out
}

// setsOf maps set name to its elements as elemStrings renders them.
func setsOf(rs *ruleset) map[string][]string {
	out := map[string][]string{}
	for _, s := range rs.sets {
		out[s.set.Name] = elemStrings(s.elems, false)
	}
	return out
}

func mustNormalize(t *testing.T, svcs ...Service) []Service {
	t.Helper()
	n, err := Normalize(svcs)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func key(i uint32) string { return fmt.Sprintf("%x", binaryutil.NativeEndian.PutUint32(i)) }

func gotoS(chain string) string { return fmt.Sprintf("=%d %s", expr.VerdictGoto, chain) }

func TestBuildLayout(t *testing.T) {
	rs := build(mustNormalize(t,
		Service{Name: "web", VIP: a("203.0.113.100"), Backends: addrs("203.0.113.2", "203.0.113.1")},
		Service{Name: "none", VIP: a("203.0.113.101")},
		Service{Name: "v6", VIP: a("fd00::100"), Backends: addrs("fd00::1")},
	), map[Backend]expr.Counter{{a("203.0.113.100"), a("203.0.113.2")}: {Packets: 7, Bytes: 420}})

	if rs.table.Name != TableName || rs.table.Family != nftables.TableFamilyINet {
		t.Errorf("table %+v", rs.table)
	}
	chains := chainsOf(rs)
	be1, be2, be6 := "be-203.0.113.100-203.0.113.1", "be-203.0.113.100-203.0.113.2", "be-fd00__100-fd00__1"
	want := map[string][]string{
		be1:                 {"counter 0 0 imm 203.0.113.1 dnat(2)"},
		be2:                 {"counter 7 420 imm 203.0.113.2 dnat(2)"},
		"svc-203.0.113.100": {"numgen random mod 2 vmap @svc-203.0.113.100"},
		be6:                 {"counter 0 0 imm fd00::1 dnat(10)"},
		"svc-fd00__100":     {"numgen random mod 1 vmap @svc-fd00__100"},
		DNATChain: {
			"meta(15) == 02 nh@16,4 vmap @vips4",
			"meta(15) == 0a nh@24,16 vmap @vips6",
		},
		RejectChain: {
			fmt.Sprintf("ct(2) & %x ^ 00000000 != 00000000 verdict(1)", binaryutil.NativeEndian.PutUint32(0x20)),
			"meta(15) == 02 nh@16,4 @empty4 meta(16) == 06 reject(1,0)",
			"meta(15) == 02 nh@16,4 @empty4 reject(2,1)",
			"meta(15) == 0a nh@24,16 @empty6 meta(16) == 06 reject(1,0)",
			"meta(15) == 0a nh@24,16 @empty6 reject(2,1)",
		},
	}
	if !reflect.DeepEqual(chains, want) {
		t.Errorf("chains:\n got %v\nwant %v", chains, want)
	}
	sets := setsOf(rs)
	wantSets := map[string][]string{
		VIPs4Map:            {"cb007164" + gotoS("svc-203.0.113.100")},
		VIPs6Map:            {"fd000000000000000000000000000100" + gotoS("svc-fd00__100")},
		Empty4Set:           {"cb007165"},
		Empty6Set:           {},
		"svc-203.0.113.100": {key(0) + gotoS(be1), key(1) + gotoS(be2)},
		"svc-fd00__100":     {key(0) + gotoS(be6)},
	}
	if !reflect.DeepEqual(sets, wantSets) {
		t.Errorf("sets:\n got %v\nwant %v", sets, wantSets)
	}
	base := map[string]struct {
		typ      nftables.ChainType
		priority nftables.ChainPriority
	}{
		DNATChain:   {nftables.ChainTypeNAT, *nftables.ChainPriorityNATDest},
		RejectChain: {nftables.ChainTypeFilter, *nftables.ChainPriorityFilter},
	}
	for _, ch := range rs.chains {
		c := ch.chain
		b, isBase := base[c.Name]
		switch {
		case !isBase && (c.Hooknum != nil || c.Type != ""):
			t.Errorf("chain %s should be a regular chain: %+v", c.Name, c)
		case isBase && (c.Type != b.typ || *c.Hooknum != *nftables.ChainHookOutput || *c.Priority != b.priority):
			t.Errorf("chain %s: %+v", c.Name, c)
		}
	}
	for _, r := range rs.chains[0].rules {
		if !strings.HasPrefix(r.comment, "overlay-plugin: service web backend") {
			t.Errorf("comment %q", r.comment)
		}
	}
	checkIntegrity(t, rs)
}

// checkIntegrity checks what the kernel would refuse or what would make
// the rules wrong: set IDs unique and matched by their lookups, jumps to
// existing chains, chains created before the elements jumping to them,
// every non-base chain reached from exactly one map element.
func checkIntegrity(t *testing.T, rs *ruleset) {
	t.Helper()
	ids := map[uint32]string{}
	for _, s := range rs.sets {
		if s.set.ID == 0 || ids[s.set.ID] != "" {
			t.Errorf("set %s: ID %d zero or reused", s.set.Name, s.set.ID)
		}
		ids[s.set.ID] = s.set.Name
		if s.set.Table != rs.table {
			t.Errorf("set %s in another table", s.set.Name)
		}
	}
	chains := map[string]bool{}
	for _, ch := range rs.chains {
		if ch.chain.Table != rs.table {
			t.Errorf("chain %s in another table", ch.chain.Name)
		}
		chains[ch.chain.Name] = true
		for _, r := range ch.rules {
			for _, e := range r.exprs {
				if l, ok := e.(*expr.Lookup); ok && ids[l.SetID] != l.SetName {
					t.Errorf("chain %s looks up %s with ID %d, which is %q", ch.chain.Name, l.SetName, l.SetID, ids[l.SetID])
				}
			}
		}
	}
	reached := map[string]int{}
	for _, s := range rs.sets {
		for _, e := range s.elems {
			if v := e.VerdictData; v != nil {
				if v.Kind != expr.VerdictGoto || !chains[v.Chain] {
					t.Errorf("map %s: element %x -> %v %s, not a goto to a chain of ours", s.set.Name, e.Key, v.Kind, v.Chain)
				}
				reached[v.Chain]++
			}
		}
	}
	for name := range chains {
		if name == DNATChain || name == RejectChain {
			continue
		}
		if reached[name] != 1 {
			t.Errorf("chain %s reached from %d map elements, want 1", name, reached[name])
		}
	}
	// Base chains last: queueReplace adds chains in this order, and a base
	// chain registers its hook only when the batch commits anyway, but
	// keeping them last means the listing reads top-down.
	n := len(rs.chains)
	if n < 2 || rs.chains[n-2].chain.Name != DNATChain || rs.chains[n-1].chain.Name != RejectChain {
		t.Errorf("base chains are not last")
	}
}

func TestBuildIsDeterministic(t *testing.T) {
	in := []Service{
		{Name: "b", VIP: a("fd00::200"), Backends: addrs("fd00::9", "fd00::8")},
		{Name: "a", VIP: a("198.18.0.100"), Backends: addrs("198.18.0.3", "198.18.0.1", "198.18.0.2")},
	}
	x := build(mustNormalize(t, in...), nil)
	slices.Reverse(in)
	slices.Reverse(in[0].Backends)
	y := build(mustNormalize(t, in...), nil)
	if !reflect.DeepEqual(x, y) {
		t.Error("the same services in another order give other rules")
	}
	if !x.sameAs(y) {
		t.Error("sameAs is false for equal rulesets")
	}
}

func TestBuildEmpty(t *testing.T) {
	rs := build(nil, nil)
	if got := chainsOf(rs); len(got) != 2 {
		t.Errorf("no services: chains %v, want only the base chains", got)
	}
	for name, elems := range setsOf(rs) {
		if len(elems) != 0 {
			t.Errorf("no services: set %s has %v", name, elems)
		}
	}
}

func TestBuildClipsLongNames(t *testing.T) {
	name := strings.Repeat("é", 200) // 400 bytes
	rs := build(mustNormalize(t, Service{Name: name, VIP: a("198.18.0.100"), Backends: addrs("198.18.0.1")}), nil)
	for _, ch := range rs.chains[:2] { // the backend's and the service's
		for _, r := range ch.rules {
			if len(r.comment) > 200 || !strings.HasSuffix(strings.TrimSuffix(strings.TrimSuffix(r.comment, ", one of 1 backends at random"), " backend 198.18.0.1"), "...") {
				t.Errorf("comment of %d bytes: %q", len(r.comment), r.comment)
			}
		}
	}
}

func TestNamesRoundTrip(t *testing.T) {
	for _, b := range []Backend{
		{a("198.18.0.100"), a("198.18.0.1")},
		{a("fd00::100"), a("fd00:1:2::3")},
		{a("2001:db8::"), a("2001:db8::1:0:0:1")},
	} {
		name := backendName(b)
		if strings.ContainsAny(name, ": ") {
			t.Errorf("%s: name %q has characters nft would not parse", b, name)
		}
		got, ok := parseBackendName(name)
		if !ok || got != b {
			t.Errorf("parseBackendName(%q) = %v, %v; want %v", name, got, ok, b)
		}
	}
	for _, bad := range []string{"svc-198.18.0.100", "be-198.18.0.100", "be-x-y", DNATChain} {
		if b, ok := parseBackendName(bad); ok {
			t.Errorf("parseBackendName(%q) = %v", bad, b)
		}
	}
}

// step is one state in a churn sequence: the services, and the
// connections counted per backend while it was in force.
type step struct {
	name  string
	svcs  []Service
	conns map[Backend]uint64
}

// TestBuildChurn applies a sequence of service lists as Apply does
// (counters read from the previous table carried into the next), and
// checks at each step that the chains are exactly the current backends',
// that kept backends keep their counts, that new ones start at zero, and
// that removed ones are gone.
func TestBuildChurn(t *testing.T) {
	web, v6 := a("198.18.0.100"), a("fd00::100")
	b := func(vip netip.Addr, s string) Backend { return Backend{vip, a(s)} }
	steps := []step{
		{"one service", []Service{{Name: "web", VIP: web, Backends: addrs("198.18.0.1", "198.18.0.2", "198.18.0.3")}},
			map[Backend]uint64{b(web, "198.18.0.1"): 5, b(web, "198.18.0.2"): 3, b(web, "198.18.0.3"): 4}},
		{"backend removed", []Service{{Name: "web", VIP: web, Backends: addrs("198.18.0.2", "198.18.0.3")}},
			map[Backend]uint64{b(web, "198.18.0.2"): 1}},
		{"backend added, v6 service added", []Service{
			{Name: "web", VIP: web, Backends: addrs("198.18.0.2", "198.18.0.3", "198.18.0.4")},
			{Name: "v6", VIP: v6, Backends: addrs("fd00::1", "fd00::2")}},
			map[Backend]uint64{b(v6, "fd00::1"): 2, b(web, "198.18.0.4"): 6}},
		{"removed backend back, empty service", []Service{
			{Name: "web", VIP: web, Backends: addrs("198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.4")},
			{Name: "v6", VIP: v6},
			{Name: "db", VIP: a("198.18.0.101"), Backends: addrs("198.18.0.9")}},
			map[Backend]uint64{b(web, "198.18.0.1"): 1}},
		{"v4 gone", []Service{{Name: "v6", VIP: v6, Backends: addrs("fd00::2")}}, nil},
		{"nothing", nil, nil},
	}
	var prev *ruleset
	total := map[Backend]uint64{} // expected counts of the current backends
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			norm := mustNormalize(t, st.svcs...)
			rs := build(norm, prev.counters())
			checkIntegrity(t, rs)
			current := map[Backend]bool{}
			for _, s := range norm {
				for _, addr := range s.Backends {
					current[Backend{s.VIP, addr}] = true
				}
			}
			for be := range total {
				if !current[be] {
					delete(total, be) // its chain, counter included, is gone
				}
			}
			got := map[Backend]uint64{}
			for be, ctr := range rs.counters() {
				got[be] = ctr.Packets
			}
			want := map[Backend]uint64{}
			for be := range current {
				want[be] = total[be]
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("counters at the start of the step:\n got %v\nwant %v", got, want)
			}
			// Connections while the step is in force.
			for be, n := range st.conns {
				total[be] += n
				for i, ch := range rs.chains {
					if ch.chain.Name == backendName(be) {
						ctr := rs.chains[i].rules[0].exprs[0].(*expr.Counter)
						ctr.Packets += n
						ctr.Bytes += 60 * n
					}
				}
			}
			for _, s := range norm {
				chains := chainsOf(rs)
				_, hasSvc := chains[serviceName(s.VIP)]
				if hasSvc != (len(s.Backends) > 0) {
					t.Errorf("service %s: chain present %v with %d backends", s.VIP, hasSvc, len(s.Backends))
				}
				if len(s.Backends) > 0 {
					if want := fmt.Sprintf("numgen random mod %d vmap @%s", len(s.Backends), serviceName(s.VIP)); chains[serviceName(s.VIP)][0] != want {
						t.Errorf("service %s: %v, want %s", s.VIP, chains[serviceName(s.VIP)], want)
					}
				}
				sets := setsOf(rs)
				empty := Empty4Set
				if s.VIP.Is6() {
					empty = Empty6Set
				}
				key := fmt.Sprintf("%x", s.VIP.AsSlice())
				if slices.Contains(sets[empty], key) != (len(s.Backends) == 0) {
					t.Errorf("service %s with %d backends: %s is %v", s.VIP, len(s.Backends), empty, sets[empty])
				}
			}
			if prev != nil && prev.sameAs(rs) {
				t.Errorf("sameAs: step equal to the previous one")
			}
			prev = rs
		})
	}
}

func TestSameAsSeesEveryDifference(t *testing.T) {
	base := func() *ruleset {
		return build(mustNormalize(t,
			Service{Name: "web", VIP: a("198.18.0.100"), Backends: addrs("198.18.0.1", "198.18.0.2")},
			Service{Name: "none", VIP: a("198.18.0.101")}), nil)
	}
	if !base().sameAs(base()) {
		t.Fatal("equal rulesets differ")
	}
	withCounts := base()
	withCounts.chains[0].rules[0].exprs[0] = &expr.Counter{Packets: 9, Bytes: 9}
	if !base().sameAs(withCounts) {
		t.Error("counter values made a difference")
	}
	for name, damage := range map[string]func(rs *ruleset){
		"chain missing": func(rs *ruleset) { rs.chains = rs.chains[1:] },
		"rule missing":  func(rs *ruleset) { rs.chains[len(rs.chains)-1].rules = rs.chains[len(rs.chains)-1].rules[1:] },
		"other address": func(rs *ruleset) {
			rs.chains[0].rules[0].exprs[1] = &expr.Immediate{Register: 1, Data: a("198.18.0.7").AsSlice()}
		},
		"other comment": func(rs *ruleset) { rs.chains[0].rules[0].comment = "x" },
		"set missing":   func(rs *ruleset) { rs.sets = rs.sets[1:] },
		"element gone":  func(rs *ruleset) { rs.sets[0].elems = nil },
		"other verdict": func(rs *ruleset) {
			rs.sets[0].elems[0].VerdictData = &expr.Verdict{Kind: expr.VerdictJump, Chain: "svc-198.18.0.100"}
		},
		"other priority": func(rs *ruleset) { p := nftables.ChainPriority(0); rs.chains[len(rs.chains)-2].chain.Priority = &p },
		"set, not map":   func(rs *ruleset) { rs.sets[0].set.IsMap = false },
	} {
		rs := base()
		damage(rs)
		if base().sameAs(rs) {
			t.Errorf("%s: no difference seen", name)
		}
	}
}

func TestRemovedBackends(t *testing.T) {
	web, v6 := a("198.18.0.100"), a("fd00::100")
	have := build(mustNormalize(t,
		Service{VIP: web, Backends: addrs("198.18.0.1", "198.18.0.2", "198.18.0.3")},
		Service{VIP: v6, Backends: addrs("fd00::1")}), nil)
	want := build(mustNormalize(t, Service{VIP: web, Backends: addrs("198.18.0.2", "198.18.0.4")}), nil)
	got := removedBackends(have, want)
	exp := []Backend{{web, a("198.18.0.1")}, {web, a("198.18.0.3")}, {v6, a("fd00::1")}}
	if !reflect.DeepEqual(got, exp) {
		t.Errorf("removedBackends = %v, want %v", got, exp)
	}
	if got := removedBackends(nil, want); len(got) != 0 {
		t.Errorf("removedBackends without a table = %v", got)
	}
}
