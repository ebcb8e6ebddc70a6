// Package drivertest is the scaffold of tests that run a driver on the
// fake kernel: the host's underlay and a temporary state database with
// its VNI allocator. It does not import driver, so that driver's own
// tests can use it too (for them that import would be a cycle); each test
// package puts these in its driver.Config.
package drivertest

import (
	"net/netip"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/vni"
)

// VTEP is the test host's address.
var VTEP = netip.MustParseAddr("198.51.100.1")

// Underlay is a host whose one interface, Addr, has an MTU of 1500: a
// driver.Underlay.
type Underlay struct{ Addr netip.Addr }

func (u Underlay) DefaultAddr() (netip.Addr, error) { return u.Addr, nil }
func (Underlay) MTU(netip.Addr) (int, error)        { return 1500, nil }

// StateDB is a state database in a temporary file for one test, closed at
// its end.
func StateDB(t testing.TB) *bbolt.DB {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.NoSync = true // a test's database need not survive a power cut
	return db
}

// VNIs opens the VNI allocator on db, over the default range, as the
// plugin does.
func VNIs(t testing.TB, db *bbolt.DB) *vni.Allocator {
	t.Helper()
	alloc, err := vni.Open(db, vni.DefaultRange)
	if err != nil {
		t.Fatal(err)
	}
	return alloc
}
