package fakekernel

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/kerneltest"
)

// TestContract: the fake keeps the rules the netlink kernel keeps
// (kernel/netlink_test.go runs the same suite against it).
func TestContract(t *testing.T) {
	kerneltest.Run(t, func(t *testing.T) kerneltest.Harness {
		k := New()
		return kerneltest.Harness{
			K: k,
			Outside: func(t *testing.T, sandbox string, ops ...kernel.EntryOp) {
				t.Helper()
				if err := k.OutsideChange(sandbox, ops...); err != nil {
					t.Fatal(err)
				}
			},
			Break: func(t *testing.T, sandbox, device string) {
				t.Helper()
				if err := k.BreakDevice(sandbox, device); err != nil {
					t.Fatal(err)
				}
			},
			Fail: func(kind kernel.EntryOpKind, err error) {
				k.SetFault(func(op Op, _ string) error {
					if op == faultOp[kind] {
						return err
					}
					return nil
				})
			},
		}
	})
}

func TestReleaseEntries(t *testing.T) {
	k := New()
	if err := k.CreateSandbox(kerneltest.Spec("sb", 256, kerneltest.Local)); err != nil {
		t.Fatal(err)
	}
	ip, vtep := netip.MustParseAddr("10.0.0.2"), kerneltest.V1
	mac := hwaddr.MAC{0x02, 0x42, 10, 0, 0, 2}
	kerneltest.Program(t, k, "sb", kerneltest.SetNeighbor(ip, mac), kerneltest.AddFDB(mac, vtep))
	if n := k.ReleaseEntries(); n != 2 {
		t.Fatalf("released %d entries, want 2", n)
	}
	kerneltest.MustEntries(t, k, "sb", nil, nil)
	if names, _ := k.Sandboxes(); !slices.Equal(names, []string{"sb"}) {
		t.Errorf("sandboxes %v, want [sb]", names)
	}
	// The MAC index went too: the entry can be added again, alone.
	kerneltest.Program(t, k, "sb", kerneltest.AddFDB(mac, vtep))
	kerneltest.MustEntries(t, k, "sb", nil, []kernel.FDBEntry{{MAC: mac, VTEP: vtep}})
}
