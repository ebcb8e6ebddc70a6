package servicelb

import (
	"fmt"
	"net/netip"
	"unicode/utf8"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// ruleset is the table's whole content for one list of services: what
// Apply queues in one batch, and what it compares the kernel's table with
// to skip a batch that would change nothing. It is a pure function of the
// normalized services (and the counter values carried over), so the same
// input always gives the same rules.
type ruleset struct {
	table  *nftables.Table
	chains []chainSpec // regular chains first, then the two base chains
	sets   []setSpec
}

type chainSpec struct {
	chain *nftables.Chain
	rules []ruleSpec
}

type ruleSpec struct {
	exprs   []expr.Any
	comment string
}

type setSpec struct {
	set   *nftables.Set
	elems []nftables.SetElement
}

// ipsDstNAT is IPS_DST_NAT (enum ip_conntrack_status): the connection's
// destination is NATed.
const ipsDstNAT = 1 << 5

// family is what differs between IPv4 and IPv6 in the rules.
type family struct {
	nfproto     byte
	daddrOffset uint32 // of the destination address in the network header
	addrType    nftables.SetDatatype
	vips, empty string // map and set names
}

var (
	family4 = family{unix.NFPROTO_IPV4, 16, nftables.TypeIPAddr, VIPs4Map, Empty4Set}
	family6 = family{unix.NFPROTO_IPV6, 24, nftables.TypeIP6Addr, VIPs6Map, Empty6Set}
)

func familyOf(a netip.Addr) family {
	if a.Is4() {
		return family4
	}
	return family6
}

func newTable() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
}

// maxNameInComment bounds the service name in a comment: the kernel keeps
// at most 256 bytes of a rule's userdata.
const maxNameInComment = 128

func clip(name string) string {
	if len(name) <= maxNameInComment {
		return name
	}
	name = name[:maxNameInComment]
	for !utf8.ValidString(name) {
		name = name[:len(name)-1]
	}
	return name + "..."
}

// builder accumulates a ruleset; nextID numbers the sets, as each needs an
// ID unique in the batch that creates it (setting it ourselves also keeps
// google/nftables from incrementing its unsynchronised package counter).
type builder struct {
	rs     *ruleset
	nextID uint32
}

func (b *builder) addSet(s *nftables.Set, elems []nftables.SetElement) *nftables.Set {
	b.nextID++
	s.ID, s.Table = b.nextID, b.rs.table
	b.rs.sets = append(b.rs.sets, setSpec{set: s, elems: elems})
	return s
}

func (b *builder) addChain(c *nftables.Chain, rules ...ruleSpec) {
	c.Table = b.rs.table
	b.rs.chains = append(b.rs.chains, chainSpec{chain: c, rules: rules})
}

func gotoElem(key []byte, chain string) nftables.SetElement {
	return nftables.SetElement{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}
}

func lookup(s *nftables.Set, verdict bool) *expr.Lookup {
	return &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, IsDestRegSet: verdict}
}

// build translates normalized services into the table's content; carried
// holds counter values to start backends' counters from.
func build(svcs []Service, carried map[Backend]expr.Counter) *ruleset {
	b := &builder{rs: &ruleset{table: newTable()}}
	vips := map[family][]nftables.SetElement{}
	empty := map[family][]nftables.SetElement{}
	for _, s := range svcs {
		f := familyOf(s.VIP)
		if len(s.Backends) == 0 {
			empty[f] = append(empty[f], nftables.SetElement{Key: s.VIP.AsSlice()})
			continue
		}
		vips[f] = append(vips[f], gotoElem(s.VIP.AsSlice(), serviceName(s.VIP)))
		b.addService(s, f, carried)
	}
	var dnat []ruleSpec
	reject := []ruleSpec{{exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}, comment: "overlay-plugin: balanced connections pass; keeps conntrack on"}}
	for _, f := range []family{family4, family6} {
		m := b.addSet(&nftables.Set{Name: f.vips, IsMap: true, KeyType: f.addrType, DataType: nftables.TypeVerdict}, vips[f])
		e := b.addSet(&nftables.Set{Name: f.empty, KeyType: f.addrType}, empty[f])
		dnat = append(dnat, ruleSpec{exprs: append(f.daddr(), lookup(m, true)),
			comment: "overlay-plugin: service VIPs to their backends"})
		reject = append(reject,
			ruleSpec{exprs: append(f.daddr(), lookup(e, false),
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
				&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}),
				comment: "overlay-plugin: reset TCP to services without backends"},
			ruleSpec{exprs: append(f.daddr(), lookup(e, false),
				&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}),
				comment: "overlay-plugin: refuse the rest to services without backends"})
	}
	accept := nftables.ChainPolicyAccept
	b.addChain(&nftables.Chain{Name: DNATChain, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookOutput,
		Priority: nftables.ChainPriorityNATDest, Policy: &accept}, dnat...)
	b.addChain(&nftables.Chain{Name: RejectChain, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookOutput,
		Priority: nftables.ChainPriorityFilter, Policy: &accept}, reject...)
	return b.rs
}

// addService adds the chains of a service with backends: one per backend
// (counter, DNAT), and one that picks a backend at random through a map
// from the random number to the backend's chain.
func (b *builder) addService(s Service, f family, carried map[Backend]expr.Counter) {
	for _, addr := range s.Backends {
		be := backendChain(s, addr, f, carried[Backend{VIP: s.VIP, Addr: addr}])
		b.addChain(be.chain, be.rules...)
	}
	m := b.addSet(pickMap(s.VIP), picks(s, 0, len(s.Backends)))
	b.addChain(&nftables.Chain{Name: serviceName(s.VIP)}, pickRule(s, m))
}

// backendChain is the chain that counts and DNATs the connections of s's
// backend addr, its counter starting from ctr (table not set).
func backendChain(s Service, addr netip.Addr, f family, ctr expr.Counter) chainSpec {
	return chainSpec{chain: &nftables.Chain{Name: backendName(Backend{VIP: s.VIP, Addr: addr})}, rules: []ruleSpec{{
		exprs: []expr.Any{
			&expr.Counter{Packets: ctr.Packets, Bytes: ctr.Bytes},
			&expr.Immediate{Register: 1, Data: addr.AsSlice()},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(f.nfproto), RegAddrMin: 1, RegAddrMax: 1},
		},
		comment: fmt.Sprintf("overlay-plugin: service %s backend %s", clip(s.Name), addr),
	}}}
}

// pickMap is the map, numgen-indexed, from which vip's service chain picks
// a backend's chain (no table, no ID).
func pickMap(vip netip.Addr) *nftables.Set {
	return &nftables.Set{Name: serviceName(vip), IsMap: true, KeyType: nftables.TypeInteger,
		KeyByteOrder: binaryutil.NativeEndian, DataType: nftables.TypeVerdict}
}

// picks are the elements i (from <= i < to) of s's pick map: i goes to
// the chain of s's i-th backend.
func picks(s Service, from, to int) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, pick(s, i))
	}
	return out
}

func pick(s Service, i int) nftables.SetElement {
	return gotoElem(binaryutil.NativeEndian.PutUint32(uint32(i)), backendName(Backend{VIP: s.VIP, Addr: s.Backends[i]}))
}

// pickRule is the service chain's rule: a random number below the number
// of backends, looked up in m.
func pickRule(s Service, m *nftables.Set) ruleSpec {
	return ruleSpec{
		exprs: []expr.Any{
			&expr.Numgen{Register: 1, Modulus: uint32(len(s.Backends)), Type: unix.NFT_NG_RANDOM},
			lookup(m, true),
		},
		comment: fmt.Sprintf("overlay-plugin: service %s, one of %d backends at random", clip(s.Name), len(s.Backends)),
	}
}

// daddr loads the destination address of a packet of family f into
// register 1 (meta nfproto F ip[6] daddr).
func (f family) daddr() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.nfproto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.daddrOffset, Len: uint32(f.addrType.Bytes)},
	}
}
