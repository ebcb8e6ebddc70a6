// Package vxlanfilter admits VXLAN of the plugin's networks only from the
// VTEPs of the cluster, in an nftables table of its own:
//
//	table inet overlay_plugin_vxlan {
//		set vnis { type integer (3 bytes, the VNI as on the wire) }
//		set vteps4 { type ipv4_addr }
//		set vteps6 { type ipv6_addr }
//		chain input { type filter hook input priority filter; policy accept;
//			meta l4proto udp udp dport PORT meta nfproto ipv4 ip saddr != @vteps4 @th,96,24 @vnis counter drop
//			meta l4proto udp udp dport PORT meta nfproto ipv6 ip6 saddr != @vteps6 @th,96,24 @vnis counter drop
//		}
//
// The set of VNIs has a counter per element: each network's drops.
//
//	}
//
// Without it, anyone who reaches the VXLAN port of a host can deliver a
// frame into an unencrypted network by naming its VNI and a container's MAC
// (moby #47667; Docker guards only encrypted networks). The plugin knows
// every member's VTEP, so it admits those and drops the rest, counted.
// VNIs that are not the plugin's (Docker's own overlay among them) and
// every other table are left alone. An attacker who can forge a member's
// source address still gets through: only encryption stops that.
//
// The table exists while a VNI is filtered and the VXLAN port is known.
// Every change is one netlink batch; a batch that fails rebuilds the
// whole table in one more, so the kernel never holds half a change.
package vxlanfilter

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
)

// Names inside the table.
const (
	DefaultTable = "overlay_plugin_vxlan"
	VNISet       = "vnis"
	VTEP4Set     = "vteps4"
	VTEP6Set     = "vteps6"
	InputChain   = "input"
)

// maxVNI is the largest VXLAN network identifier (24 bits).
const maxVNI = 1<<24 - 1

// Set ids inside a batch that creates the sets (non-zero, unique per
// batch); setting them keeps google/nftables from using its
// unsynchronised package-level counter.
const (
	vniSetID = iota + 1
	vtep4SetID
	vtep6SetID
)

// Filter keeps the table in one network namespace.
type Filter struct {
	table *nftables.Table

	// mu guards everything below and serialises changes, so that the
	// kernel's table and the books move together. Rank SourceFilter: taken
	// under a driver network's lock, and a leaf (only netlink I/O under
	// it).
	mu   lockrank.Mutex[lockrank.SourceFilter]
	conn *nftables.Conn
	// port is the VXLAN port; 0 until SetPort (the table waits for it).
	port uint16
	b    books
	// What the kernel's table holds, as far as we know: built says it
	// exists; tablePort is the port its rules match.
	built     bool
	tablePort uint16
	haveVNIs  []uint32
	haveVTEPs []netip.Addr
}

// New returns a Filter that programs through conn (nil: the caller's
// current namespace) into table (empty: DefaultTable). conn must not be
// used by anyone else. Nothing is programmed until a VNI is added and the
// port is set.
func New(conn *nftables.Conn, table string) *Filter {
	if conn == nil {
		conn, _ = nftables.New() // cannot fail without AsLasting
	}
	if table == "" {
		table = DefaultTable
	}
	return &Filter{table: &nftables.Table{Name: table, Family: nftables.TableFamilyINet}, conn: conn, b: newBooks()}
}

func vniKey(vni uint32) []byte { return []byte{byte(vni >> 16), byte(vni >> 8), byte(vni)} }

func (f *Filter) sets() (vnis, v4, v6 *nftables.Set) {
	kt := nftables.TypeInteger
	kt.Bytes = 3
	// Each VNI's counter counts its drops: the lookup comes last.
	vnis = &nftables.Set{Table: f.table, ID: vniSetID, Name: VNISet, KeyType: kt, KeyByteOrder: binaryutil.BigEndian,
		Counter: true, Comment: "VXLAN VNIs (@th,96,24) of the plugin's networks on this host"}
	v4 = &nftables.Set{Table: f.table, ID: vtep4SetID, Name: VTEP4Set, KeyType: nftables.TypeIPAddr,
		Comment: "VTEPs of the cluster's members and of remote endpoints"}
	v6 = &nftables.Set{Table: f.table, ID: vtep6SetID, Name: VTEP6Set, KeyType: nftables.TypeIP6Addr,
		Comment: "VTEPs of the cluster's members and of remote endpoints"}
	return vnis, v4, v6
}

func vniElements(vnis []uint32) []nftables.SetElement {
	out := make([]nftables.SetElement, len(vnis))
	for i, v := range vnis {
		out[i] = nftables.SetElement{Key: vniKey(v)}
	}
	return out
}

// vtepElements splits addrs by family into set elements.
func vtepElements(addrs []netip.Addr) (v4, v6 []nftables.SetElement) {
	for _, a := range addrs {
		if a.Is4() {
			v4 = append(v4, nftables.SetElement{Key: a.AsSlice()})
		} else {
			v6 = append(v6, nftables.SetElement{Key: a.AsSlice()})
		}
	}
	return v4, v6
}

// ruleExprs is one family's rule: VXLAN to port from a source not in the
// family's set, with a filtered VNI, is counted and dropped. The VNI is
// bytes 4-6 of the VXLAN header, after the 8-byte UDP header
// (@th,96,24); its lookup comes last so that its element's counter counts
// that network's drops only.
func ruleExprs(port uint16, six bool) []expr.Any {
	proto, set, off, n := byte(unix.NFPROTO_IPV4), VTEP4Set, uint32(12), uint32(4)
	id := uint32(vtep4SetID)
	if six {
		proto, set, off, n, id = unix.NFPROTO_IPV6, VTEP6Set, 8, 16, vtep6SetID
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: set, SetID: id, Invert: true},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 12, Len: 3},
		&expr.Lookup{SourceRegister: 1, SetName: VNISet, SetID: vniSetID},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

func (f *Filter) chain() *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: InputChain, Table: f.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
}

// flush sends the queued batch; on failure the kernel applied none of it.
func (f *Filter) flush(what string) error {
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("vxlan filter: %s in table inet %s: %w", what, f.table.Name, err)
	}
	return nil
}

// build replaces whatever table of that name exists by the full table
// the books want, in one batch. Caller holds mu; f.port is set.
func (f *Filter) build(vnis []uint32, vteps []netip.Addr) error {
	nftutil.QueueRemoveTable(f.conn, f.table)
	f.conn.AddTable(f.table)
	vs, s4, s6 := f.sets()
	e4, e6 := vtepElements(vteps)
	for _, s := range []struct {
		set   *nftables.Set
		elems []nftables.SetElement
	}{{vs, vniElements(vnis)}, {s4, e4}, {s6, e6}} {
		if err := f.conn.AddSet(s.set, s.elems); err != nil {
			return fmt.Errorf("vxlan filter: queue set %s: %w", s.set.Name, err)
		}
	}
	c := f.chain()
	f.conn.AddChain(c)
	for _, six := range []bool{false, true} {
		f.conn.AddRule(&nftables.Rule{Table: f.table, Chain: c, Exprs: ruleExprs(f.port, six),
			UserData: nftutil.Comment("overlay-plugin: drop VXLAN of the plugin's networks from a source outside the cluster")})
	}
	if err := f.flush("build table"); err != nil {
		return err
	}
	f.built, f.tablePort, f.haveVNIs, f.haveVTEPs = true, f.port, vnis, vteps
	return nil
}

func (f *Filter) remove() error {
	nftutil.QueueRemoveTable(f.conn, f.table)
	if err := f.flush("delete table"); err != nil {
		return err
	}
	f.built, f.tablePort, f.haveVNIs, f.haveVTEPs = false, 0, nil, nil
	return nil
}

// sync brings the table to what the books want: built, changed or
// removed. An incremental batch that fails (the table edited or flushed
// from outside) is followed by a rebuild. Caller holds mu.
func (f *Filter) sync() error {
	vnis, vteps := f.b.wantVNIs(), f.b.wantVTEPs()
	switch {
	case len(vnis) == 0:
		if f.built {
			return f.remove()
		}
		return nil
	case f.port == 0 && !f.built:
		return nil // the table waits for the port
	case f.port != 0 && (!f.built || f.tablePort != f.port):
		return f.build(vnis, vteps)
	}
	err := f.change(vnis, vteps)
	if err == nil || f.port == 0 {
		return err
	}
	if rerr := f.build(vnis, vteps); rerr != nil {
		return errors.Join(err, rerr)
	}
	return nil
}

// change queues the difference between the table and the books as one
// batch. Caller holds mu; the table is built.
func (f *Filter) change(vnis []uint32, vteps []netip.Addr) error {
	addV, delV := diff(vnis, f.haveVNIs, func(a, b uint32) int { return int(a) - int(b) })
	addA, delA := diff(vteps, f.haveVTEPs, netip.Addr.Compare)
	if len(addV)+len(delV)+len(addA)+len(delA) == 0 {
		return nil
	}
	vs, s4, s6 := f.sets()
	// Sources go in before VNIs are filtered, and VNIs stop being filtered
	// before sources go: a batch is atomic anyway, but its order is the
	// one the books are written in.
	a4, a6 := vtepElements(addA)
	d4, d6 := vtepElements(delA)
	var errs []error
	queue := func(fn func(*nftables.Set, []nftables.SetElement) error, s *nftables.Set, e []nftables.SetElement) {
		if len(e) > 0 {
			errs = append(errs, fn(s, e))
		}
	}
	queue(f.conn.SetAddElements, s4, a4)
	queue(f.conn.SetAddElements, s6, a6)
	queue(f.conn.SetAddElements, vs, vniElements(addV))
	queue(f.conn.SetDeleteElements, vs, vniElements(delV))
	queue(f.conn.SetDeleteElements, s4, d4)
	queue(f.conn.SetDeleteElements, s6, d6)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("vxlan filter: queue change: %w", err)
	}
	if err := f.flush(fmt.Sprintf("change (+%d -%d VNIs, +%d -%d sources)", len(addV), len(delV), len(addA), len(delA))); err != nil {
		return err
	}
	f.haveVNIs, f.haveVTEPs = vnis, vteps
	return nil
}

func checkVNI(vni uint32) error {
	if vni == 0 || vni > maxVNI {
		return fmt.Errorf("vxlan filter: VNI %d is not a VXLAN network identifier", vni)
	}
	return nil
}

// update applies fn to the books and the result to the kernel. The books
// keep the change when the kernel refuses it: they are the desired state,
// and Repair retries.
func (f *Filter) update(fn func(b *books)) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.b)
	return f.sync()
}

// SetPort sets the VXLAN port the rules match; the table is (re)built
// with it if there is anything to filter.
func (f *Filter) SetPort(port uint16) error {
	if port == 0 {
		return errors.New("vxlan filter: port 0")
	}
	return f.update(func(*books) { f.port = port })
}

// AddVNI starts filtering vni (a sandbox of this host uses it); adding a
// filtered VNI does nothing.
func (f *Filter) AddVNI(vni uint32) error {
	if err := checkVNI(vni); err != nil {
		return err
	}
	return f.update(func(b *books) { b.vnis[vni] = true })
}

// RemoveVNI stops filtering vni, unless it is inherited.
func (f *Filter) RemoveVNI(vni uint32) error {
	return f.update(func(b *books) { delete(b.vnis, vni) })
}

// AddRemote takes a reference on vtep as a source: a sandbox is about to
// send to it, and it answers.
func (f *Filter) AddRemote(vtep netip.Addr) error {
	if !vtep.IsValid() {
		return errors.New("vxlan filter: invalid VTEP")
	}
	return f.update(func(b *books) { b.refs.Add(vtep.Unmap(), 1) })
}

// RemoveRemote drops a reference AddRemote took.
func (f *Filter) RemoveRemote(vtep netip.Addr) error {
	return f.update(func(b *books) { b.refs.Add(vtep.Unmap(), -1) })
}

// SetMembers makes vteps the live members' VTEPs (this host's own among
// them or not: it does not matter).
func (f *Filter) SetMembers(vteps []netip.Addr) error {
	return f.update(func(b *books) {
		clear(b.members)
		for _, a := range vteps {
			if a.IsValid() {
				b.members[a.Unmap()] = true
			}
		}
	})
}

// Keep takes over, as it is, the table a previous run left: its VNIs and
// sources stay admitted, without a moment's gap, until ReleaseInherited.
// It returns how many of each it took. Call it before any other change.
func (f *Filter) Keep() (vnis, vteps int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	present, err := nftutil.HasTable(f.conn, f.table)
	if err != nil || !present {
		return 0, 0, err
	}
	k, err := f.read()
	if err != nil {
		return 0, 0, fmt.Errorf("vxlan filter: read the previous run's table: %w", err)
	}
	for _, v := range k.vnis {
		f.b.inheritedVNIs[v] = true
	}
	for _, a := range k.vteps {
		f.b.inheritedVTEPs[a] = true
	}
	f.built, f.tablePort, f.haveVNIs, f.haveVTEPs = true, k.port, k.vnis, k.vteps
	if !k.intact {
		// Rebuilt with the port once it is known (sync compares it).
		f.tablePort = 0
	}
	return len(k.vnis), len(k.vteps), nil
}

// Inherit admits vteps until ReleaseInherited, as if the previous run's
// table had: the hosts the adopted sandboxes still send to, when there
// was no table to take over.
func (f *Filter) Inherit(vteps []netip.Addr) error {
	return f.update(func(b *books) {
		for _, a := range vteps {
			if a.IsValid() {
				b.inheritedVTEPs[a.Unmap()] = true
			}
		}
	})
}

// ReleaseInherited forgets what Keep took over: from now on only the
// members and the sandboxes' references admit a source.
func (f *Filter) ReleaseInherited() error {
	return f.update(func(b *books) { b.release() })
}

// Close removes the table and forgets everything; for a plugin started
// with the filter turned off, so that a previous run's table goes.
func (f *Filter) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.b = newBooks()
	return f.remove()
}

// Repair rebuilds the table when the kernel's differs from the books (a
// flush or edit from outside, or a change the kernel refused); a periodic
// call keeps the counters otherwise.
func (f *Filter) Repair() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	vnis, vteps := f.b.wantVNIs(), f.b.wantVTEPs()
	if len(vnis) == 0 || f.port == 0 {
		return f.sync()
	}
	k, err := f.read()
	if err == nil && k.intact && k.port == f.port && slices.Equal(k.vnis, vnis) && slices.Equal(k.vteps, vteps) {
		return nil
	}
	return f.build(vnis, vteps)
}
