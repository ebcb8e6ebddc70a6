package testbed

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/kernel"
)

// Neigh is a permanent neighbour entry on a sandbox's VXLAN device.
type Neigh struct{ IP, MAC string }

// FDB is a static FDB entry on a sandbox's VXLAN device.
type FDB struct{ MAC, VTEP string }

func (e Neigh) String() string { return e.IP + "->" + e.MAC }
func (e FDB) String() string   { return e.MAC + "->" + e.VTEP }

// SortNeigh sorts entries by IP, then MAC, and returns them.
func SortNeigh(s []Neigh) []Neigh {
	slices.SortFunc(s, func(a, b Neigh) int { return cmp.Or(cmp.Compare(a.IP, b.IP), cmp.Compare(a.MAC, b.MAC)) })
	return s
}

// SortFDB sorts entries by MAC, then VTEP, and returns them.
func SortFDB(s []FDB) []FDB {
	slices.SortFunc(s, func(a, b FDB) int { return cmp.Or(cmp.Compare(a.MAC, b.MAC), cmp.Compare(a.VTEP, b.VTEP)) })
	return s
}

// SandboxEntries reads the permanent neighbours and the device's own FDB
// entries of vxlan0 in a plugin's sandbox with ip and bridge, independently
// of the plugin, sorted.
func (p *Plugin) SandboxEntries(sandbox string) ([]Neigh, []FDB, error) {
	out, err := p.SandboxExec(sandbox, "ip", "-j", "neigh", "show", "dev", kernel.VXLANName)
	if err != nil {
		return nil, nil, err
	}
	var neighs []struct {
		Dst    string   `json:"dst"`
		LLAddr string   `json:"lladdr"`
		State  []string `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &neighs); err != nil {
		return nil, nil, fmt.Errorf("ip -j neigh: %w: %s", err, out)
	}
	ne := []Neigh{}
	for _, n := range neighs {
		if slices.Contains(n.State, "PERMANENT") {
			ip, err := netip.ParseAddr(n.Dst)
			if err != nil {
				return nil, nil, fmt.Errorf("ip -j neigh: dst %q: %w", n.Dst, err)
			}
			ne = append(ne, Neigh{ip.String(), n.LLAddr})
		}
	}
	out, err = p.SandboxExec(sandbox, "bridge", "-j", "fdb", "show", "dev", kernel.VXLANName)
	if err != nil {
		return nil, nil, err
	}
	var fdbs []struct {
		MAC    string `json:"mac"`
		Dst    string `json:"dst"`
		Master string `json:"master"`
	}
	if err := json.Unmarshal([]byte(out), &fdbs); err != nil {
		return nil, nil, fmt.Errorf("bridge -j fdb: %w: %s", err, out)
	}
	fe := []FDB{}
	for _, f := range fdbs {
		if f.Master != "" { // br0's entries; the device's own have no master
			continue
		}
		dst := f.Dst
		if a, err := netip.ParseAddr(dst); err == nil {
			dst = a.String()
		}
		fe = append(fe, FDB{f.MAC, dst})
	}
	return SortNeigh(ne), SortFDB(fe), nil
}

// ReportedEntries are the entries a plugin reports for its sandbox (the
// kernel section of its admin API), sorted, for comparing with
// SandboxEntries and WantTables.
func ReportedEntries(k *driver.KernelState) ([]Neigh, []FDB) {
	ne, fe := []Neigh{}, []FDB{}
	for _, n := range k.Neighbors {
		ne = append(ne, Neigh{IP: n.IP.String(), MAC: n.MAC.String()})
	}
	for _, e := range k.FDB {
		fe = append(fe, FDB{MAC: e.MAC.String(), VTEP: e.VTEP.String()})
	}
	return SortNeigh(ne), SortFDB(fe)
}
