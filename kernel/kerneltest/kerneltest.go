// Package kerneltest holds the behaviour every kernel.Kernel shares, as
// test functions that the fake (fakekernel) and the netlink kernel both
// pass: what the driver may rely on whichever it runs on. Run runs them
// all; what only the real kernel does (devices, namespaces, packets) is
// tested beside it, in kernel.
package kerneltest

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
)

// Harness is one implementation under test.
type Harness struct {
	// K holds no sandbox yet.
	K kernel.Kernel
	// Outside applies ops to a sandbox as someone else would (an operator
	// with ip or bridge): Watch reports them, unlike Program's.
	Outside func(t *testing.T, sandbox string, ops ...kernel.EntryOp)
	// Break deletes a device (kernel.BridgeName or kernel.VXLANName) of
	// a sandbox as someone else would.
	Break func(t *testing.T, sandbox, device string)
	// Fail, if not nil, makes every op of kind fail with err from now on;
	// a nil err ends it. Only a fake can.
	Fail func(kind kernel.EntryOpKind, err error)
}

// Run runs every check of the package, each with a new harness.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	for _, c := range []struct {
		name string
		f    func(*testing.T, Harness)
	}{
		{"Sandboxes", Sandboxes},
		{"Veths", Veths},
		{"Entries", Entries},
		{"BadOps", BadOps},
		{"MissingSandbox", MissingSandbox},
		{"Watch", Watch},
		{"Repair", Repair},
		{"Faults", Faults},
	} {
		t.Run(c.name, func(t *testing.T) { c.f(t, newHarness(t)) })
	}
}

// Addresses of the tests: documentation prefixes, never a real host.
var (
	Local  = netip.MustParseAddr("198.51.100.1")
	V1     = netip.MustParseAddr("198.51.100.2")
	V2     = netip.MustParseAddr("198.51.100.3")
	Local6 = netip.MustParseAddr("2001:db8:ffff::1")
)

// Spec is a sandbox spec as the driver makes them.
func Spec(name string, vni uint32, local netip.Addr) kernel.SandboxSpec {
	return kernel.SandboxSpec{Name: name, VNI: vni, Port: 4789, Local: local, MTU: 1450}
}

// SetNeighbor, DeleteNeighbor, AddFDB and DeleteFDB build Program's ops.

func SetNeighbor(ip netip.Addr, mac hwaddr.MAC) kernel.EntryOp {
	return kernel.EntryOp{Kind: kernel.OpSetNeighbor, Neighbor: kernel.Neighbor{IP: ip, MAC: mac}}
}

func DeleteNeighbor(ip netip.Addr) kernel.EntryOp {
	return kernel.EntryOp{Kind: kernel.OpDeleteNeighbor, Neighbor: kernel.Neighbor{IP: ip}}
}

func AddFDB(mac hwaddr.MAC, vtep netip.Addr) kernel.EntryOp {
	return kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{MAC: mac, VTEP: vtep}}
}

func DeleteFDB(mac hwaddr.MAC, vtep netip.Addr) kernel.EntryOp {
	return kernel.EntryOp{Kind: kernel.OpDeleteFDB, FDB: kernel.FDBEntry{MAC: mac, VTEP: vtep}}
}

// Program fails t unless every op succeeds.
func Program(t *testing.T, k kernel.Kernel, sandbox string, ops ...kernel.EntryOp) {
	t.Helper()
	if errs := k.Program(sandbox, ops); errs != nil {
		if len(errs) != len(ops) {
			t.Fatalf("Program returned %d errors for %d ops, want one per op", len(errs), len(ops))
		}
		t.Fatalf("Program: %v", errors.Join(errs...))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// MustEntries fails t unless the sandbox holds exactly the neighbours
// and FDB entries wanted, in any order.
func MustEntries(t *testing.T, k kernel.Kernel, sandbox string, wantN []kernel.Neighbor, wantF []kernel.FDBEntry) {
	t.Helper()
	gotN, err := k.Neighbors(sandbox)
	must(t, err)
	gotF, err := k.FDB(sandbox)
	must(t, err)
	sortN := func(ns []kernel.Neighbor) []kernel.Neighbor {
		ns = slices.Clone(ns)
		slices.SortFunc(ns, func(a, b kernel.Neighbor) int { return a.IP.Compare(b.IP) })
		return ns
	}
	sortF := func(es []kernel.FDBEntry) []kernel.FDBEntry {
		es = slices.Clone(es)
		slices.SortFunc(es, func(a, b kernel.FDBEntry) int {
			if c := slices.Compare(a.MAC[:], b.MAC[:]); c != 0 {
				return c
			}
			return a.VTEP.Compare(b.VTEP)
		})
		return es
	}
	if g, w := sortN(gotN), sortN(wantN); !slices.Equal(g, w) {
		t.Errorf("Neighbors = %v, want %v", g, w)
	}
	if g, w := sortF(gotF), sortF(wantF); !slices.Equal(g, w) {
		t.Errorf("FDB = %v, want %v", g, w)
	}
}

// Sandboxes checks their lifecycle: created, listed, refused twice by
// name or by VXLAN identity (VNI, port, underlay family), inspected,
// deleted (twice is ErrNotFound), removed as leftovers unless kept.
func Sandboxes(t *testing.T, h Harness) {
	k := h.K
	mustList := func(want ...string) {
		t.Helper()
		got, err := k.Sandboxes()
		must(t, err)
		if len(got) != len(want) || len(want) > 0 && !slices.Equal(got, want) {
			t.Fatalf("Sandboxes() = %v, want %v", got, want)
		}
	}
	mustList()
	must(t, k.CreateSandbox(Spec("a", 7, Local)))
	if err := k.CreateSandbox(Spec("a", 8, Local)); !errors.Is(err, kernel.ErrExists) {
		t.Errorf("CreateSandbox of a name in use: %v, want ErrExists", err)
	}
	if err := k.CreateSandbox(Spec("b", 7, Local)); !errors.Is(err, kernel.ErrExists) {
		t.Errorf("CreateSandbox of a VNI in use on the same port: %v, want ErrExists", err)
	}
	mustList("a")
	info, err := k.Inspect("a")
	must(t, err)
	if info.Spec != Spec("a", 7, Local) || len(info.Veths) != 0 {
		t.Errorf("Inspect = %+v, want spec %+v and no veths", info, Spec("a", 7, Local))
	}
	// The same VNI on another port, or another family, is fine.
	other := Spec("b", 7, Local)
	other.Port = 4790
	must(t, k.CreateSandbox(other))
	must(t, k.CreateSandbox(Spec("c", 7, Local6)))
	mustList("a", "b", "c")

	must(t, k.DeleteSandbox("a"))
	if err := k.DeleteSandbox("a"); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("second DeleteSandbox: %v, want ErrNotFound", err)
	}
	// Its VNI is free again at once.
	must(t, k.CreateSandbox(Spec("a2", 7, Local)))
	mustList("a2", "b", "c")
	must(t, k.RemoveLeftovers(func(name string) bool { return name == "b" }))
	mustList("b")
	must(t, k.RemoveLeftovers(nil))
	mustList()
}

// Veths checks the container interfaces: added, refused under a name in
// use (either end), listed by Inspect, deleted (twice is ErrNotFound),
// gone with their sandbox.
func Veths(t *testing.T, h Harness) {
	k := h.K
	must(t, k.CreateSandbox(Spec("net", 100, Local)))
	must(t, k.AddVeth("net", kernel.Veth{HostName: "ovh-ep1", SandboxName: "ovs-ep1", MAC: hwaddr.MAC{2, 0x42, 0, 0, 0, 5}, MTU: 1450}))
	for _, dup := range []kernel.Veth{
		{HostName: "ovh-ep1", SandboxName: "ovs-ep2", MTU: 1450},
		{HostName: "ovh-ep2", SandboxName: "ovs-ep1", MTU: 1450},
	} {
		if err := k.AddVeth("net", dup); !errors.Is(err, kernel.ErrExists) {
			t.Errorf("AddVeth(%+v): %v, want ErrExists", dup, err)
		}
	}
	must(t, k.AddVeth("net", kernel.Veth{HostName: "ovh-ep3", SandboxName: "ovs-ep3", MTU: 1450}))
	info, err := k.Inspect("net")
	must(t, err)
	slices.SortFunc(info.Veths, func(a, b kernel.SandboxVeth) int { return strings.Compare(a.Name, b.Name) })
	if want := []kernel.SandboxVeth{{Name: "ovs-ep1"}, {Name: "ovs-ep3"}}; !slices.Equal(info.Veths, want) || info.Attached() != 0 {
		t.Errorf("Inspect veths %+v, want %+v", info.Veths, want)
	}
	must(t, k.DeleteVeth("net", "ovs-ep1"))
	if err := k.DeleteVeth("net", "ovs-ep1"); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("second DeleteVeth: %v, want ErrNotFound", err)
	}
	// The host end's name is free again, and goes with the sandbox.
	must(t, k.AddVeth("net", kernel.Veth{HostName: "ovh-ep1", SandboxName: "ovs-ep4", MTU: 1450}))
	must(t, k.DeleteSandbox("net"))
	must(t, k.CreateSandbox(Spec("net", 100, Local)))
	must(t, k.AddVeth("net", kernel.Veth{HostName: "ovh-ep1", SandboxName: "ovs-ep1", MTU: 1450}))
	must(t, k.DeleteSandbox("net"))
}

// Entries checks Program's rules for each underlay family: a neighbour
// is replaced by IP, a unicast FDB entry by MAC, flood entries of one
// MAC accumulate, adding again is no error; deleting removes exactly the
// entry asked, and deleting one that is not there succeeds.
func Entries(t *testing.T, h Harness) {
	for i, tc := range []struct {
		name          string
		local, v1, v2 netip.Addr
	}{
		{"ipv4-underlay", Local, V1, V2},
		{"ipv6-underlay", Local6, netip.MustParseAddr("2001:db8:ffff::2"), netip.MustParseAddr("2001:db8:ffff::3")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, sb := h.K, tc.name
			must(t, k.CreateSandbox(Spec(sb, uint32(200+i), tc.local)))
			// A port on the bridge, so that the bridge has entries of its own.
			must(t, k.AddVeth(sb, kernel.Veth{HostName: "ovh-n" + string(rune('0'+i)), SandboxName: "ovs-n",
				MAC: hwaddr.MAC{2, 0x42, 0, 0, 0, 1}, MTU: 1450}))
			v1, v2 := tc.v1, tc.v2
			macA, macB := hwaddr.MAC{2, 0x42, 10, 0, 0, 2}, hwaddr.MAC{2, 0x42, 10, 0, 0, 3}
			ip4, ip4b, ip6 := netip.MustParseAddr("203.0.113.2"), netip.MustParseAddr("203.0.113.3"), netip.MustParseAddr("2001:db8:1::2")
			mapped := netip.MustParseAddr("::ffff:203.0.113.4")
			var flood hwaddr.MAC
			Program(t, k, sb,
				SetNeighbor(ip4, macB),
				SetNeighbor(ip4, macA), // replaces
				SetNeighbor(ip6, macA),
				SetNeighbor(ip4b, macB),
				SetNeighbor(mapped, macB), // IPv4-mapped: stored as IPv4
				AddFDB(macA, v2),
				AddFDB(macA, v1), // replaces: one destination per unicast MAC
				AddFDB(macA, v1), // again: not an error
				AddFDB(macB, v2),
				AddFDB(flood, v1), // flood destinations accumulate
				AddFDB(flood, v2),
				AddFDB(flood, v2), // again: not an error
			)
			MustEntries(t, k, sb,
				[]kernel.Neighbor{{IP: ip4, MAC: macA}, {IP: ip6, MAC: macA}, {IP: ip4b, MAC: macB}, {IP: mapped.Unmap(), MAC: macB}},
				[]kernel.FDBEntry{{MAC: macA, VTEP: v1}, {MAC: macB, VTEP: v2}, {VTEP: v1}, {VTEP: v2}})

			Program(t, k, sb,
				DeleteNeighbor(ip6),
				DeleteNeighbor(mapped),
				DeleteFDB(flood, v2), // not the first flood destination
				DeleteFDB(macB, v1),  // the MAC's other destination: nothing
			)
			MustEntries(t, k, sb,
				[]kernel.Neighbor{{IP: ip4, MAC: macA}, {IP: ip4b, MAC: macB}},
				[]kernel.FDBEntry{{MAC: macA, VTEP: v1}, {MAC: macB, VTEP: v2}, {VTEP: v1}})

			// Deleting what is not there succeeds.
			Program(t, k, sb,
				DeleteNeighbor(ip6),
				DeleteFDB(flood, v2),
				DeleteFDB(hwaddr.MAC{2, 0, 0, 0, 0, 0x99}, v1),
			)
			// A unicast MAC moves, and comes back after a delete.
			Program(t, k, sb, AddFDB(macB, v1), DeleteFDB(macA, v1), AddFDB(macA, v2))
			MustEntries(t, k, sb,
				[]kernel.Neighbor{{IP: ip4, MAC: macA}, {IP: ip4b, MAC: macB}},
				[]kernel.FDBEntry{{MAC: macA, VTEP: v2}, {MAC: macB, VTEP: v1}, {VTEP: v1}})

			Program(t, k, sb, DeleteNeighbor(ip4), DeleteNeighbor(ip4b),
				DeleteFDB(macA, v2), DeleteFDB(macB, v1), DeleteFDB(flood, v1), DeleteFDB(flood, v1))
			MustEntries(t, k, sb, nil, nil)
			must(t, k.DeleteSandbox(sb))
		})
	}
}

// BadOps checks that an invalid op fails alone, at its place, and that
// the others are applied in order, across more ops than one request
// window of the netlink kernel.
func BadOps(t *testing.T, h Harness) {
	k := h.K
	const sb = "prog"
	must(t, k.CreateSandbox(Spec(sb, 300, Local)))
	const peers = 700
	var ops []kernel.EntryOp
	wantN := map[netip.Addr]hwaddr.MAC{}
	for i := range peers {
		mac := hwaddr.MAC{0x02, 0x42, 10, 1, byte(i >> 8), byte(i)}
		ip := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		ops = append(ops, SetNeighbor(ip, mac), AddFDB(mac, V1))
		wantN[ip] = mac
	}
	bad := map[int]string{}
	addBad := func(op kernel.EntryOp, why string) {
		bad[len(ops)] = why
		ops = append(ops, op)
	}
	addBad(SetNeighbor(netip.Addr{}, hwaddr.MAC{2}), "invalid IP")
	addBad(DeleteNeighbor(netip.Addr{}), "invalid IP")
	addBad(AddFDB(hwaddr.MAC{2}, netip.Addr{}), "invalid VTEP")
	addBad(AddFDB(hwaddr.MAC{2}, netip.IPv4Unspecified()), "unspecified VTEP")
	addBad(DeleteFDB(hwaddr.MAC{2}, netip.Addr{}), "invalid VTEP")
	addBad(kernel.EntryOp{Kind: 99}, "unknown kind")
	// Deleted and set again in the same batch: order holds.
	again := netip.MustParseAddr("10.1.0.5")
	ops = append(ops, DeleteNeighbor(again), SetNeighbor(again, hwaddr.MAC{2, 9}))
	wantN[again] = hwaddr.MAC{2, 9}

	errs := k.Program(sb, ops)
	if len(errs) != len(ops) {
		t.Fatalf("Program returned %d errors for %d ops, want one per op", len(errs), len(ops))
	}
	for i, err := range errs {
		if why, isBad := bad[i]; isBad && err == nil {
			t.Errorf("op %d (%s) succeeded", i, why)
		} else if !isBad && err != nil {
			t.Errorf("op %d: %v", i, err)
		}
	}
	neighs, err := k.Neighbors(sb)
	must(t, err)
	if len(neighs) != len(wantN) {
		t.Errorf("%d neighbours, want %d", len(neighs), len(wantN))
	}
	for _, nb := range neighs {
		if wantN[nb.IP] != nb.MAC || nb.NotPermanent {
			t.Errorf("neighbour %v, want %s permanent", nb, wantN[nb.IP])
		}
	}
	fdb, err := k.FDB(sb)
	must(t, err)
	if len(fdb) != peers {
		t.Errorf("%d FDB entries, want %d", len(fdb), peers)
	}
	// Everything out again in one batch.
	var del []kernel.EntryOp
	for ip := range wantN {
		del = append(del, DeleteNeighbor(ip))
	}
	for _, e := range fdb {
		del = append(del, kernel.EntryOp{Kind: kernel.OpDeleteFDB, FDB: e})
	}
	Program(t, k, sb, del...)
	MustEntries(t, k, sb, nil, nil)
}

// MissingSandbox checks that every call on a sandbox that does not exist
// is ErrNotFound: each of Program's ops too, deletes included.
func MissingSandbox(t *testing.T, h Harness) {
	k := h.K
	ip := netip.MustParseAddr("203.0.113.1")
	mac := hwaddr.MAC{2, 0, 0, 0, 0, 1}
	for name, err := range map[string]error{
		"DeleteSandbox": k.DeleteSandbox("nope"),
		"AddVeth":       k.AddVeth("nope", kernel.Veth{HostName: "ovh-x", SandboxName: "ovs-x"}),
		"DeleteVeth":    k.DeleteVeth("nope", "ovs-x"),
	} {
		if !errors.Is(err, kernel.ErrNotFound) {
			t.Errorf("%s on a missing sandbox: %v, want ErrNotFound", name, err)
		}
	}
	ops := []kernel.EntryOp{SetNeighbor(ip, mac), DeleteNeighbor(ip), AddFDB(mac, V1), DeleteFDB(mac, V1)}
	errs := k.Program("nope", ops)
	if len(errs) != len(ops) {
		t.Fatalf("Program in a missing sandbox: %v, want an error per op", errs)
	}
	for i, err := range errs {
		if !errors.Is(err, kernel.ErrNotFound) {
			t.Errorf("%v in a missing sandbox: %v, want ErrNotFound", &ops[i], err)
		}
	}
	if _, err := k.Neighbors("nope"); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("Neighbors: %v, want ErrNotFound", err)
	}
	if _, err := k.FDB("nope"); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("FDB: %v, want ErrNotFound", err)
	}
	if _, err := k.Inspect("nope"); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("Inspect: %v, want ErrNotFound", err)
	}
	if _, err := k.RepairSandbox(Spec("nope", 5, Local)); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("RepairSandbox: %v, want ErrNotFound", err)
	}
	if _, err := k.Watch(context.Background(), "nope"); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("Watch: %v, want ErrNotFound", err)
	}
}

// Watch checks that a watch reports the entry changes someone else makes
// and not Program's own, and closes its channel when its context ends.
func Watch(t *testing.T, h Harness) {
	k := h.K
	const sb = "watch"
	must(t, k.CreateSandbox(Spec(sb, 303, Local)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := k.Watch(ctx, sb)
	must(t, err)
	mac := func(i byte) hwaddr.MAC { return hwaddr.MAC{2, 0x42, 0, 0, 0, i} }
	// events makes an outside marker entry and returns the entry events
	// reported before it.
	marker := byte(100)
	events := func() []kernel.Event {
		t.Helper()
		marker++
		h.Outside(t, sb, AddFDB(mac(marker), V2))
		var got []kernel.Event
		timeout := time.After(5 * time.Second)
		for {
			select {
			case e, ok := <-ch:
				if !ok {
					t.Fatal("the channel closed")
				}
				if e.Kind == kernel.EventFDB && e.FDB.MAC == mac(marker) {
					return got
				}
				if e.Kind == kernel.EventFDB || e.Kind == kernel.EventNeighbor {
					got = append(got, e)
				}
			case <-timeout:
				t.Fatalf("no marker event; got %v", got)
			}
		}
	}
	ip, ip2 := netip.MustParseAddr("203.0.113.2"), netip.MustParseAddr("203.0.113.3")
	// (The netlink kernel may report one of two changes of an entry that
	// were in flight together: each step waits for the watch.)
	Program(t, k, sb, SetNeighbor(ip, mac(1)), AddFDB(mac(1), V1), AddFDB(hwaddr.MAC{}, V1))
	if evs := events(); len(evs) != 0 {
		t.Errorf("Program's own changes were reported: %v", evs)
	}
	Program(t, k, sb, DeleteFDB(hwaddr.MAC{}, V1))
	if evs := events(); len(evs) != 0 {
		t.Errorf("Program's own delete was reported: %v", evs)
	}
	h.Outside(t, sb, SetNeighbor(ip2, mac(2)), AddFDB(mac(2), V1), DeleteFDB(mac(1), V1), DeleteNeighbor(ip))
	want := []kernel.Event{
		{Kind: kernel.EventNeighbor, Neighbor: kernel.Neighbor{IP: ip2, MAC: mac(2)}},
		{Kind: kernel.EventFDB, FDB: kernel.FDBEntry{MAC: mac(2), VTEP: V1}},
		{Kind: kernel.EventFDB, Deleted: true, FDB: kernel.FDBEntry{MAC: mac(1), VTEP: V1}},
		{Kind: kernel.EventNeighbor, Deleted: true, Neighbor: kernel.Neighbor{IP: ip, MAC: mac(1)}},
	}
	evs := events()
	for _, w := range want {
		// A deletion may come without the MAC (kernel.Neighbor's rules).
		if !slices.ContainsFunc(evs, func(e kernel.Event) bool {
			return e == w || w.Deleted && w.Kind == kernel.EventNeighbor && e.Kind == w.Kind && e.Deleted && e.Neighbor.IP == ip
		}) {
			t.Errorf("outside change not reported: %+v; got %+v", w, evs)
		}
	}
	cancel()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("the channel stays open after the context ended")
		}
	}
}

// Faults checks, where the harness can inject them, that an op failing
// in the kernel fails alone, leaving the others applied.
func Faults(t *testing.T, h Harness) {
	if h.Fail == nil {
		t.Skip("this kernel cannot be told to fail")
	}
	k := h.K
	const sb = "faults"
	must(t, k.CreateSandbox(Spec(sb, 304, Local)))
	boom := errors.New("injected")
	ip, mac := netip.MustParseAddr("203.0.113.2"), hwaddr.MAC{2, 0x42, 0, 0, 0, 1}
	ops := []kernel.EntryOp{SetNeighbor(ip, mac), AddFDB(mac, V1), AddFDB(hwaddr.MAC{}, V1)}
	h.Fail(kernel.OpAddFDB, boom)
	errs := k.Program(sb, ops)
	if len(errs) != len(ops) || errs[0] != nil || !errors.Is(errs[1], boom) || !errors.Is(errs[2], boom) {
		t.Fatalf("Program with AddFDB failing: %v, want [nil injected injected]", errs)
	}
	MustEntries(t, k, sb, []kernel.Neighbor{{IP: ip, MAC: mac}}, nil)
	h.Fail(kernel.OpAddFDB, nil)
	Program(t, k, sb, ops...)
	MustEntries(t, k, sb, []kernel.Neighbor{{IP: ip, MAC: mac}}, []kernel.FDBEntry{{MAC: mac, VTEP: V1}, {VTEP: V1}})
}

// Repair checks RepairSandbox against devices deleted from outside: a
// lost VXLAN device takes its entries and is rebuilt empty, a lost
// bridge is rebuilt with every port put back on it; with nothing wrong
// it does nothing. Watch reports the losses and the rebuilt device.
func Repair(t *testing.T, h Harness) {
	k := h.K
	const sb = "repair"
	sp := Spec(sb, 305, Local)
	must(t, k.CreateSandbox(sp))
	must(t, k.AddVeth(sb, kernel.Veth{HostName: "ovh-r1", SandboxName: "ovs-r1", MTU: 1450}))
	ip, mac := netip.MustParseAddr("203.0.113.2"), hwaddr.MAC{2, 0x42, 0, 0, 0, 1}
	Program(t, k, sb, SetNeighbor(ip, mac))
	repair := func(want ...kernel.Repair) {
		t.Helper()
		got, err := k.RepairSandbox(sp)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("RepairSandbox = %+v, %v; want %+v", got, err, want)
		}
	}
	repair()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := k.Watch(ctx, sb)
	must(t, err)
	// device waits for the event of the device's change.
	device := func(what, name string, deleted, broken bool) {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case e := <-events:
				if e.Kind == kernel.EventDevice && e.Device == name && e.Deleted == deleted && e.Broken == broken {
					return
				}
			case <-timeout:
				t.Fatalf("no event: %s", what)
			}
		}
	}

	h.Break(t, sb, kernel.VXLANName)
	device("vxlan0 deleted", kernel.VXLANName, true, true)
	if _, err := k.Neighbors(sb); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("Neighbors without %s: %v, want ErrNotFound (not an empty list)", kernel.VXLANName, err)
	}
	if errs := k.Program(sb, []kernel.EntryOp{SetNeighbor(ip, mac)}); len(errs) != 1 || !errors.Is(errs[0], kernel.ErrNotFound) {
		t.Errorf("Program without %s: %v, want ErrNotFound", kernel.VXLANName, errs)
	}
	if info, err := k.Inspect(sb); err != nil || info.Spec.VNI != 0 || info.Spec.MTU != sp.MTU {
		t.Errorf("Inspect without %s: %+v, %v; want no VNI, the bridge's MTU", kernel.VXLANName, info, err)
	}
	repair(kernel.Repair{Device: kernel.VXLANName, Problem: "missing", Rebuilt: true})
	device("vxlan0 rebuilt", kernel.VXLANName, false, false)
	MustEntries(t, k, sb, nil, nil)
	Program(t, k, sb, SetNeighbor(ip, mac))

	h.Break(t, sb, kernel.BridgeName)
	device("br0 deleted", kernel.BridgeName, true, true)
	repair(kernel.Repair{Device: kernel.BridgeName, Problem: "missing", Rebuilt: true},
		kernel.Repair{Device: "ovs-r1", Problem: "not on the bridge"},
		kernel.Repair{Device: kernel.VXLANName, Problem: "not on the bridge"})
	MustEntries(t, k, sb, []kernel.Neighbor{{IP: ip, MAC: mac}}, nil)
	if info, err := k.Inspect(sb); err != nil || info.Spec != sp {
		t.Errorf("Inspect after repair: %+v, %v; want spec %+v", info, err, sp)
	}
	repair()
}
