package driver

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/internal/countmap"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
)

// fakeSources counts like vxlanfilter.Filter and checks, at every call,
// the order the driver promises: a VNI is filtered before its sandbox
// exists, and a remote VTEP is admitted before any sandbox has an FDB
// entry towards it and stays admitted until none has.
type fakeSources struct {
	k    *fakekernel.Kernel
	fail error // returned by every call, which still counts
	// mu guards the rest. Leaf lock, taken under network locks.
	mu        sync.Mutex
	port      uint16
	vnis      map[uint32]bool
	refs      countmap.Map[netip.Addr]
	released  int
	inherited []netip.Addr
	violation error
}

func newFakeSources(k *fakekernel.Kernel) *fakeSources {
	return &fakeSources{k: k, vnis: map[uint32]bool{}, refs: countmap.Map[netip.Addr]{}}
}

// entriesTo counts the FDB entries towards vtep in every sandbox.
func (f *fakeSources) entriesTo(vtep netip.Addr) int {
	n := 0
	for name := range f.k.Snapshot() {
		fdb, _ := f.k.FDB(name)
		for _, e := range fdb {
			if e.VTEP == vtep {
				n++
			}
		}
	}
	return n
}

func (f *fakeSources) violated(format string, args ...any) {
	if f.violation == nil {
		f.violation = fmt.Errorf(format, args...)
	}
}

func (f *fakeSources) SetPort(p uint16) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.port = p
	return f.fail
}

func (f *fakeSources) AddVNI(v uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vnis[v] = true
	return f.fail
}

func (f *fakeSources) RemoveVNI(v uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.vnis, v)
	return f.fail
}

func (f *fakeSources) AddRemote(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refs.Add(a, 1) == 1 {
		if n := f.entriesTo(a); n != 0 {
			f.violated("%v admitted after %d FDB entries towards it were written", a, n)
		}
	}
	return f.fail
}

func (f *fakeSources) RemoveRemote(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	left := f.refs.Add(a, -1)
	if left < 0 {
		f.violated("%v released more often than taken", a)
	}
	if left <= 0 {
		if n := f.entriesTo(a); n != 0 {
			f.violated("%v no longer admitted while %d FDB entries point at it", a, n)
		}
	}
	return f.fail
}

func (f *fakeSources) Inherit(vteps []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range vteps {
		f.inherited = append(f.inherited, a)
		if len(f.vnis) > 0 {
			f.violated("%v inherited after a VNI was filtered", a)
		}
	}
	return f.fail
}

func (f *fakeSources) ReleaseInherited() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released++
	return f.fail
}

func (f *fakeSources) Repair() error { return nil }

func (f *fakeSources) DroppedByVNI() (map[uint32]uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[uint32]uint64{}
	for v := range f.vnis {
		out[v] = uint64(v) // a figure the test can tell
	}
	return out, true
}

func (f *fakeSources) state() (vnis int, refs map[netip.Addr]int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	refs = map[netip.Addr]int{}
	for a, n := range f.refs {
		refs[a] = n
	}
	return len(f.vnis), refs, f.violation
}

func newSourcesDriver(t *testing.T) (*Driver, *fakekernel.Kernel, *fakeSources) {
	k := fakekernel.New()
	s := newFakeSources(k)
	cfg := testConfig(t, k, testDB(t))
	cfg.Sources = s
	return newFromConfig(t, cfg), k, s
}

// A remote host is admitted while an entry points at it, and only then.
func TestSourcesFollowTheEntries(t *testing.T) {
	d, _, s := newSourcesDriver(t)
	if s.port != 4789 {
		t.Fatalf("filter port %d, want 4789", s.port)
	}
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "e1", 1)
	r2, r3 := netip.MustParseAddr("198.51.100.2"), netip.MustParseAddr("198.51.100.3")
	must(t, d.AddPeer("n1", remotePeer("a", "10.1.0.50", "02:00:00:00:00:50", r2.String())))
	must(t, d.AddPeer("n1", remotePeer("b", "10.1.0.51", "02:00:00:00:00:51", r2.String())))
	must(t, d.AddPeer("n1", remotePeer("c", "10.1.0.52", "02:00:00:00:00:52", r3.String())))
	vnis, refs, err := s.state()
	must(t, err)
	if vnis != 1 || refs[r2] != 1 || refs[r3] != 1 || len(refs) != 2 {
		t.Fatalf("filter: %d VNIs, refs %v; want 1 VNI, one reference on each remote host", vnis, refs)
	}
	if st := d.State(); st[0].VXLANFilter == nil || st[0].VXLANFilter.Dropped != 300 {
		t.Fatalf("state's filter view %+v, want the drops of VNI 300", st[0].VXLANFilter)
	}
	must(t, d.DeletePeer("n1", "a"))
	must(t, d.DeletePeer("n1", "c"))
	if _, refs, err = s.state(); err != nil || len(refs) != 1 || refs[r2] != 1 {
		t.Fatalf("after deletes: refs %v, %v; want only %v", refs, err, r2)
	}
	must(t, d.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: "n1"}))
	if vnis, refs, err = s.state(); err != nil || vnis != 0 || len(refs) != 0 {
		t.Fatalf("after the network went: %d VNIs, refs %v, %v", vnis, refs, err)
	}
}

// A filter the kernel refuses does not stop the entries: the refusal is
// reported, and the books stay right for the filter's own repair.
func TestSourcesFailureKeepsTheEntries(t *testing.T) {
	d, k, s := newSourcesDriver(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "e1", 1)
	s.fail = errors.New("nf_tables: operation not supported")
	err := d.AddPeer("n1", remotePeer("a", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2"))
	if err == nil {
		t.Fatal("a refused filter change was not reported")
	}
	if fdb, _ := k.FDB("n1"); len(fdb) == 0 {
		t.Fatal("the entries were not written")
	}
	if _, refs, _ := s.state(); refs[netip.MustParseAddr("198.51.100.2")] != 1 {
		t.Fatalf("refs %v, want the reference counted", refs)
	}
}

// Under the race detector: networks programmed in parallel keep the
// filter's per-VTEP counts equal to the networks with entries towards
// each VTEP, and the order holds at every call.
func TestSourcesUnderConcurrency(t *testing.T) {
	d, k, s := newSourcesDriver(t)
	const nets, rounds = 4, 40
	for i := range nets {
		id := fmt.Sprintf("n%d", i+1)
		req := createNetReq(id, uint32(300+i))
		must(t, d.CreateNetwork(req))
		ep := endpointReq(id, fmt.Sprintf("e%d", i), 1)
		_, err := d.CreateEndpoint(ep)
		must(t, err)
		_, err = d.Join(&api.JoinRequest{NetworkID: id, EndpointID: fmt.Sprintf("e%d", i)})
		must(t, err)
	}
	var wg sync.WaitGroup
	for i := range nets {
		id := fmt.Sprintf("n%d", i+1)
		wg.Go(func() {
			for r := range rounds {
				vtep := fmt.Sprintf("198.51.100.%d", 2+r%5)
				p := remotePeer(fmt.Sprintf("p%d", r), fmt.Sprintf("10.1.1.%d", r), fmt.Sprintf("02:00:00:00:01:%02x", r), vtep)
				if err := d.AddPeer(id, p); err != nil {
					t.Error(err)
				}
				if r%3 == 0 {
					if err := d.DeletePeer(id, p.EndpointID); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	_, refs, err := s.state()
	must(t, err)
	want := map[netip.Addr]int{}
	for name := range k.Snapshot() {
		fdb, _ := k.FDB(name)
		seen := map[netip.Addr]bool{}
		for _, e := range fdb {
			if !seen[e.VTEP] {
				seen[e.VTEP] = true
				want[e.VTEP]++
			}
		}
	}
	if fmt.Sprint(refs) != fmt.Sprint(want) {
		t.Fatalf("filter refs %v, want the networks with entries per VTEP %v", refs, want)
	}
}

// A sandbox the previous run left is filtered only after the hosts its
// FDB entries point at are admitted: the peer db is empty until the
// control plane delivers, and a run without a filter table before it (an
// upgrade from 0.1.0) left nothing to take over.
func TestAdoptedSandboxAdmitsItsHostsFirst(t *testing.T) {
	k := fakekernel.New()
	k.AddLeftover(kernel.SandboxSpec{Name: "n1", VNI: 300, Port: 4789, Local: localVTEP, MTU: 1450})
	runningContainer(t, k, "n1", "e1e1e1e1e1e1e1")
	r2 := netip.MustParseAddr("198.51.100.2")
	must(t, k.OutsideChange("n1", kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{MAC: hwaddr.MAC{2, 0, 0, 0, 0, 9}, VTEP: r2}}))
	s := newFakeSources(k)
	cfg := testConfig(t, k, testDB(t))
	cfg.Sources = s
	newFromConfig(t, cfg)
	vnis, _, err := s.state()
	must(t, err)
	s.mu.Lock()
	defer s.mu.Unlock()
	if vnis != 1 || len(s.inherited) != 1 || s.inherited[0] != r2 {
		t.Fatalf("filter: %d VNIs, inherited %v; want VNI 300 filtered after %v was admitted", vnis, s.inherited, r2)
	}
}
