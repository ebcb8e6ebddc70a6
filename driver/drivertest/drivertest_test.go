package drivertest

import "testing"

func TestScaffold(t *testing.T) {
	u := Underlay{Addr: VTEP}
	if a, err := u.DefaultAddr(); a != VTEP || err != nil {
		t.Errorf("DefaultAddr() = %v, %v; want %v", a, err, VTEP)
	}
	if mtu, err := u.MTU(VTEP); mtu != 1500 || err != nil {
		t.Errorf("MTU() = %d, %v; want 1500", mtu, err)
	}
	db := StateDB(t)
	vnis := VNIs(t, db)
	if _, err := vnis.Allocate("n1"); err != nil {
		t.Errorf("a fresh allocator cannot allocate: %v", err)
	}
}
