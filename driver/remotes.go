package driver

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"github.com/overlay-plugin/overlay-plugin/check"
	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
)

// RemoteVTEP is a remote VTEP this host's sandboxes send to, with the
// largest MTU of the networks that reach it; ESPMTU is that of the
// encrypted ones, 0 when none does.
type RemoteVTEP struct {
	VTEP        netip.Addr
	MTU, ESPMTU int
}

// RemoteVTEPs lists the remote VTEPs that have FDB entries in a sandbox,
// sorted: the data paths worth probing. Each network is read under its
// lock, one at a time.
func (d *Driver) RemoteVTEPs() []RemoteVTEP {
	by := map[netip.Addr]RemoteVTEP{}
	for _, id := range d.networkIDs() {
		n := d.lockNetwork(id)
		if n == nil {
			continue
		}
		if n.sandbox != "" {
			for vtep := range n.planner.fdb {
				r := by[vtep]
				r.VTEP, r.MTU = vtep, max(r.MTU, n.mtu)
				if n.opts.encrypted {
					r.ESPMTU = max(r.ESPMTU, n.mtu)
				}
				by[vtep] = r
			}
		}
		n.mu.Unlock()
	}
	out := make([]RemoteVTEP, 0, len(by))
	for _, r := range by {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b RemoteVTEP) int { return a.VTEP.Compare(b.VTEP) })
	return out
}

// CheckInputs fills in what the driver knows for the check: the networks
// it refused, the reconcilers' repairs, whether nf_tables serves here.
func (d *Driver) CheckInputs(in *check.Inputs) {
	if err := nftutil.Available(); err != nil {
		in.NFTables = err.Error()
	}
	in.Refused = map[string]string{}
	for _, r := range d.refused.list() {
		in.Refused[r.id] = r.Reason
	}
	in.RepairPasses, in.LastRepair = d.RepairPasses()
}

// OverlayMTU is the MTU this host gives a network that sets none: the
// underlay's less VXLAN's overhead, and less ESP's for an encrypted one.
func (d *Driver) OverlayMTU(encrypted bool) (int, error) {
	local, err := d.localVTEP()
	if err != nil {
		return 0, err
	}
	var enc Encryption
	if encrypted {
		if enc = d.encryption(); enc == nil {
			return 0, fmt.Errorf("%w: no encryption", ErrNotFound)
		}
	}
	_, mtu, err := d.overlayMTU(local, enc)
	return mtu, err
}

// overlayMTU reads the underlay's MTU at local and returns it with what
// it leaves a network through enc (nil: unencrypted).
func (d *Driver) overlayMTU(local netip.Addr, enc Encryption) (underMTU, mtu int, err error) {
	underMTU, err = d.underlay.MTU(local)
	if err != nil {
		return 0, 0, fmt.Errorf("underlay MTU: %w", err)
	}
	mtu = underMTU - overheadIPv4
	if local.Is6() {
		mtu = underMTU - overheadIPv6
	}
	if enc != nil {
		mtu -= enc.Overhead()
	}
	return underMTU, mtu, nil
}

// UnderlayMTU is the MTU of the interface that carries local, this host's
// VTEP (which the control plane knows before the driver's data path is
// settled).
func (d *Driver) UnderlayMTU(local netip.Addr) (int, error) {
	return d.underlay.MTU(local)
}

// SetMTUFloor gives AllocateNetwork the smallest underlay MTU among the
// nodes and the name of a node that has it (the control plane's), so a
// network gets an MTU every host can carry.
func (d *Driver) SetMTUFloor(floor func() (underlayMTU int, node string)) {
	d.mtuFloor.Store(&floor)
}

// lowerMTU sets the MTU option in out when the user gave none and the
// nodes' underlay MTUs are known: the smallest underlay's (this host's
// included) less the encapsulation, so every host uses the same MTU (each
// still takes its own if smaller). It says so when another node's
// underlay is the smaller.
func (d *Driver) lowerMTU(id string, opts netOptions, out map[string]string) {
	f := d.mtuFloor.Load()
	if opts.mtu != 0 || f == nil {
		return
	}
	under, node := (*f)()
	local, err := d.localVTEP()
	if err != nil || under <= 0 {
		return
	}
	ownUnder, ownMTU, err := d.overlayMTU(local, nil)
	if err != nil {
		return
	}
	mtu := ownMTU - max(0, ownUnder-under)
	if opts.encrypted {
		if enc := d.encryption(); enc != nil {
			mtu -= enc.Overhead()
		}
	}
	if mtu < minMTU {
		return // the option refuses it: each host takes its own, and check says
	}
	out[OptMTU] = strconv.Itoa(mtu)
	if under < ownUnder {
		d.log.Info("network MTU lowered", "network", id, "mtu", mtu, "node", node, "underlay_mtu", under,
			"why", "another node's underlay carries less than this host's; every host uses the smallest")
	}
}
