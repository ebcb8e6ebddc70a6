package servicelb

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
)

// elemsPerMessage bounds the elements added by one netlink message: each
// takes at most about 130 bytes (a key, and a verdict naming a chain whose
// name holds two IPv6 addresses), and all of a message's elements are one
// attribute of at most 64 KiB, which google/nftables does not check (a
// longer one silently corrupts the batch).
const elemsPerMessage = 256

// queueReplace queues, on c, the replacement of whatever table of our name
// exists (a previous Apply's, one damaged from outside, or none) by rs.
// Chains come first, since map elements jump to them; sets next, since
// rules look them up; rules last. It returns the number of objects
// written: the table, its chains, rules, sets and elements.
func (rs *ruleset) queueReplace(c *nftables.Conn) (objects int, err error) {
	nftutil.QueueRemoveTable(c, rs.table)
	c.AddTable(rs.table)
	objects = 1 + len(rs.chains) + len(rs.sets)
	for _, ch := range rs.chains {
		c.AddChain(ch.chain)
		objects += len(ch.rules)
	}
	for _, s := range rs.sets {
		objects += len(s.elems)
		// A message carries the elements in one attribute, whose length
		// is 16 bits: add a large set's elements over several messages.
		first := s.elems[:min(len(s.elems), elemsPerMessage)]
		if err := c.AddSet(s.set, first); err != nil {
			return 0, fmt.Errorf("queue set %s: %w", s.set.Name, err)
		}
		for rest := s.elems[len(first):]; len(rest) > 0; rest = rest[min(len(rest), elemsPerMessage):] {
			if err := c.SetAddElements(s.set, rest[:min(len(rest), elemsPerMessage)]); err != nil {
				return 0, fmt.Errorf("queue elements of set %s: %w", s.set.Name, err)
			}
		}
	}
	for _, ch := range rs.chains {
		for _, r := range ch.rules {
			c.AddRule(&nftables.Rule{Table: rs.table, Chain: ch.chain, Exprs: r.exprs, UserData: nftutil.Comment(r.comment)})
		}
	}
	return objects, nil
}

// readTable reads our table back from the kernel: nil if there is none.
// Without withSets it reads only chains and rules (enough for counters).
func readTable(c *nftables.Conn, withSets bool) (*ruleset, error) {
	rs := &ruleset{table: newTable()}
	present, err := nftutil.HasTable(c, rs.table)
	if err != nil || !present {
		return nil, err
	}
	chains, err := c.ListChainsOfTableFamily(rs.table.Family)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name != rs.table.Name {
			continue
		}
		rules, err := c.GetRules(rs.table, ch)
		if err != nil {
			return nil, fmt.Errorf("list rules of chain %s: %w", ch.Name, err)
		}
		spec := chainSpec{chain: ch}
		for _, r := range rules {
			cm, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			spec.rules = append(spec.rules, ruleSpec{exprs: r.Exprs, comment: cm})
		}
		rs.chains = append(rs.chains, spec)
	}
	if !withSets {
		return rs, nil
	}
	sets, err := c.GetSets(rs.table)
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	for _, s := range sets {
		elems, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("list elements of %s: %w", s.Name, err)
		}
		rs.sets = append(rs.sets, setSpec{set: s, elems: elems})
	}
	return rs, nil
}

// counters returns the counter of every backend chain in rs (nil-safe).
func (rs *ruleset) counters() map[Backend]expr.Counter {
	out := map[Backend]expr.Counter{}
	if rs == nil {
		return out
	}
	for _, ch := range rs.chains {
		b, ok := parseBackendName(ch.chain.Name)
		if !ok {
			continue
		}
		for _, r := range ch.rules {
			for _, e := range r.exprs {
				if ctr, ok := e.(*expr.Counter); ok {
					out[b] = *ctr
				}
			}
		}
	}
	return out
}

// sameAs reports whether got (read from the kernel) has exactly rs's
// chains, rules, sets and elements, counter values aside. Anything it
// cannot tell apart counts as a difference, so the worst a false "differs"
// costs is one needless rebuild.
func (rs *ruleset) sameAs(got *ruleset) bool {
	return got != nil &&
		sameByName(rs.chains, got.chains, func(c chainSpec) string { return c.chain.Name }, sameChain) &&
		sameByName(rs.sets, got.sets, func(s setSpec) string { return s.set.Name }, sameSet)
}

// sameByName says whether have holds exactly want's objects by name, each
// alike (same) to want's.
func sameByName[T any](want, have []T, name func(T) string, same func(want, have T) bool) bool {
	if len(want) != len(have) {
		return false
	}
	byName := make(map[string]T, len(have))
	for _, h := range have {
		byName[name(h)] = h
	}
	for _, w := range want {
		h, ok := byName[name(w)]
		if !ok || !same(w, h) {
			return false
		}
	}
	return true
}

func sameChain(want, have chainSpec) bool {
	w, h := want.chain, have.chain
	if w.Type != h.Type || !samePtr(w.Hooknum, h.Hooknum) || !samePtr(w.Priority, h.Priority) ||
		!samePtr(w.Policy, h.Policy) || len(want.rules) != len(have.rules) {
		return false
	}
	for i := range want.rules {
		if want.rules[i].comment != have.rules[i].comment ||
			!reflect.DeepEqual(canonical(want.rules[i].exprs), canonical(have.rules[i].exprs)) {
			return false
		}
	}
	return true
}

func samePtr[T comparable](a, b *T) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// canonical drops what legitimately differs between the rules queued and
// the rules listed: counter values, and set IDs (which name a set only
// inside the batch that creates it).
func canonical(exprs []expr.Any) []expr.Any {
	out := make([]expr.Any, len(exprs))
	for i, e := range exprs {
		switch x := e.(type) {
		case *expr.Counter:
			out[i] = &expr.Counter{}
		case *expr.Lookup:
			c := *x
			c.SetID = 0
			out[i] = &c
		default:
			out[i] = e
		}
	}
	return out
}

// sameSet compares the key types of plain sets only: google/nftables
// v0.3.0 lists a map's key type as "verdict" (it stores the data type
// there). A map's keys still have to match byte for byte.
func sameSet(want, have setSpec) bool {
	w, h := want.set, have.set
	if w.IsMap != h.IsMap || (!w.IsMap && w.KeyType.Name != h.KeyType.Name) {
		return false
	}
	return slices.Equal(elemStrings(want.elems, false), elemStrings(have.elems, true))
}

// elemStrings renders elements as "key=verdict chain", sorted. Elements
// listed from the kernel carry a map's verdict as netlink attributes in
// Val, not in VerdictData.
func elemStrings(elems []nftables.SetElement, listed bool) []string {
	out := make([]string, len(elems))
	for i, e := range elems {
		s := hex.EncodeToString(e.Key)
		switch {
		case e.VerdictData != nil:
			s += fmt.Sprintf("=%d %s", e.VerdictData.Kind, e.VerdictData.Chain)
		case listed && len(e.Val) > 0:
			s += "=" + decodeVerdict(e.Val)
		case len(e.Val) > 0:
			s += "=raw " + hex.EncodeToString(e.Val)
		}
		out[i] = s
	}
	slices.Sort(out)
	return out
}

// decodeVerdict renders NFTA_VERDICT_CODE and NFTA_VERDICT_CHAIN as
// elemStrings does a VerdictData.
func decodeVerdict(b []byte) string {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "undecodable"
	}
	ad.ByteOrder = binary.BigEndian
	code, chain := int32(0), ""
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			code = int32(ad.Uint32())
		case unix.NFTA_VERDICT_CHAIN:
			chain = strings.TrimRight(ad.String(), "\x00")
		}
	}
	if ad.Err() != nil {
		return "undecodable"
	}
	return fmt.Sprintf("%d %s", code, chain)
}
