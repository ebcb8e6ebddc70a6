// Package firewalltest is an in-memory firewall for tests of the
// encryption side (encryption.Firewall): the set of VNIs whose traffic
// the rules would hold to IPsec.
package firewalltest

import (
	"maps"
	"slices"
	"sync"
)

// Fake is an in-memory encryption.Firewall. Like the kernel's table, it
// outlives a manager's "restart": Keep returns what was enabled.
type Fake struct {
	// mu guards vnis. A leaf lock, taken under the encryption mutex.
	mu   sync.Mutex
	vnis map[uint32]bool
}

// New returns a firewall with no VNI.
func New() *Fake { return &Fake{vnis: map[uint32]bool{}} }

// EnableVNI, DisableVNI, Repair, Counters and Keep are encryption.Firewall.
func (f *Fake) EnableVNI(v uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vnis[v] = true
	return nil
}

func (f *Fake) DisableVNI(v uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.vnis, v)
	return nil
}

func (f *Fake) Repair() error { return nil }

func (f *Fake) Counters() (uint64, uint64, uint64, error) { return 0, 0, 0, nil }

func (f *Fake) Keep() ([]uint32, error) { return f.VNIs(), nil }

// Enabled reports whether v is enabled.
func (f *Fake) Enabled(v uint32) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.vnis[v]
}

// VNIs are the enabled VNIs, sorted.
func (f *Fake) VNIs() []uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.vnis))
}
