package fakelb_test

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"sync"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/servicelb"
	"github.com/overlay-plugin/overlay-plugin/servicelb/fakelb"
)

var a = netip.MustParseAddr

const sb = "/run/docker/netns/c1"

func be(vip, addr string) servicelb.Backend { return servicelb.Backend{VIP: a(vip), Addr: a(addr)} }

func web(backends ...string) servicelb.Service {
	s := servicelb.Service{Name: "web", VIP: a("198.18.0.100")}
	for _, b := range backends {
		s.Backends = append(s.Backends, a(b))
	}
	return s
}

func connect(t *testing.T, f *fakelb.LB, vip string, n int) map[netip.Addr]int {
	t.Helper()
	got := map[netip.Addr]int{}
	for range n {
		b, err := f.Connect(sb, a(vip))
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
		got[b]++
	}
	return got
}

func counters(t *testing.T, f *fakelb.LB) map[servicelb.Backend]uint64 {
	t.Helper()
	got, err := f.Counters(sb)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestChurn: counts follow connections, survive Apply for backends that
// stay, and restart from zero for a backend removed and added back.
func TestChurn(t *testing.T) {
	f := fakelb.New()
	if err := f.Apply(sb, []servicelb.Service{web("198.18.0.3", "198.18.0.1", "198.18.0.2", "198.18.0.1")}); err != nil {
		t.Fatal(err)
	}
	if got := connect(t, f, "198.18.0.100", 6); len(got) != 3 {
		t.Errorf("6 connections over 3 backends: %v", got)
	}
	want := map[servicelb.Backend]uint64{
		be("198.18.0.100", "198.18.0.1"): 2, be("198.18.0.100", "198.18.0.2"): 2, be("198.18.0.100", "198.18.0.3"): 2}
	if got := counters(t, f); !reflect.DeepEqual(got, want) {
		t.Errorf("Counters = %v, want %v", got, want)
	}

	v6 := servicelb.Service{Name: "v6", VIP: a("fd00::100"), Backends: []netip.Addr{a("fd00::1")}}
	if err := f.Apply(sb, []servicelb.Service{v6, web("198.18.0.2", "198.18.0.3")}); err != nil {
		t.Fatal(err)
	}
	if got := connect(t, f, "198.18.0.100", 4); got[a("198.18.0.1")] != 0 {
		t.Errorf("a removed backend got connections: %v", got)
	}
	connect(t, f, "fd00::100", 1)
	want = map[servicelb.Backend]uint64{
		be("198.18.0.100", "198.18.0.2"): 4, be("198.18.0.100", "198.18.0.3"): 4, be("fd00::100", "fd00::1"): 1}
	if got := counters(t, f); !reflect.DeepEqual(got, want) {
		t.Errorf("Counters = %v, want %v", got, want)
	}

	if err := f.Apply(sb, []servicelb.Service{web("198.18.0.1", "198.18.0.2")}); err != nil {
		t.Fatal(err)
	}
	want = map[servicelb.Backend]uint64{be("198.18.0.100", "198.18.0.1"): 0, be("198.18.0.100", "198.18.0.2"): 4}
	if got := counters(t, f); !reflect.DeepEqual(got, want) {
		t.Errorf("Counters = %v, want %v", got, want)
	}
	svcs, ok := f.Services(sb)
	if !ok || !reflect.DeepEqual(svcs, []servicelb.Service{web("198.18.0.1", "198.18.0.2")}) {
		t.Errorf("Services = %v, %v", svcs, ok)
	}
}

func TestConnectErrors(t *testing.T) {
	f := fakelb.New()
	if _, err := f.Connect(sb, a("198.18.0.100")); !errors.Is(err, fakelb.ErrNoService) {
		t.Errorf("Connect without a table = %v", err)
	}
	if err := f.Apply(sb, []servicelb.Service{web()}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Connect(sb, a("198.18.0.100")); !errors.Is(err, fakelb.ErrRefused) {
		t.Errorf("Connect to a service without backends = %v", err)
	}
	if _, err := f.Connect(sb, a("198.18.0.200")); !errors.Is(err, fakelb.ErrNoService) {
		t.Errorf("Connect to an unknown VIP = %v", err)
	}
	f.Vanish(sb)
	if _, err := f.Connect(sb, a("198.18.0.100")); !errors.Is(err, servicelb.ErrNoSandbox) {
		t.Errorf("Connect from a vanished sandbox = %v", err)
	}
}

// TestFailuresChangeNothing: refused input and injected faults leave the
// recorded services and counts as they were.
func TestFailuresChangeNothing(t *testing.T) {
	f := fakelb.New()
	if err := f.Apply(sb, []servicelb.Service{web("198.18.0.1", "198.18.0.2")}); err != nil {
		t.Fatal(err)
	}
	connect(t, f, "198.18.0.100", 3)
	svcs, _ := f.Services(sb)
	ctrs := counters(t, f)
	check := func(what string) {
		t.Helper()
		if got, _ := f.Services(sb); !reflect.DeepEqual(got, svcs) {
			t.Errorf("%s: services %v, want %v", what, got, svcs)
		}
		if got := counters(t, f); !reflect.DeepEqual(got, ctrs) {
			t.Errorf("%s: counters %v, want %v", what, got, ctrs)
		}
	}

	if err := f.Apply(sb, []servicelb.Service{web("198.18.0.100")}); !errors.Is(err, servicelb.ErrInvalid) {
		t.Errorf("Apply of a VIP as its own backend = %v", err)
	}
	check("refused input")

	boom := errors.New("boom")
	f.SetFault(func(op fakelb.Op, path string) error {
		if op != fakelb.OpCounters && path == sb {
			return fmt.Errorf("%s: %w", op, boom)
		}
		return nil
	})
	applies, removes := f.Calls(fakelb.OpApply), f.Calls(fakelb.OpRemove)
	if err := f.Apply(sb, []servicelb.Service{web("198.18.0.3")}); !errors.Is(err, boom) {
		t.Errorf("Apply with a fault = %v", err)
	}
	if err := f.Remove(sb); !errors.Is(err, boom) {
		t.Errorf("Remove with a fault = %v", err)
	}
	if err := f.Apply("/other", []servicelb.Service{web("198.18.0.3")}); err != nil {
		t.Errorf("Apply elsewhere: %v", err)
	}
	check("injected faults")
	if f.Calls(fakelb.OpApply) != applies+1 || f.Calls(fakelb.OpRemove) != removes {
		t.Errorf("Calls count failed calls: Apply %d -> %d, Remove %d -> %d",
			applies, f.Calls(fakelb.OpApply), removes, f.Calls(fakelb.OpRemove))
	}
	f.SetFault(nil)
	if err := f.Remove(sb); err != nil {
		t.Fatal(err)
	}
	if got := f.Sandboxes(); !reflect.DeepEqual(got, []string{"/other"}) {
		t.Errorf("Sandboxes = %v", got)
	}
}

func TestServicesIsACopy(t *testing.T) {
	f := fakelb.New()
	in := []servicelb.Service{web("198.18.0.1")}
	if err := f.Apply(sb, in); err != nil {
		t.Fatal(err)
	}
	in[0].Backends[0] = a("198.18.0.9")
	got, _ := f.Services(sb)
	got[0].Backends[0] = a("198.18.0.8")
	if again, _ := f.Services(sb); again[0].Backends[0] != a("198.18.0.1") {
		t.Errorf("the fake shares memory with its callers: %v", again)
	}
}

// TestConcurrent exercises the locking under the race detector.
func TestConcurrent(t *testing.T) {
	f := fakelb.New()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := fmt.Sprintf("/run/docker/netns/c%d", i)
			for j := range 50 {
				_ = f.Apply(path, []servicelb.Service{web(fmt.Sprintf("198.18.0.%d", 1+j%3))})
				_, _ = f.Connect(path, a("198.18.0.100"))
				_, _ = f.Counters(path)
				_, _ = f.Services(path)
				f.SetFault(nil)
			}
			_ = f.Remove(path)
		}()
	}
	wg.Wait()
	if got := f.Sandboxes(); len(got) != 0 {
		t.Errorf("Sandboxes = %v", got)
	}
}

// TestIncrementFallsBack: a change to a sandbox with a table is an
// increment; a failed increment falls back to a replace, and a failed
// replace changes nothing; a renamed service is a replace.
func TestIncrementFallsBack(t *testing.T) {
	f := fakelb.New()
	if err := f.Apply(sb, []servicelb.Service{web("198.18.0.1")}); err != nil {
		t.Fatal(err)
	}
	connect(t, f, "198.18.0.100", 2)
	if err := f.Apply(sb, []servicelb.Service{web("198.18.0.1", "198.18.0.2")}); err != nil {
		t.Fatal(err)
	}
	if got := f.Stats(); got != (servicelb.Stats{Replaces: 1, Increments: 1}) {
		t.Errorf("Stats = %+v, want a replace then an increment", got)
	}
	if err := f.Apply(sb, []servicelb.Service{web("198.18.0.1", "198.18.0.2")}); err != nil || f.Stats().Increments != 1 {
		t.Errorf("the same again: %v, %+v", err, f.Stats())
	}

	fail := errors.New("injected")
	f.SetFault(func(op fakelb.Op, _ string) error {
		if op == fakelb.OpIncrement {
			return fail
		}
		return nil
	})
	if err := f.Apply(sb, []servicelb.Service{web("198.18.0.1", "198.18.0.3")}); err != nil {
		t.Fatal(err)
	}
	if got := f.Stats(); got.Fallbacks != 1 || got.Replaces != 2 {
		t.Errorf("Stats = %+v, want a fallback to a replace", got)
	}
	if n := counters(t, f)[be("198.18.0.100", "198.18.0.1")]; n != 2 {
		t.Errorf("count of the backend that stayed: %d, want 2", n)
	}

	f.SetFault(func(op fakelb.Op, _ string) error {
		if op == fakelb.OpIncrement || op == fakelb.OpReplace {
			return fail
		}
		return nil
	})
	if err := f.Apply(sb, []servicelb.Service{web()}); !errors.Is(err, fail) {
		t.Errorf("both ways failing: %v", err)
	}
	if svcs, _ := f.Services(sb); !reflect.DeepEqual(svcs, []servicelb.Service{web("198.18.0.1", "198.18.0.3")}) {
		t.Errorf("a failed Apply changed the table: %v", svcs)
	}

	f.SetFault(nil)
	renamed := web("198.18.0.1", "198.18.0.3")
	renamed.Name = "www"
	before := f.Stats()
	if err := f.Apply(sb, []servicelb.Service{renamed}); err != nil {
		t.Fatal(err)
	}
	if got := f.Stats(); got.Replaces != before.Replaces+1 || got.Increments != before.Increments {
		t.Errorf("renamed: %+v -> %+v, want a replace", before, got)
	}
}
