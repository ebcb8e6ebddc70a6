package driver

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/internal/countmap"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/kerneltest"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// exclusiveKernel wraps the fake and fails the test if two operations on
// the same sandbox ever overlap: the network lock must serialise them.
type exclusiveKernel struct {
	*fakekernel.Kernel
	t testing.TB

	// mu guards busy. Leaf lock.
	mu   sync.Mutex
	busy map[string]bool
}

func (x *exclusiveKernel) enter(sb string) func() {
	x.mu.Lock()
	if x.busy[sb] {
		x.t.Errorf("two kernel operations on sandbox %s at once", sb)
	}
	x.busy[sb] = true
	x.mu.Unlock()
	runtime.Gosched() // widen the window
	return func() {
		x.mu.Lock()
		delete(x.busy, sb)
		x.mu.Unlock()
	}
}

func (x *exclusiveKernel) CreateSandbox(s kernel.SandboxSpec) error {
	defer x.enter(s.Name)()
	return x.Kernel.CreateSandbox(s)
}
func (x *exclusiveKernel) DeleteSandbox(n string) error {
	defer x.enter(n)()
	return x.Kernel.DeleteSandbox(n)
}
func (x *exclusiveKernel) AddVeth(sb string, v kernel.Veth) error {
	defer x.enter(sb)()
	return x.Kernel.AddVeth(sb, v)
}
func (x *exclusiveKernel) DeleteVeth(sb, n string) error {
	defer x.enter(sb)()
	return x.Kernel.DeleteVeth(sb, n)
}
func (x *exclusiveKernel) Program(sb string, ops []kernel.EntryOp) []error {
	defer x.enter(sb)()
	return x.Kernel.Program(sb, ops)
}

func (x *exclusiveKernel) RepairSandbox(s kernel.SandboxSpec) ([]kernel.Repair, error) {
	defer x.enter(s.Name)()
	return x.Kernel.RepairSandbox(s)
}
func (x *exclusiveKernel) Neighbors(sb string) ([]kernel.Neighbor, error) {
	defer x.enter(sb)()
	return x.Kernel.Neighbors(sb)
}
func (x *exclusiveKernel) FDB(sb string) ([]kernel.FDBEntry, error) {
	defer x.enter(sb)()
	return x.Kernel.FDB(sb)
}

// TestConcurrentOperationsKeepInvariants runs random driver operations from
// many goroutines over a few network ids, so creates, deletes, joins and
// peer updates of the same network race each other and the reconcilers
// (Run, with a short period, and drift from outside that they repair),
// then checks that the kernel holds exactly what the surviving objects
// imply.
func TestConcurrentOperationsKeepInvariants(t *testing.T) {
	const (
		workers  = 16
		opsEach  = 400
		networks = 3
		locals   = 6
		remotes  = 8
	)
	ops := opsEach
	if testing.Short() {
		ops = 50
	}
	fake := fakekernel.New()
	k := &exclusiveKernel{Kernel: fake, t: t, busy: map[string]bool{}}
	d := newTestDriver(t, k)
	fe := newFakeEncryption()
	d.SetEncryption(fe)
	d.resyncPeriod = 5 * time.Millisecond
	ctx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); d.Run(ctx) }()

	nid := func(r *rand.Rand) string { return fmt.Sprintf("net%d", r.IntN(networks)) }
	vniOf := func(id string) uint32 { return 300 + uint32(id[3]-'0') }
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 42))
			for range ops {
				n := nid(r)
				eid := fmt.Sprintf("ep%d", r.IntN(locals))
				switch r.IntN(11) {
				case 0:
					req := createNetReq(n, vniOf(n))
					switch n {
					case "net1":
						req.Options[genericOptionsKey].(map[string]any)[OptFlood] = ""
					case "net2":
						req.Options[genericOptionsKey].(map[string]any)[OptEncrypted] = ""
					}
					_ = d.CreateNetwork(req)
				case 1:
					if r.IntN(3) == 0 { // deletes rarer than creates
						_ = d.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: n})
					}
				case 2:
					_, _ = d.CreateEndpoint(endpointReq(n, eid, int(eid[2]-'0')))
				case 3:
					_, _ = d.Join(&api.JoinRequest{NetworkID: n, EndpointID: eid})
				case 4:
					_ = d.Leave(&api.LeaveRequest{NetworkID: n, EndpointID: eid})
				case 5:
					_ = d.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: n, EndpointID: eid})
				case 6, 7:
					// Remote peers collide on IPs with each other and with
					// local endpoints (10.1.0.10-15).
					i := r.IntN(remotes)
					ip := netip.AddrFrom4([4]byte{10, 1, 0, byte(10 + r.IntN(12))})
					p := peerdb.Peer{EndpointID: fmt.Sprintf("rem%d", i), IPs: []netip.Addr{ip},
						MAC:  hwaddr.MAC{2, 0, 0, 0, 1, byte(i)},
						VTEP: netip.AddrFrom4([4]byte{198, 51, 100, byte(2 + r.IntN(3))})}
					_ = d.AddPeer(n, p)
				case 8:
					_ = d.DeletePeer(n, fmt.Sprintf("rem%d", r.IntN(remotes)))
				case 9:
					_ = d.State()
				case 10:
					// Someone else changes the sandbox, not under its lock.
					switch r.IntN(3) {
					case 0:
						_ = fake.BreakDevice(n, kernel.VXLANName)
					case 1:
						_ = fake.BreakDevice(n, kernel.BridgeName)
					default:
						_ = fake.OutsideChange(n, kerneltest.DeleteNeighbor(netip.AddrFrom4([4]byte{10, 1, 0, byte(10 + r.IntN(12))})))
					}
				}
			}
		})
	}
	wg.Wait()
	stopRun()
	<-runDone
	if _, _, err := d.Resync(); err != nil { // the drift since the last pass
		t.Fatalf("resync: %v", err)
	}
	checkInvariants(t, d, fake)
	checkHealthy(t, fake)
	checkEncryptionRefs(t, d, fe)
	if r := d.Repairs(); r[RepairDeviceRebuilt] == 0 {
		t.Errorf("the reconcilers repaired no device during the run: %v", r)
	}
	// Guard against a vacuous run: the races must have done real work.
	for _, op := range []fakekernel.Op{fakekernel.OpCreateSandbox, fakekernel.OpDeleteSandbox,
		fakekernel.OpAddVeth, fakekernel.OpSetNeighbor, fakekernel.OpAddFDB, fakekernel.OpDeleteFDB} {
		if fake.Calls(op) == 0 {
			t.Errorf("no successful %s during the run", op)
		}
	}
	t.Logf("kernel calls: sandboxes %d/%d, veths %d, neighbours %d, fdb %d/%d",
		fake.Calls(fakekernel.OpCreateSandbox), fake.Calls(fakekernel.OpDeleteSandbox), fake.Calls(fakekernel.OpAddVeth),
		fake.Calls(fakekernel.OpSetNeighbor), fake.Calls(fakekernel.OpAddFDB), fake.Calls(fakekernel.OpDeleteFDB))

	// Tearing everything down through the API leaves the kernel empty.
	for _, st := range d.State() {
		for _, ep := range st.Endpoints {
			must(t, d.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: st.ID, EndpointID: ep.ID}))
		}
		must(t, d.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: st.ID}))
	}
	if snap := fake.Snapshot(); len(snap) != 0 {
		t.Fatalf("sandboxes left after deleting every network: %v", snap)
	}
	if refs, vnis := fe.snapshot(); len(refs) != 0 || len(vnis) != 0 {
		t.Fatalf("IPsec references left after deleting every network: %v %v", refs, vnis)
	}
}

// checkEncryptionRefs checks that every encrypted network with a sandbox
// holds one reference per remote VTEP it reaches and guards its VNI, and
// nothing else holds any.
func checkEncryptionRefs(t *testing.T, d *Driver, fe *fakeEncryption) {
	t.Helper()
	wantRefs := map[netip.Addr]int{}
	wantVNIs := map[uint32]int{}
	for _, id := range d.networkIDs() {
		n := d.lockNetwork(id)
		if n == nil {
			continue
		}
		if n.opts.encrypted && n.sandbox != "" {
			wantVNIs[n.vni]++
			for vtep := range n.planner.fdb {
				wantRefs[vtep]++
			}
		}
		n.mu.Unlock()
	}
	refs, vnis := fe.snapshot()
	if !maps.Equal(refs, wantRefs) || !maps.Equal(vnis, wantVNIs) {
		t.Errorf("IPsec references %v / VNIs %v, want %v / %v", refs, vnis, wantRefs, wantVNIs)
	}
}

// checkInvariants compares the fake kernel with what the driver's networks
// imply.
func checkInvariants(t *testing.T, d *Driver, fake *fakekernel.Kernel) {
	t.Helper()
	snap := fake.Snapshot()
	seen := map[string]bool{}
	for _, id := range d.networkIDs() {
		n := d.lockNetwork(id)
		if n == nil {
			continue
		}
		func() {
			defer n.mu.Unlock()
			joined := map[string]bool{}
			for _, ep := range n.endpoints {
				if ep.joined {
					joined[ep.veth.SandboxName] = true
					if p, ok := n.peers.Get(ep.id); !ok || !p.Local {
						t.Errorf("%s: joined endpoint %s missing from peer db", id, ep.id)
					}
				} else if _, ok := n.peers.Get(ep.id); ok {
					t.Errorf("%s: unjoined endpoint %s in peer db", id, ep.id)
				}
			}
			if n.joined != len(joined) {
				t.Errorf("%s: joined count %d, want %d", id, n.joined, len(joined))
			}
			sb, exists := snap[id]
			if n.sandbox == "" {
				if exists || n.joined != 0 || len(n.planner.fdb) != 0 {
					t.Errorf("%s: no sandbox recorded but kernel=%v joined=%d fdb=%v", id, exists, n.joined, n.planner.fdb)
				}
				return
			}
			seen[id] = true
			if !exists {
				t.Errorf("%s: sandbox recorded but absent from kernel", id)
				return
			}
			if n.joined == 0 {
				t.Errorf("%s: sandbox with no joined endpoint", id)
			}
			if got := maps.Collect(func(yield func(string, bool) bool) {
				for name := range sb.Veths {
					if !yield(name, true) {
						return
					}
				}
			}); !maps.Equal(got, joined) {
				t.Errorf("%s: veths %v, want %v", id, got, joined)
			}
			wantNeigh := map[netip.Addr]hwaddr.MAC{}
			wantFDB := map[kernel.FDBEntry]bool{}
			wantCount := map[netip.Addr]countmap.Map[hwaddr.MAC]{}
			for ip, b := range n.peers.Bindings() {
				if b.Local {
					continue
				}
				wantNeigh[ip] = b.MAC
				wantFDB[kernel.FDBEntry{MAC: b.MAC, VTEP: b.VTEP}] = true
				if wantCount[b.VTEP] == nil {
					wantCount[b.VTEP] = countmap.Map[hwaddr.MAC]{}
					if n.opts.flood {
						wantFDB[kernel.FDBEntry{VTEP: b.VTEP}] = true
					}
				}
				wantCount[b.VTEP].Add(b.MAC, 1)
			}
			if !maps.Equal(sb.Neighbors, wantNeigh) {
				t.Errorf("%s: neighbours %v, want %v", id, sb.Neighbors, wantNeigh)
			}
			if !maps.Equal(sb.FDB, wantFDB) {
				t.Errorf("%s: fdb %v, want %v", id, sb.FDB, wantFDB)
			}
			if !maps.EqualFunc(n.planner.fdb, wantCount, maps.Equal) {
				t.Errorf("%s: fdb refcounts %v, want %v", id, n.planner.fdb, wantCount)
			}
		}()
	}
	for name := range snap {
		if !seen[name] {
			t.Errorf("kernel holds sandbox %s that no network owns", name)
		}
	}
}

// TestCreateDeleteSameIDLinearizable races create, join and delete of one
// network id: kernel work for the id never overlaps (exclusiveKernel) and
// what survives is consistent (checkInvariants).
func TestCreateDeleteSameIDLinearizable(t *testing.T) {
	fake := fakekernel.New()
	k := &exclusiveKernel{Kernel: fake, t: t, busy: map[string]bool{}}
	d := newTestDriver(t, k)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 300 {
				if (w+i)%2 == 0 {
					if err := d.CreateNetwork(createNetReq("n1", 300)); err == nil {
						// A created network can be joined until someone deletes it.
						eid := fmt.Sprintf("e%d", w)
						if _, err := d.CreateEndpoint(endpointReq("n1", eid, w)); err == nil {
							_, _ = d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: eid})
						}
					}
				} else {
					_ = d.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: "n1"})
				}
			}
		})
	}
	wg.Wait()
	checkInvariants(t, d, fake)
}
