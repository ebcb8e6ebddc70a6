package servicelb_test

// The contract every Programmer keeps, run against the real one (in a
// throwaway namespace; privileged) and the fake, so that the fake the
// driver's tests use stays faithful.

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/internal/testns"
	"github.com/overlay-plugin/overlay-plugin/servicelb"
	"github.com/overlay-plugin/overlay-plugin/servicelb/fakelb"
)

var addr = netip.MustParseAddr

// backendsOf lists every (VIP, backend) of svcs with a zero count.
func backendsOf(svcs ...servicelb.Service) map[servicelb.Backend]uint64 {
	out := map[servicelb.Backend]uint64{}
	for _, s := range svcs {
		for _, b := range s.Backends {
			out[servicelb.Backend{VIP: s.VIP, Addr: b}] = 0
		}
	}
	return out
}

// contract runs the checks on p, with path a sandbox and gone a path with
// no namespace behind it.
func contract(t *testing.T, p servicelb.Programmer, path, gone string) {
	counters := func(want map[servicelb.Backend]uint64) {
		t.Helper()
		got, err := p.Counters(path)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Counters = %v, %v; want %v", got, err, want)
		}
	}
	counters(map[servicelb.Backend]uint64{})

	web := servicelb.Service{Name: "web", VIP: addr("198.18.0.100"),
		Backends: []netip.Addr{addr("198.18.0.2"), addr("198.18.0.1"), addr("198.18.0.3")}}
	none := servicelb.Service{Name: "none", VIP: addr("198.18.0.101")}
	web6 := servicelb.Service{Name: "web6", VIP: addr("fd00::100"), Backends: []netip.Addr{addr("fd00::1")}}

	if err := p.Apply(path, []servicelb.Service{web, {Name: "dup", VIP: web.VIP}}); !errors.Is(err, servicelb.ErrInvalid) {
		t.Errorf("Apply of a duplicate VIP = %v, want ErrInvalid", err)
	}
	counters(map[servicelb.Backend]uint64{})

	if err := p.Apply(path, []servicelb.Service{web, none}); err != nil {
		t.Fatal(err)
	}
	counters(backendsOf(web))
	if err := p.Apply(path, []servicelb.Service{{Name: "bad", VIP: web.VIP, Backends: []netip.Addr{addr("fd00::1")}}}); !errors.Is(err, servicelb.ErrInvalid) {
		t.Errorf("Apply of a backend of the other family = %v, want ErrInvalid", err)
	}
	counters(backendsOf(web))

	web.Backends = web.Backends[1:]
	if err := p.Apply(path, []servicelb.Service{web6, none, web}); err != nil {
		t.Fatal(err)
	}
	counters(backendsOf(web, web6))
	if err := p.Apply(path, []servicelb.Service{web, none, web6}); err != nil {
		t.Fatal(err)
	}
	counters(backendsOf(web, web6))

	if err := p.Apply(path, nil); err != nil {
		t.Fatal(err)
	}
	counters(map[servicelb.Backend]uint64{})
	if err := p.Apply(path, []servicelb.Service{web}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := p.Remove(path); err != nil {
			t.Errorf("Remove: %v", err)
		}
		counters(map[servicelb.Backend]uint64{})
	}

	if err := p.Apply(gone, []servicelb.Service{web}); !errors.Is(err, servicelb.ErrNoSandbox) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Apply where there is no namespace = %v, want ErrNoSandbox and os.ErrNotExist", err)
	}
	if _, err := p.Counters(gone); !errors.Is(err, servicelb.ErrNoSandbox) {
		t.Errorf("Counters where there is no namespace = %v, want ErrNoSandbox", err)
	}
	if err := p.Remove(gone); err != nil {
		t.Errorf("Remove where there is no namespace = %v, want nil", err)
	}
}

func TestContractNftables(t *testing.T) {
	testns.RequireRoot(t)
	path := testns.Publish(t, testns.New(t), "slb")
	contract(t, servicelb.NewNftables(), path, filepath.Join(filepath.Dir(path), "gone"))
}

func TestContractFake(t *testing.T) {
	f := fakelb.New()
	f.Vanish("/run/docker/netns/gone")
	contract(t, f, "/run/docker/netns/sandbox", "/run/docker/netns/gone")
}
