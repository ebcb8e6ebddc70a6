package driver

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
)

// Resync makes every sandbox's neighbour and FDB entries exactly what its
// peer db implies, reading the kernel back: it removes entries of peers
// that went while the plugin was down (adopted sandboxes), and repairs
// entries changed from outside. Each network is done under its own lock.
// It returns the number of entries added and removed.
func (d *Driver) Resync() (added, removed int, err error) {
	var errs []error
	for _, id := range d.networkIDs() {
		n := d.lockNetwork(id)
		if n == nil {
			continue
		}
		a, r, err := d.resync(n)
		n.mu.Unlock()
		added, removed = added+a, removed+r
		errs = append(errs, err)
	}
	return added, removed, errors.Join(errs...)
}

// resync works on one network. Caller holds n.mu.
func (d *Driver) resync(n *network) (added, removed int, _ error) {
	if n.sandbox == "" {
		return 0, 0, nil
	}
	wantNeigh := map[netip.Addr]hwaddr.MAC{}
	wantFDB := map[kernel.FDBEntry]bool{}
	for ip, b := range n.peers.Bindings() {
		if b.Local {
			continue
		}
		wantNeigh[ip] = b.MAC
		wantFDB[kernel.FDBEntry{MAC: b.MAC, VTEP: b.VTEP}] = true
		if n.opts.flood {
			wantFDB[kernel.FDBEntry{VTEP: b.VTEP}] = true
		}
	}
	neighs, err := d.kernel.Neighbors(n.sandbox)
	if err != nil {
		return 0, 0, fmt.Errorf("resync network %s: %w", n.id, err)
	}
	fdb, err := d.kernel.FDB(n.sandbox)
	if err != nil {
		return 0, 0, fmt.Errorf("resync network %s: %w", n.id, err)
	}
	var errs []error
	for _, nb := range neighs {
		if mac, ok := wantNeigh[nb.IP]; ok && mac == nb.MAC {
			delete(wantNeigh, nb.IP)
			continue
		}
		if _, ok := wantNeigh[nb.IP]; ok {
			continue // wrong MAC: SetNeighbor below replaces it
		}
		if err := d.kernel.DeleteNeighbor(n.sandbox, nb.IP); err != nil && !errors.Is(err, kernel.ErrNotFound) {
			errs = append(errs, err)
		}
		removed++
	}
	for ip, mac := range wantNeigh {
		if err := d.kernel.SetNeighbor(n.sandbox, kernel.Neighbor{IP: ip, MAC: mac}); err != nil {
			errs = append(errs, err)
		}
		added++
	}
	for _, e := range fdb {
		if wantFDB[e] {
			delete(wantFDB, e)
			continue
		}
		if err := d.kernel.DeleteFDB(n.sandbox, e); err != nil && !errors.Is(err, kernel.ErrNotFound) {
			errs = append(errs, err)
		}
		removed++
	}
	for e := range wantFDB {
		if err := d.kernel.AddFDB(n.sandbox, e); err != nil {
			errs = append(errs, err)
		}
		added++
	}
	if added+removed > 0 {
		d.log.Info("resynchronised sandbox with the peer db", "network", n.id, "added", added, "removed", removed)
	}
	return added, removed, errors.Join(errs...)
}
