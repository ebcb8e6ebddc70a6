package servicelb

// Privileged tests of the incremental path: the table a series of changes
// leaves is the one a full build of the last list gives, written with
// batches whose size does not grow with the table.

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// sampleSandbox returns a fresh sandbox programmed with sampleServices by
// the Programmer returned.
func sampleSandbox(t *testing.T) (string, *nftLB, []Service) {
	t.Helper()
	path, _ := newSandbox(t)
	lb := NewNftables().(*nftLB)
	svcs := sampleServices()
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	return path, lb, svcs
}

// tableIs fails t unless the table at path is exactly what a full build
// of svcs gives (counters aside).
func tableIs(t *testing.T, path string, svcs []Service) {
	t.Helper()
	norm, err := Normalize(svcs)
	if err != nil {
		t.Fatal(err)
	}
	err = inNamespace(path, bufferBase, bufferBase, func(_ netns.NsHandle, c *nftables.Conn) error {
		have, err := readTable(c, true)
		if err != nil {
			return err
		}
		if !build(norm, nil).sameAs(have) {
			t.Errorf("the table is not the full build of %v", norm)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// churn changes svcs at random as tasks and services come and go: a
// backend added or removed, a service losing or getting all its
// backends, a service added or removed.
func churn(r *rand.Rand, svcs []Service, fresh func(v6 bool) netip.Addr) []Service {
	out := slices.Clone(svcs)
	i := r.IntN(len(out))
	s := &out[i]
	s.Backends = slices.Clone(s.Backends)
	switch r.IntN(6) {
	case 0, 1:
		s.Backends = append(s.Backends, fresh(s.VIP.Is6()))
	case 2:
		if len(s.Backends) > 0 {
			j := r.IntN(len(s.Backends))
			s.Backends = slices.Delete(s.Backends, j, j+1)
		}
	case 3:
		s.Backends = nil
	case 4:
		out = append(out, Service{Name: "new", VIP: fresh(false), Backends: []netip.Addr{fresh(false), fresh(false)}})
	case 5:
		out = slices.Delete(out, i, i+1)
	}
	return out
}

// TestIncrementsMatchTheFullBuild: 200 random changes to 50 services, one
// Programmer throughout; after each the table is the full build, it was
// never recreated, and each change wrote a few objects.
func TestIncrementsMatchTheFullBuild(t *testing.T) {
	path, _ := newSandbox(t)
	lb := NewNftables()
	svcs := manyServices(50, 3)
	svcs = append(svcs, Service{Name: "v6", VIP: a("fd00:5b::100"), Backends: addrs("fd00:5b::1", "fd00:5b::2")})
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	h := tableHandle(t, path)
	next, next6 := a("198.19.0.0"), a("fd00:5b::1:0")
	fresh := func(v6 bool) netip.Addr {
		if v6 {
			next6 = next6.Next()
			return next6
		}
		next = next.Next()
		return next
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		before := lb.Stats()
		if svcs = churn(r, svcs, fresh); len(svcs) == 0 {
			svcs = manyServices(1, 1)
		}
		if err := lb.Apply(path, svcs); err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
		tableIs(t, path, svcs)
		after := lb.Stats()
		if after.Replaces != before.Replaces || after.Fallbacks != before.Fallbacks {
			t.Fatalf("change %d: %+v -> %+v, want increments only", i, before, after)
		}
		if n := after.Objects - before.Objects; n > 16 {
			t.Errorf("change %d wrote %d objects", i, n)
		}
	}
	if tableHandle(t, path) != h {
		t.Error("the table was recreated")
	}
}

// TestIncrementKeepsCounters: a backend added to a service keeps the
// others' counts, and an Apply that changes nothing sends nothing.
func TestIncrementKeepsCounters(t *testing.T) {
	path, lb, svcs := sampleSandbox(t)
	nft(t, path, "reset", "counters", "table", "inet", TableName) // zero, but exercises the path
	nft(t, path, "add", "rule", "inet", TableName, "be-203.0.113.100-203.0.113.1", "counter", "packets", "5", "bytes", "300")
	// The generation moved: this Apply replaces, carrying counters over.
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	svcs[0].Backends = append(svcs[0].Backends, a("203.0.113.4"))
	before := lb.Stats()
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	if got := lb.Stats(); got.Increments != before.Increments+1 {
		t.Errorf("stats %+v -> %+v: want one increment", before, got)
	}
	got, err := lb.Counters(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := got[Backend{VIP: a("203.0.113.100"), Addr: a("203.0.113.1")}]; n != 5 {
		t.Errorf("counter of a backend that stayed: %d, want 5", n)
	}
	before = lb.Stats()
	if err := lb.Apply(path, svcs); err != nil || lb.Stats() != before {
		t.Errorf("the same again: %v, stats %+v -> %+v", err, before, lb.Stats())
	}
}

// TestRefusedIncrementFallsBack: when the kernel refuses the difference
// (here: the cache is made wrong on purpose, so the batch deletes what is
// not there), Apply replaces the table instead, and succeeds; a renamed
// service is a replace from the start.
func TestRefusedIncrementFallsBack(t *testing.T) {
	path, lb, svcs := sampleSandbox(t)
	lb.known.mu.Lock()
	k := lb.known.tables[path]
	lie := slices.Clone(k.svcs)
	lie[0].Backends = addrs("203.0.113.7", "203.0.113.8", "203.0.113.9")
	k.svcs = lie
	lb.known.tables[path] = k
	lb.known.mu.Unlock()
	svcs[0].Backends = addrs("203.0.113.1")
	before := lb.Stats()
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	tableIs(t, path, svcs)
	if got := lb.Stats(); got.Fallbacks != before.Fallbacks+1 || got.Replaces != before.Replaces+1 {
		t.Errorf("stats %+v -> %+v: want one fallback, one replace", before, got)
	}

	svcs[0].Name = "www"
	before = lb.Stats()
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	tableIs(t, path, svcs)
	if got := lb.Stats(); got.Replaces != before.Replaces+1 || got.Increments != before.Increments {
		t.Errorf("renamed: stats %+v -> %+v, want one replace", before, got)
	}
}

// TestBatchVerdict: a batch is acknowledged once, at its end; one the
// kernel refuses anywhere gives the refusal, and applies nothing.
func TestBatchVerdict(t *testing.T) {
	path, _, _ := sampleSandbox(t)
	before := listing(t, path)
	err := inNamespace(path, bufferBase, bufferBase, func(ns netns.NsHandle, _ *nftables.Conn) error {
		b, err := newBatch()
		if err != nil {
			return err
		}
		b.c.AddChain(&nftables.Chain{Name: "fine", Table: newTable()})
		b.c.DelChain(&nftables.Chain{Name: "absent", Table: newTable()})
		b.c.AddChain(&nftables.Chain{Name: "fine2", Table: newTable()})
		if err := b.send(ns, bufferBase, bufferBase); !errors.Is(err, unix.ENOENT) {
			t.Errorf("a batch deleting an absent chain: %v, want ENOENT", err)
		}
		b.c.AddChain(&nftables.Chain{Name: "fine", Table: newTable()})
		return b.send(ns, bufferBase, bufferBase)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := listing(t, path); !strings.Contains(got, "chain fine {") || strings.Contains(got, "fine2") {
		t.Errorf("after a refused batch and a good one:\n%s\nbefore:\n%s", got, before)
	}
}

// TestTakesOverAnEarlierRunsTable: a Programmer that did not write the
// table (a restarted or upgraded plugin) makes its first change a
// replace that keeps the counters, and the next ones increments.
func TestTakesOverAnEarlierRunsTable(t *testing.T) {
	path, _, svcs := sampleSandbox(t)
	// An earlier run's table, with connections counted.
	nft(t, path, "flush", "chain", "inet", TableName, "be-203.0.113.100-203.0.113.2")
	nft(t, path, "add", "rule", "inet", TableName, "be-203.0.113.100-203.0.113.2",
		"counter", "packets", "3", "bytes", "180", "dnat", "ip", "to", "203.0.113.2")
	lb := NewNftables()
	svcs[0].Backends = addrs("203.0.113.2", "203.0.113.3")
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	svcs[0].Backends = addrs("203.0.113.2", "203.0.113.5")
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	tableIs(t, path, svcs)
	if got := lb.Stats(); got.Replaces != 1 || got.Increments != 1 {
		t.Errorf("Stats %+v, want a replace then an increment", got)
	}
	got, err := lb.Counters(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := got[Backend{VIP: a("203.0.113.100"), Addr: a("203.0.113.2")}]; n != 3 {
		t.Errorf("the earlier run's counter: %d, want 3", n)
	}
}
