package fakexfrm

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/encryption/xfrmtest"
)

func TestPolicies(t *testing.T) { xfrmtest.Policies(t, New()) }
func TestStates(t *testing.T)   { xfrmtest.States(t, New()) }

func TestFaultsAndNoESP(t *testing.T) {
	f := New()
	boom := errors.New("boom")
	f.SetFault(func(op string) error {
		if op == OpSetPolicy {
			return boom
		}
		return nil
	})
	if err := f.SetPolicy(xfrmtest.A, xfrmtest.B, xfrmtest.Port, 0x1001); !errors.Is(err, boom) {
		t.Fatalf("SetPolicy with a fault: %v", err)
	}
	xfrmtest.MustPolicies(t, f)
	if err := f.BlockPolicy(xfrmtest.A, xfrmtest.B, xfrmtest.Port); err != nil {
		t.Fatal(err)
	}
	f.SetFault(nil)
	if err := f.SetPolicy(xfrmtest.A, xfrmtest.B, xfrmtest.Port, 0x1001); err != nil {
		t.Fatal(err)
	}
	xfrmtest.MustPolicies(t, f, encryption.PolicyInfo{Src: xfrmtest.A, Dst: xfrmtest.B, Port: xfrmtest.Port, SPI: 0x1001})
	if f.Count(xfrmtest.B, 0x1001, 1, 100) {
		t.Fatal("Count of a missing state reported true")
	}
	if err := f.AddSA(xfrmtest.SA(xfrmtest.A, xfrmtest.B, 0x1001, 1)); err != nil {
		t.Fatal(err)
	}
	if !f.Count(xfrmtest.B, 0x1001, 2, 300) {
		t.Fatal("Count: state missing")
	}
	st := xfrmtest.MustStates(t, f, encryption.StateInfo{Src: xfrmtest.A, Dst: xfrmtest.B, SPI: 0x1001})
	if st[0].Packets != 2 || st[0].Bytes != 300 {
		t.Fatalf("counters %+v", st[0])
	}
	if k, ok := f.Key(xfrmtest.B, 0x1001); !ok || !bytes.Equal(k, xfrmtest.Key(1)) {
		t.Fatalf("Key: %x %v", k, ok)
	}
	want := []string{OpSetPolicy, OpPolicies, OpBlockPolicy, OpSetPolicy, OpPolicies, OpAddSA, OpStates}
	if got := f.Ops(); !slices.Equal(got, want) {
		t.Fatalf("ops %v, want %v", got, want)
	}

	f.SetCheckErr(NoESPError())
	if err := f.Check(); !errors.Is(err, encryption.ErrNoESP) {
		t.Fatalf("Check: %v", err)
	}
	if err := f.AddSA(xfrmtest.SA(xfrmtest.A, xfrmtest.B, 0x1002, 1)); !errors.Is(err, encryption.ErrNoESP) {
		t.Fatalf("AddSA without ESP: %v", err)
	}
	if err := f.BlockPolicy(xfrmtest.A, xfrmtest.C, xfrmtest.Port); err != nil { // policies still work
		t.Fatal(err)
	}
}
