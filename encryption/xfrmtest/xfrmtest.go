// Package xfrmtest holds the behaviour every encryption.XFRM shares, as
// test functions (Policies, States) that the fake (fakexfrm) and the real
// one (netlinkxfrm) both pass, with the addresses and helpers their tests
// use.
package xfrmtest

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/encryption"
)

// Port is the VXLAN port of the policies the tests set.
const Port = 4789

// Hosts of the tests: documentation prefixes, never a real VTEP.
var (
	A  = netip.MustParseAddr("198.51.100.1")
	B  = netip.MustParseAddr("198.51.100.2")
	C  = netip.MustParseAddr("198.51.100.3")
	A6 = netip.MustParseAddr("2001:db8:100::1")
	B6 = netip.MustParseAddr("2001:db8:100::2")
)

// Key is a valid SA key made of b.
func Key(b byte) []byte { return bytes.Repeat([]byte{b}, encryption.KeyLen) }

// SA is the SA src→dst with spi and Key(keyByte).
func SA(src, dst netip.Addr, spi uint32, keyByte byte) encryption.SA {
	return encryption.SA{Direction: encryption.Direction{Src: src, Dst: dst, SrcGen: 1, DstGen: 2}, SPI: spi, Key: Key(keyByte)}
}

func sortedPolicies(p []encryption.PolicyInfo) []encryption.PolicyInfo {
	slices.SortFunc(p, func(a, b encryption.PolicyInfo) int {
		return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
	})
	return p
}

func sortedStates(s []encryption.StateInfo) []encryption.StateInfo {
	slices.SortFunc(s, func(a, b encryption.StateInfo) int {
		return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
	})
	return s
}

// MustPolicies fails t unless x holds exactly the policies want, in any
// order.
func MustPolicies(t *testing.T, x encryption.XFRM, want ...encryption.PolicyInfo) {
	t.Helper()
	got, err := x.Policies()
	if err != nil {
		t.Fatalf("Policies: %v", err)
	}
	got, want = sortedPolicies(got), sortedPolicies(want)
	if !slices.Equal(got, want) {
		t.Fatalf("policies:\n got %v\nwant %v", got, want)
	}
}

// MustStates fails t unless x holds exactly the states want, in any order,
// counters ignored, and returns them with their counters.
func MustStates(t *testing.T, x encryption.XFRM, want ...encryption.StateInfo) []encryption.StateInfo {
	t.Helper()
	got, err := x.States()
	if err != nil {
		t.Fatalf("States: %v", err)
	}
	bare := make([]encryption.StateInfo, len(got))
	for i, s := range got {
		bare[i] = encryption.StateInfo{Src: s.Src, Dst: s.Dst, SPI: s.SPI}
	}
	bare, want = sortedStates(bare), sortedStates(want)
	if !slices.Equal(bare, want) {
		t.Fatalf("states:\n got %v\nwant %v", got, want)
	}
	return got
}

// Policies checks x's policies: set, replaced in place, blocked, deleted
// (missing is fine), refused on bad input, flushed. x starts empty.
func Policies(t *testing.T, x encryption.XFRM) {
	MustPolicies(t, x)
	if err := x.SetPolicy(A, B, Port, 0x1001); err != nil {
		t.Fatal(err)
	}
	if err := x.SetPolicy(A, C, Port, 0x1002); err != nil {
		t.Fatal(err)
	}
	if err := x.BlockPolicy(A6, B6, Port); err != nil {
		t.Fatal(err)
	}
	MustPolicies(t, x,
		encryption.PolicyInfo{Src: A, Dst: B, Port: Port, SPI: 0x1001},
		encryption.PolicyInfo{Src: A, Dst: C, Port: Port, SPI: 0x1002},
		encryption.PolicyInfo{Src: A6, Dst: B6, Port: Port, SPI: 0})
	// Rotation and unblocking replace in place; setting twice is fine.
	for range 2 {
		if err := x.SetPolicy(A, B, Port, 0x2001); err != nil {
			t.Fatal(err)
		}
	}
	if err := x.SetPolicy(A6, B6, Port, 0x2003); err != nil {
		t.Fatal(err)
	}
	if err := x.BlockPolicy(A, C, Port); err != nil {
		t.Fatal(err)
	}
	MustPolicies(t, x,
		encryption.PolicyInfo{Src: A, Dst: B, Port: Port, SPI: 0x2001},
		encryption.PolicyInfo{Src: A, Dst: C, Port: Port, SPI: 0},
		encryption.PolicyInfo{Src: A6, Dst: B6, Port: Port, SPI: 0x2003})
	// Another port is another policy.
	if err := x.SetPolicy(A, B, 4790, 0x3001); err != nil {
		t.Fatal(err)
	}
	for range 2 { // deleting a missing policy is fine
		if err := x.DeletePolicy(A, B, Port); err != nil {
			t.Fatal(err)
		}
	}
	MustPolicies(t, x,
		encryption.PolicyInfo{Src: A, Dst: B, Port: 4790, SPI: 0x3001},
		encryption.PolicyInfo{Src: A, Dst: C, Port: Port, SPI: 0},
		encryption.PolicyInfo{Src: A6, Dst: B6, Port: Port, SPI: 0x2003})
	// Bad input.
	if err := x.SetPolicy(A, B6, Port, 1); err == nil {
		t.Error("SetPolicy across families succeeded")
	}
	if err := x.SetPolicy(A, B, Port, 0); err == nil {
		t.Error("SetPolicy with SPI 0 succeeded")
	}
	if err := x.BlockPolicy(netip.Addr{}, B, Port); err == nil {
		t.Error("BlockPolicy with an invalid source succeeded")
	}
	if err := x.Flush(); err != nil {
		t.Fatal(err)
	}
	MustPolicies(t, x)
}

// States checks x's SAs: added (again is fine), refused under a used
// (dst, SPI) or on bad input, deleted only by their owner, flushed. x
// starts empty and must support ESP.
func States(t *testing.T, x encryption.XFRM) {
	MustStates(t, x)
	ab, ba := SA(A, B, 0x1001, 1), SA(B, A, 0x1002, 2)
	ab6 := SA(A6, B6, 0x1003, 3)
	for _, sa := range []encryption.SA{ab, ba, ab6, ab} { // adding again is fine
		if err := x.AddSA(sa); err != nil {
			t.Fatalf("AddSA %v: %v", sa.Direction, err)
		}
	}
	MustStates(t, x,
		encryption.StateInfo{Src: A, Dst: B, SPI: 0x1001},
		encryption.StateInfo{Src: B, Dst: A, SPI: 0x1002},
		encryption.StateInfo{Src: A6, Dst: B6, SPI: 0x1003})
	// The kernel knows states by (dst, SPI): another key or source under
	// a used pair must not pass silently.
	if err := x.AddSA(SA(A, B, 0x1001, 9)); err == nil {
		t.Error("AddSA with another key under a used SPI succeeded")
	}
	if err := x.AddSA(SA(C, B, 0x1001, 1)); err == nil {
		t.Error("AddSA from another source under a used SPI succeeded")
	}
	bad := ab
	bad.Key = bad.Key[:16]
	if err := x.AddSA(bad); err == nil {
		t.Error("AddSA with a short key succeeded")
	}
	bad = ab
	bad.SPI = 7
	if err := x.AddSA(bad); err == nil {
		t.Error("AddSA with a reserved SPI succeeded")
	}
	// DeleteSA of someone else's pair leaves the state; missing is fine.
	if err := x.DeleteSA(C, B, 0x1001); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := x.DeleteSA(A, B, 0x1001); err != nil {
			t.Fatal(err)
		}
	}
	MustStates(t, x,
		encryption.StateInfo{Src: B, Dst: A, SPI: 0x1002},
		encryption.StateInfo{Src: A6, Dst: B6, SPI: 0x1003})
	if err := x.Flush(); err != nil {
		t.Fatal(err)
	}
	MustStates(t, x)
}
