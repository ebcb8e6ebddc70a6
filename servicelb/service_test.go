package servicelb

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

var a = netip.MustParseAddr

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = a(s)
	}
	return out
}

func TestNormalizeCanonical(t *testing.T) {
	in := []Service{
		{Name: "v6", VIP: a("fd00::100"), Backends: addrs("fd00::3", "fd00::1", "fd00::3")},
		{Name: "web", VIP: a("203.0.113.100"), Backends: addrs("203.0.113.2", "203.0.113.1", "203.0.113.2")},
		{Name: "none", VIP: a("203.0.113.101"), Backends: []netip.Addr{}},
	}
	orig := []netip.Addr{in[1].Backends[0], in[1].Backends[1], in[1].Backends[2]}
	got, err := Normalize(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []Service{
		{Name: "web", VIP: a("203.0.113.100"), Backends: addrs("203.0.113.1", "203.0.113.2")},
		{Name: "none", VIP: a("203.0.113.101")},
		{Name: "v6", VIP: a("fd00::100"), Backends: addrs("fd00::1", "fd00::3")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Normalize:\n got %v\nwant %v", got, want)
	}
	if !reflect.DeepEqual(in[1].Backends, orig) {
		t.Errorf("Normalize changed its input: %v", in[1].Backends)
	}
	// Any order of the same input gives the same output.
	again, err := Normalize([]Service{in[2], in[0], in[1]})
	if err != nil || !reflect.DeepEqual(again, want) {
		t.Errorf("Normalize of a permutation: %v, %v", again, err)
	}
	if got, err := Normalize(nil); err != nil || len(got) != 0 {
		t.Errorf("Normalize(nil) = %v, %v", got, err)
	}
}

func TestNormalizeRefuses(t *testing.T) {
	ok := Service{Name: "ok", VIP: a("203.0.113.100"), Backends: addrs("203.0.113.1")}
	for _, c := range []struct {
		name string
		svcs []Service
		msg  string
	}{
		{"zero VIP", []Service{{Name: "x"}}, "bad VIP: no address"},
		{"unspecified VIP", []Service{{Name: "x", VIP: a("0.0.0.0")}}, "unspecified"},
		{"unspecified v6 VIP", []Service{{Name: "x", VIP: a("::")}}, "unspecified"},
		{"loopback VIP", []Service{{Name: "x", VIP: a("127.0.0.11")}}, "loopback"},
		{"multicast VIP", []Service{{Name: "x", VIP: a("ff02::1")}}, "multicast"},
		{"zoned VIP", []Service{{Name: "x", VIP: a("fe80::1%eth0")}}, "zone"},
		{"mapped VIP", []Service{{Name: "x", VIP: a("::ffff:203.0.113.100")}}, "IPv4-mapped"},
		{"zero backend", []Service{{Name: "x", VIP: a("203.0.113.100"), Backends: []netip.Addr{{}}}}, "bad backend"},
		{"v6 backend of v4 VIP", []Service{{Name: "x", VIP: a("203.0.113.100"), Backends: addrs("fd00::1")}}, "family"},
		{"v4 backend of v6 VIP", []Service{{Name: "x", VIP: a("fd00::100"), Backends: addrs("203.0.113.1")}}, "family"},
		{"duplicate VIP", []Service{ok, {Name: "y", VIP: ok.VIP}}, "VIP given twice"},
		{"VIP is its own backend", []Service{{Name: "x", VIP: a("203.0.113.100"), Backends: addrs("203.0.113.100")}}, "is a VIP"},
		{"backend is another VIP", []Service{ok, {Name: "y", VIP: a("203.0.113.1")}}, "is a VIP"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Normalize(c.svcs)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("Normalize = %v, want ErrInvalid saying %q", err, c.msg)
			}
		})
	}
}
