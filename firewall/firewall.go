// Package firewall keeps the nftables rules that make VXLAN of encrypted
// networks go through IPsec, in a table of its own:
//
//	table inet overlay_plugin {
//		set encrypted_vnis { type integer (3 bytes, the VNI as on the wire) }
//		chain output { type route hook output priority mangle; policy accept;
//			meta l4proto udp udp dport PORT @th,96,24 @encrypted_vnis counter meta mark set MARK }
//		chain input { type filter hook input priority filter; policy accept;
//			meta l4proto udp udp dport PORT @th,96,24 @encrypted_vnis meta secpath missing counter drop }
//		chain guard { type filter hook output priority filter; policy accept;
//			meta l4proto udp udp dport PORT @th,96,24 @encrypted_vnis rt ipsec missing counter drop }
//	}
//
// The output chain marks outbound VXLAN of encrypted VNIs; being of type
// route, it makes the kernel route the packet again, so the xfrm policy
// lookup sees the mark and applies ESP (or drops the packet while no SA
// exists). The guard chain, after the new route, drops such a packet if
// no xfrm policy took it: were our policies flushed from outside, or not
// yet programmed, the traffic stops rather than leave in clear. The input
// chain drops VXLAN of encrypted VNIs that did not arrive through IPsec.
// Other VNIs on the same port, and every other table (Docker's
// iptables-nft rules among them), are left alone.
//
// (nft shows "meta secpath missing" as "meta ipsec missing", and the set's
// 3-byte integer key as "type 0": google/nftables cannot attach the typeof
// annotation; `nft -j` says "integer". google/nftables does not parse "rt"
// back, so the guard rule it lists lacks that expression.)
//
// The table exists only while at least one VNI is enabled: the first
// EnableVNI creates it, the last DisableVNI deletes it. Every change is one
// netlink batch, applied atomically by the kernel.
package firewall

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
)

// Names inside the table.
const (
	DefaultTable = "overlay_plugin"
	SetName      = "encrypted_vnis"
	OutputChain  = "output"
	InputChain   = "input"
	GuardChain   = "guard"
)

// MaxVNI is the largest VXLAN network identifier (24 bits).
const MaxVNI = 1<<24 - 1

// metaKeySecpath is NFT_META_SECPATH (enum nft_meta_keys in
// linux/netfilter/nf_tables.h), which google/nftables and x/sys lack: a
// one-byte boolean, whether the packet has an IPsec security path.
const metaKeySecpath expr.MetaKey = 25

// rtKeyXFRM is NFT_RT_XFRM (enum nft_rt_keys), which google/nftables lacks:
// a one-byte boolean, whether the packet's route carries an xfrm bundle.
const rtKeyXFRM expr.RtKey = 4

// setID names the set inside a batch that creates it (any non-zero value
// unique in the batch). Setting it ourselves also keeps google/nftables
// from incrementing its unsynchronised package-level counter.
const setID = 1

// Firewall manages the table in one network namespace.
type Firewall struct {
	port  uint16
	mark  uint32
	table *nftables.Table

	// mu guards conn (its buffered batch) and vnis, and serialises changes
	// so that the kernel's table and vnis move together. It is a leaf
	// lock: nothing else is locked while it is held (only netlink I/O).
	mu   lockrank.Mutex[lockrank.Firewall]
	conn *nftables.Conn
	// vnis are the enabled VNIs; the table exists iff this is not empty
	// (as far as we know: Reconcile repairs outside interference).
	vnis map[uint32]struct{}
}

// Option adjusts a Firewall.
type Option func(*Firewall)

// WithTable names the table (default DefaultTable), for tests and for
// several instances side by side.
func WithTable(name string) Option {
	return func(f *Firewall) { f.table.Name = name }
}

// New returns a Firewall that programs through conn (nil: a connection to
// the caller's current network namespace; see Conn) for VXLAN on UDP port
// port, marking with mark. conn must not be used by anyone else. Nothing
// is programmed until the first EnableVNI.
func New(conn *nftables.Conn, port uint16, mark uint32, opts ...Option) *Firewall {
	if conn == nil {
		conn, _ = nftables.New() // cannot fail without AsLasting
	}
	f := &Firewall{
		port:  port,
		mark:  mark,
		table: &nftables.Table{Name: DefaultTable, Family: nftables.TableFamilyINet},
		conn:  conn,
		vnis:  map[uint32]struct{}{},
	}
	for _, o := range opts {
		o(f)
	}
	return f
}

// Conn returns an nftables connection to namespace ns (zero or
// netns.None(): the caller's current namespace). Every batch dials a fresh
// socket, so ns must stay open while the connection is used.
func Conn(ns netns.NsHandle) (*nftables.Conn, error) { return nftutil.Conn(ns) }

// Table returns the table's name.
func (f *Firewall) Table() string { return f.table.Name }

func checkVNI(vni uint32) error {
	if vni > MaxVNI {
		return fmt.Errorf("firewall: VNI %d exceeds 24 bits", vni)
	}
	return nil
}

// vniKey is the set key: the VNI's three bytes as they are on the wire.
func vniKey(vni uint32) []byte {
	return []byte{byte(vni >> 16), byte(vni >> 8), byte(vni)}
}

// vnisOf decodes the set's elements (vniKey), sorted.
func vnisOf(elems []nftables.SetElement) []uint32 {
	var out []uint32
	for _, e := range elems {
		if len(e.Key) >= 3 {
			out = append(out, uint32(e.Key[0])<<16|uint32(e.Key[1])<<8|uint32(e.Key[2]))
		}
	}
	slices.Sort(out)
	return out
}

func (f *Firewall) set() *nftables.Set {
	kt := nftables.TypeInteger
	kt.Bytes = 3
	return &nftables.Set{
		Table:        f.table,
		ID:           setID,
		Name:         SetName,
		KeyType:      kt,
		KeyByteOrder: binaryutil.BigEndian,
		Comment:      "VXLAN VNIs (@th,96,24) of encrypted overlay networks",
	}
}

func elements(vnis []uint32) []nftables.SetElement {
	out := make([]nftables.SetElement, len(vnis))
	for i, v := range vnis {
		out[i] = nftables.SetElement{Key: vniKey(v)}
	}
	return out
}

// match selects VXLAN to our port whose VNI is in the set. The VNI is
// bytes 4-6 of the VXLAN header, which follows the 8-byte UDP header:
// transport header offset 12, 3 bytes (nft: @th,96,24).
func (f *Firewall) match() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(f.port)},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 12, Len: 3},
		&expr.Lookup{SourceRegister: 1, SetName: SetName, SetID: setID},
	}
}

// OutputExprs, InputExprs and GuardExprs are the three rules, for tests
// and inspection.
func (f *Firewall) OutputExprs() []expr.Any {
	return append(f.match(),
		&expr.Counter{},
		&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(f.mark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	)
}

func (f *Firewall) InputExprs() []expr.Any {
	return append(f.match(),
		&expr.Meta{Key: metaKeySecpath, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0}},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	)
}

func (f *Firewall) GuardExprs() []expr.Any {
	return append(f.match(),
		&expr.Rt{Register: 1, Key: rtKeyXFRM},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0}},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	)
}

func (f *Firewall) chains() (out, in, guard *nftables.Chain) {
	accept := nftables.ChainPolicyAccept
	out = &nftables.Chain{Name: OutputChain, Table: f.table, Type: nftables.ChainTypeRoute,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityMangle, Policy: &accept}
	in = &nftables.Chain{Name: InputChain, Table: f.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	guard = &nftables.Chain{Name: GuardChain, Table: f.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	return out, in, guard
}

// queueRemove queues the removal of the table whether or not it exists.
// Caller holds mu.
func (f *Firewall) queueRemove() { nftutil.QueueRemoveTable(f.conn, f.table) }

// queueBuild queues the replacement of whatever table of that name exists
// (a previous run's, or one damaged from outside) by the full table with
// vnis. Caller holds mu.
func (f *Firewall) queueBuild(vnis []uint32) error {
	f.queueRemove()
	f.conn.AddTable(f.table)
	if err := f.conn.AddSet(f.set(), elements(vnis)); err != nil {
		return fmt.Errorf("firewall: queue set: %w", err)
	}
	out, in, guard := f.chains()
	f.conn.AddChain(out)
	f.conn.AddChain(in)
	f.conn.AddChain(guard)
	f.conn.AddRule(&nftables.Rule{Table: f.table, Chain: out, Exprs: f.OutputExprs(),
		UserData: nftutil.Comment("overlay-plugin: mark VXLAN of encrypted VNIs for IPsec")})
	f.conn.AddRule(&nftables.Rule{Table: f.table, Chain: in, Exprs: f.InputExprs(),
		UserData: nftutil.Comment("overlay-plugin: drop VXLAN of encrypted VNIs that bypassed IPsec")})
	f.conn.AddRule(&nftables.Rule{Table: f.table, Chain: guard, Exprs: f.GuardExprs(),
		UserData: nftutil.Comment("overlay-plugin: drop VXLAN of encrypted VNIs that no IPsec policy took")})
	return nil
}

// flush sends the queued batch; on failure the kernel applied none of it.
func (f *Firewall) flush(what string) error {
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("firewall: %s in table inet %s: %w", what, f.table.Name, err)
	}
	return nil
}

func (f *Firewall) sorted() []uint32 {
	out := make([]uint32, 0, len(f.vnis))
	for v := range f.vnis {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// EnableVNI starts marking and guarding VXLAN of vni. The first one
// creates the table (replacing any stale one of the same name); enabling
// an enabled VNI does nothing.
func (f *Firewall) EnableVNI(vni uint32) error {
	if err := checkVNI(vni); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.vnis[vni]; ok {
		return nil
	}
	if len(f.vnis) == 0 {
		if err := f.queueBuild([]uint32{vni}); err != nil {
			return err
		}
		if err := f.flush(fmt.Sprintf("create table with VNI %d", vni)); err != nil {
			return err
		}
		f.vnis[vni] = struct{}{}
		return nil
	}
	if err := f.conn.SetAddElements(f.set(), elements([]uint32{vni})); err != nil {
		return fmt.Errorf("firewall: queue VNI %d: %w", vni, err)
	}
	if err := f.flush(fmt.Sprintf("add VNI %d", vni)); err != nil {
		// The table may have been removed from outside: rebuild it.
		if rerr := f.rebuild(append(f.sorted(), vni)); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
	f.vnis[vni] = struct{}{}
	return nil
}

// DisableVNI stops treating vni as encrypted; after the last one the table
// goes. Disabling a VNI that is not enabled does nothing.
func (f *Firewall) DisableVNI(vni uint32) error {
	if err := checkVNI(vni); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.vnis[vni]; !ok {
		return nil
	}
	if len(f.vnis) == 1 {
		f.queueRemove()
		if err := f.flush("delete table"); err != nil {
			return err
		}
		delete(f.vnis, vni)
		return nil
	}
	if err := f.conn.SetDeleteElements(f.set(), elements([]uint32{vni})); err != nil {
		return fmt.Errorf("firewall: queue removal of VNI %d: %w", vni, err)
	}
	if err := f.flush(fmt.Sprintf("remove VNI %d", vni)); err != nil {
		// The element or the table went missing from outside: rebuild.
		rest := slices.DeleteFunc(f.sorted(), func(v uint32) bool { return v == vni })
		if rerr := f.rebuild(rest); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
	delete(f.vnis, vni)
	return nil
}

// rebuild replaces the table by one holding vnis, or removes it if vnis is
// empty. Caller holds mu.
func (f *Firewall) rebuild(vnis []uint32) error {
	if len(vnis) == 0 {
		f.queueRemove()
		return f.flush("delete table")
	}
	if err := f.queueBuild(vnis); err != nil {
		return err
	}
	return f.flush("rebuild table")
}

// Reconcile rewrites the table from what is enabled (or removes it when
// nothing is), in one atomic batch: it repairs a table flushed or edited
// from outside (for example by `nft flush ruleset`), at the price of
// resetting the counters. Call it at start (with nothing enabled it removes
// a previous run's table) or periodically.
func (f *Firewall) Reconcile() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rebuild(f.sorted())
}

// Keep takes over, as it is, the table a previous run left: its VNIs
// count as enabled, and their traffic stays marked and guarded without a
// moment's gap while the new run's sandboxes claim them (DisableVNI drops
// the others). It returns them; none if there is no table. Call it before
// any other change.
func (f *Firewall) Keep() ([]uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	present, err := nftutil.HasTable(f.conn, f.table)
	if err != nil {
		return nil, fmt.Errorf("firewall: %w", err)
	}
	if !present {
		return nil, nil
	}
	elems, err := f.conn.GetSetElements(f.set())
	if err != nil {
		return nil, fmt.Errorf("firewall: read the previous run's VNIs: %w", err)
	}
	for _, v := range vnisOf(elems) {
		f.vnis[v] = struct{}{}
	}
	return f.sorted(), nil
}

// Close removes the table and forgets every VNI. The Firewall may be used
// again afterwards.
func (f *Firewall) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queueRemove()
	if err := f.flush("delete table"); err != nil {
		return err
	}
	clear(f.vnis)
	return nil
}

// Counter is a rule's counter.
type Counter struct {
	Packets, Bytes uint64
}

// Status is what the kernel holds, for inspection.
type Status struct {
	Table   string
	Present bool     // the table exists
	Enabled []uint32 // VNIs enabled through this Firewall, sorted
	VNIs    []uint32 // VNIs in the kernel's set, sorted
	Marked  Counter  // outbound packets marked for IPsec
	Dropped Counter  // inbound plaintext packets dropped
	// Unprotected counts outbound packets dropped because no IPsec
	// policy took them.
	Unprotected Counter
	// Intact is false when the kernel's table differs from what was
	// programmed (missing table, set, chain or rule, or other VNIs); call
	// Reconcile to repair it.
	Intact bool
}

// Status reads the table back from the kernel.
func (f *Firewall) Status() (Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := Status{Table: f.table.Name, Enabled: f.sorted()}
	present, err := nftutil.HasTable(f.conn, f.table)
	if err != nil {
		return st, fmt.Errorf("firewall: %w", err)
	}
	st.Present = present
	if !st.Present {
		st.Intact = len(f.vnis) == 0
		return st, nil
	}
	intact := len(f.vnis) > 0
	elems, err := f.conn.GetSetElements(f.set())
	if err != nil {
		intact = false
	}
	st.VNIs = vnisOf(elems)
	if !slices.Equal(st.VNIs, st.Enabled) {
		intact = false
	}
	out, in, guard := f.chains()
	for _, c := range []struct {
		chain *nftables.Chain
		dst   *Counter
	}{{out, &st.Marked}, {in, &st.Dropped}, {guard, &st.Unprotected}} {
		rules, err := f.conn.GetRules(f.table, c.chain)
		if err != nil || len(rules) != 1 {
			intact = false
			continue
		}
		for _, e := range rules[0].Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				*c.dst = Counter{Packets: ctr.Packets, Bytes: ctr.Bytes}
			}
		}
	}
	st.Intact = intact
	return st, nil
}

// Counters reads the rules' packet counters, for the encryption status:
// packets marked for IPsec on the way out, and dropped for arriving in
// plaintext or leaving without an IPsec policy.
func (f *Firewall) Counters() (marked, plaintextDropped, unprotectedDropped uint64, err error) {
	st, err := f.Status()
	return st.Marked.Packets, st.Dropped.Packets, st.Unprotected.Packets, err
}

// Repair rebuilds the table only if it is not intact, so a periodic call
// keeps the counters while a flush from outside (which would let encrypted
// VNIs leave in clear) is undone within one period.
func (f *Firewall) Repair() error {
	st, err := f.Status()
	if err != nil {
		return err
	}
	if st.Intact {
		return nil
	}
	return f.Reconcile()
}
