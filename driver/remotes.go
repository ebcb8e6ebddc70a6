package driver

import (
	"fmt"
	"net/netip"
	"slices"
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
