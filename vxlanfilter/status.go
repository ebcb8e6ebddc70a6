package vxlanfilter

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
)

// kernelTable is the table as the kernel holds it.
type kernelTable struct {
	vnis  []uint32
	vteps []netip.Addr
	port  uint16
	// dropped counts per rule: IPv4 sources, IPv6 sources; droppedBy per
	// VNI (its set element's counter).
	dropped   [2]uint64
	droppedBy map[uint32]uint64
	// intact: both sets of sources, the chain and its two rules exist.
	intact bool
}

// read reads the table back. Caller holds mu.
func (f *Filter) read() (kernelTable, error) {
	var k kernelTable
	vs, s4, s6 := f.sets()
	elems, err := f.conn.GetSetElements(vs)
	if err != nil {
		return k, fmt.Errorf("set %s: %w", VNISet, err)
	}
	k.droppedBy = map[uint32]uint64{}
	for _, e := range elems {
		if len(e.Key) >= 3 {
			v := uint32(e.Key[0])<<16 | uint32(e.Key[1])<<8 | uint32(e.Key[2])
			k.vnis = append(k.vnis, v)
			if e.Counter != nil {
				k.droppedBy[v] = e.Counter.Packets
			}
		}
	}
	slices.Sort(k.vnis)
	k.intact = true
	for _, s := range []*nftables.Set{s4, s6} {
		elems, err := f.conn.GetSetElements(s)
		if err != nil {
			k.intact = false
			continue
		}
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				k.vteps = append(k.vteps, a)
			}
		}
	}
	slices.SortFunc(k.vteps, netip.Addr.Compare)
	rules, err := f.conn.GetRules(f.table, f.chain())
	if err != nil || len(rules) != 2 {
		k.intact = false
		return k, nil
	}
	for i, r := range rules {
		for j, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Counter:
				k.dropped[i] = e.Packets
			case *expr.Payload:
				// The port is the Cmp after the UDP destination port.
				if e.Base == expr.PayloadBaseTransportHeader && e.Offset == 2 && e.Len == 2 && j+1 < len(r.Exprs) {
					if c, ok := r.Exprs[j+1].(*expr.Cmp); ok && len(c.Data) == 2 {
						k.port = binary.BigEndian.Uint16(c.Data)
					}
				}
			}
		}
	}
	return k, nil
}

// Status is the filter as the kernel holds it, for `overlay-plugin state`
// and the metrics.
type Status struct {
	Table   string `json:"table"`
	Present bool   `json:"present"`
	Port    uint16 `json:"port,omitempty"`
	// VNIs and Sources are the kernel's sets; Inherited counts the
	// sources still admitted only because a previous run did.
	VNIs      []uint32     `json:"vnis"`
	Sources   []netip.Addr `json:"sources"`
	Members   int          `json:"members"`
	Inherited int          `json:"inherited"`
	// Dropped counts VXLAN of the plugin's VNIs from a source outside the
	// cluster, since the table was last built; DroppedByVNI per VNI, since
	// the VNI was last added.
	Dropped      uint64            `json:"dropped"`
	DroppedByVNI map[uint32]uint64 `json:"dropped_by_vni,omitempty"`
	// Intact is false when the kernel's table differs from the books;
	// Repair rebuilds it.
	Intact bool `json:"intact"`
}

// Status reads the table back from the kernel.
func (f *Filter) Status() (Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := Status{Table: f.table.Name, Members: len(f.b.members), Inherited: len(f.b.inheritedVTEPs)}
	present, err := nftutil.HasTable(f.conn, f.table)
	if err != nil {
		return st, fmt.Errorf("vxlan filter: %w", err)
	}
	wantVNIs, wantVTEPs := f.b.wantVNIs(), f.b.wantVTEPs()
	st.Present = present
	if !present {
		st.Intact = len(wantVNIs) == 0 || f.port == 0
		return st, nil
	}
	k, err := f.read()
	if err != nil {
		return st, nil // present but unreadable: not intact
	}
	st.Port, st.VNIs, st.Sources, st.Dropped, st.DroppedByVNI = k.port, k.vnis, k.vteps, k.dropped[0]+k.dropped[1], k.droppedBy
	st.Intact = k.intact && k.port == f.port && slices.Equal(k.vnis, wantVNIs) && slices.Equal(k.vteps, wantVTEPs)
	return st, nil
}

// DroppedByVNI reads each filtered VNI's drops, for the driver's state;
// false when the table cannot be read.
func (f *Filter) DroppedByVNI() (map[uint32]uint64, bool) {
	st, err := f.Status()
	if err != nil {
		return nil, false
	}
	return st.DroppedByVNI, true
}
