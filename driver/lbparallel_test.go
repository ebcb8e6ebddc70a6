package driver

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/servicelb"
	"github.com/overlay-plugin/overlay-plugin/servicelb/fakelb"
)

// slowLB is fakelb whose Apply takes a while, counting the calls under
// way at once.
type slowLB struct {
	*fakelb.LB
	now, most atomic.Int32
}

func (s *slowLB) Apply(path string, svcs []servicelb.Service) error {
	n := s.now.Add(1)
	defer s.now.Add(-1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	time.Sleep(20 * time.Millisecond)
	return s.LB.Apply(path, svcs)
}

// A change reaches the network's containers in parallel, at most
// lbParallel at once, and every one ends with the services.
func TestServicesProgramContainersInParallel(t *testing.T) {
	lb := &slowLB{LB: fakelb.New()}
	cfg := testConfig(t, fakekernel.New(), testDB(t))
	cfg.LoadBalancer, cfg.SandboxDir = lb, "/docker-netns"
	d := newFromConfig(t, cfg)
	if err := d.CreateNetwork(createNetReq("n1", 300)); err != nil {
		t.Fatal(err)
	}
	const containers = 10
	for i := range containers {
		joinAt(t, d, "n1", fmt.Sprintf("c%d", i), i+1, fmt.Sprintf("/var/run/docker/netns/c%d", i))
	}
	svcs := []Service{{Name: "web", VIP: netip.MustParseAddr("10.1.0.2"), Endpoints: []string{"c0", "c1"}}}
	if err := d.SetServices("n1", svcs); err != nil {
		t.Fatal(err)
	}
	if m := lb.most.Load(); m < 2 || m > lbParallel {
		t.Errorf("%d containers programmed at once, want 2 to %d", m, lbParallel)
	}
	for i := range containers {
		if b := backendsOf(t, lb.LB, fmt.Sprintf("/docker-netns/c%d", i))["web@10.1.0.2"]; len(b) != 2 {
			t.Errorf("c%d balances %v, want c0 and c1", i, b)
		}
	}
}

// An entry that forget marked gone while a call held it stays when that
// call reached the namespace (a container took the path again), and
// goes when it did not: its other networks' services are not lost.
func TestLBSandboxGoneWhileInUse(t *testing.T) {
	for _, seen := range []bool{true, false} {
		var s lbSandboxes
		e := s.acquire("/ns")
		e.nets["n1"] = []servicelb.Service{{Name: "web", VIP: netip.MustParseAddr("10.1.0.2")}}
		s.forget("/ns")
		s.release("/ns", e, seen)
		if kept := s.byPath["/ns"] != nil; kept != seen {
			t.Errorf("call reached the namespace %v: entry kept %v", seen, kept)
		}
	}
}
